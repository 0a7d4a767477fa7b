"""``trajkit serve`` refusing to start: what it says, and that it says no secret."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import trajkit, write_jsonl
from tests.serve_helpers import MODEL, ServeProcess, serve_policy, write_key
from trajkit.testing.openai_server import OpenAITestServer

MODEL_KEY = "sk-model-key-5772156649"


def test_refused_model_credentials_stop_it_before_it_listens(tmp_path: Path) -> None:
    wrong = write_key(tmp_path / "model.key", "sk-wrong-key-0000000000")
    with OpenAITestServer(serve_policy, api_key=MODEL_KEY, models={MODEL}) as server:
        result = trajkit(
            "serve",
            "--model",
            MODEL,
            "--base_url",
            server.base_url,
            "--api_key_file",
            str(wrong),
            "--port",
            "0",
        )
    assert result.returncode == 2 and "error:" in result.stderr
    assert "sk-wrong-key" not in result.stderr and "READY" not in result.stdout


def test_configuration_file_and_its_errors(tmp_path: Path) -> None:
    config = tmp_path / "serve.toml"
    config.write_text('model = "scripted"\nmax_turns = 2\ntool_progress = "inline"\nport = 0\n')
    with ServeProcess("--config", str(config)) as process:
        assert process.base_url.startswith("http://127.0.0.1:")
    config.write_text('tool_progress = "loud"\n')
    result = trajkit("serve", "--config", str(config))
    assert result.returncode == 2 and f"{config}: tool_progress" in result.stderr
    config.write_text("no_such_setting = 1\n")
    result = trajkit("serve", "--config", str(config))
    assert result.returncode == 2 and f"{config}: no_such_setting" in result.stderr


def test_recording_into_a_batch_run_is_refused(tmp_path: Path) -> None:
    dataset = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "hello"}])
    run = trajkit("run", "--dataset_file", str(dataset), "--run_name", "batch", "--output_dir", str(tmp_path))
    assert run.returncode == 0, run.stderr
    result = trajkit("serve", "--record", str(tmp_path / "batch"), "--port", "0")
    assert result.returncode == 2 and "holds a batch run" in result.stderr


def test_cors_origins_must_be_exact(tmp_path: Path) -> None:
    for origin in ("*", "https://example.com/app", "example.com"):
        result = trajkit("serve", "--cors_origin", origin, "--port", "0")
        assert result.returncode == 2 and "exact origins" in result.stderr, origin


def test_a_record_directory_needs_a_run_name_for_its_name(tmp_path: Path) -> None:
    result = trajkit("serve", "--record", str(tmp_path / "no good"), "--port", "0")
    assert result.returncode == 2 and "--record (the directory's name)" in result.stderr
