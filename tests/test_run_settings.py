"""A run directory remembers its settings: a resume continues with them, a change that would mix two
configurations in one dataset is refused unless allowed, secrets are never saved, nothing is
written before the pre-flight checks pass, and every command trajkit prints runs as printed.

Real processes throughout: the CLI in a subprocess, the project's OpenAI-compatible test server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import read_jsonl, trajkit, write_jsonl
from tests.test_resume import Flaky, run_args, sessions_started
from trajkit.config.resolve import resolve
from trajkit.manager import load_plugins
from trajkit.testing.openai_server import OpenAITestServer
from trajkit.testing.policies import dialect_policy

SCRIPTS = Path(__file__).parent / "scripts"


def printed(stderr: str, prefix: str = "to finish") -> str:
    """The command trajkit printed after ``prefix ...: ``."""
    lines = [line for line in stderr.splitlines() if line.startswith(prefix)]
    assert lines, f"no {prefix!r} line in:\n{stderr}"
    return lines[-1].split(": ", 1)[1]


def run_as_printed(command: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """A printed command, run by a shell exactly as printed, with this interpreter's ``trajkit``."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    full_env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    full_env.update({"PATH": path, **(env or {})})
    return subprocess.run(
        ["bash", "-c", command],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def run_files(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


# -- the Ctrl-C story ----------------------------------------------------------------------------------


def test_the_ctrl_c_story_the_printed_command_finishes_the_run_with_its_own_model(tmp_path: Path) -> None:
    """tests/scripts/ctrl_c_story.sh: a real model run interrupted, the printed command run as
    printed, every trajectory from the real model (it failed on trajkit 0.x: 'to finish' dropped
    --model, --base_url, --distribution, --executor and --max_samples, and the resume continued
    with the offline scripted model)."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")} | {"PATH": path}
    result = subprocess.run(
        ["bash", str(SCRIPTS / "ctrl_c_story.sh"), str(tmp_path / "story")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "printed: trajkit run --resume " in result.stdout
    assert "OK: 20 trajectories, all from story-model" in result.stdout


def test_the_old_flags_with_resume_continue_with_the_run_s_own_settings(tmp_path: Path) -> None:
    dataset = [{"prompt": f"item {i}"} for i in range(6)] + [{"prompt": "lost cause [doomed]"}]
    path = write_jsonl(tmp_path / "p.jsonl", dataset)
    with OpenAITestServer(Flaky(fails=0)) as server:
        first = trajkit(
            *run_args(path, tmp_path, server, "--distribution", "file_only", "--max_retries", "0")
        )
        assert first.returncode == 1, first.stderr
        # the command earlier versions printed, still in users' shell histories: no --model, no URL
        server.reset()
        old = trajkit(
            "run", "--dataset_file", str(path), "--run_name", "r", "--output_dir", str(tmp_path), "--resume"
        )  # fmt: skip
        assert old.returncode == 1, old.stderr  # the doomed row fails again, at the real model
        assert list(sessions_started(server)) == ["lost cause [doomed]"]
    records = read_jsonl(tmp_path / "r" / "trajectories.jsonl")
    assert {r["metadata"]["model"] for r in records} == {"m"}
    assert {tuple(r["toolsets_offered"]) for r in records} == {("file",)}
    manifest = json.loads((tmp_path / "r" / "run.json").read_text())
    assert [i["config_changes"] for i in manifest["invocations"]] == [{}, {}]
    assert printed(old.stderr) == f"trajkit run --resume {tmp_path / 'r'}"


# -- a changed setting -----------------------------------------------------------------------------


def test_a_resume_that_changes_what_shapes_the_output_is_refused_unless_allowed(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a"}, {"prompt": "b"}])
    run_dir = tmp_path / "r"
    with OpenAITestServer(dialect_policy) as server:
        assert trajkit(*run_args(path, tmp_path, server, "--max_samples", "1")).returncode == 0
        server.reset()
        before = run_files(run_dir)
        changed = ["--max_turns", "7", "--temperature", "0.3", "--max_rpm", "9", "--max_samples", "2"]
        refused = trajkit("run", "--resume", str(run_dir), *changed)
        assert refused.returncode == 2, refused.stderr
        for change in (
            "max_turns was 10, now 7",
            "temperature was None, now 0.3",
            "max_samples was 1, now 2",
        ):
            assert change in refused.stderr
        assert (
            "--allow_change max_turns --allow_change max_samples --allow_change temperature" in refused.stderr
        )
        assert "max_rpm" not in refused.stderr  # how fast is no part of what comes out
        assert run_files(run_dir) == before  # nothing written
        assert sessions_started(server) == {}

        allow = [
            "--allow_change",
            "max_turns",
            "--allow_change",
            "temperature",
            "--allow_change",
            "max_samples",
        ]
        allowed = trajkit("run", "--resume", str(run_dir), *changed, *allow)
        assert allowed.returncode == 0, allowed.stderr
        assert "max_turns changed from 10 to 7 (--allow_change)" in allowed.stderr
        request = next(r for r in server.requests if r.body["messages"][1]["content"] == "b")
        assert request.body["temperature"] == 0.3
    manifest = json.loads((run_dir / "run.json").read_text())
    last = manifest["invocations"][-1]
    assert last["config_changes"] == {"max_turns": [10, 7], "temperature": [None, 0.3], "max_samples": [1, 2]}
    assert last["allowed_changes"] == ["max_samples", "max_turns", "temperature"]
    assert (manifest["config"]["max_turns"], manifest["config"]["max_rpm"]) == (7, 9.0)  # the run's now

    # the next resume continues with the changed settings, and an unknown name is an error
    typo = trajkit("run", "--resume", str(run_dir), "--allow_change", "max_turn")
    assert typo.returncode == 2 and "did you mean max_turns?" in typo.stderr
    again = trajkit("run", "--resume", str(run_dir))
    assert again.returncode == 0 and "nothing to do" in again.stderr


def test_the_flag_names_of_a_setting_are_taken_by_allow_change(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "no reasoning here [dialect:none]"}])
    with OpenAITestServer(dialect_policy) as server:
        assert trajkit(*run_args(path, tmp_path, server)).returncode == 0
        refused = trajkit(*run_args(path, tmp_path, server, "--resume", "--no_filter", "no_reasoning"))
        assert refused.returncode == 2 and "disabled_filters was [], now ['no_reasoning']" in refused.stderr
        allowed = trajkit(
            *run_args(
                path,
                tmp_path,
                server,
                "--resume",
                "--no_filter",
                "no_reasoning",
                "--allow_change",
                "no_filter",
            )
        )
    assert allowed.returncode == 0, allowed.stderr
    assert len(read_jsonl(tmp_path / "r" / "trajectories.jsonl")) == 1


def test_when_every_trajectory_is_rejected_the_printed_command_merges_again_as_printed(
    tmp_path: Path,
) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"terse {i} [dialect:none]"} for i in range(3)])
    with OpenAITestServer(dialect_policy) as server:
        first = trajkit(*run_args(path, tmp_path, server))
        assert first.returncode == 0, first.stderr
        command = first.stderr.split("to merge again without it: ", 1)[1].splitlines()[0]
        assert command.startswith(f"trajkit run --resume {tmp_path / 'r'} --no_filter no_reasoning")
        server.reset()
        again = run_as_printed(command)
    assert again.returncode == 0, again.stderr
    assert len(read_jsonl(tmp_path / "r" / "trajectories.jsonl")) == 3
    assert server.count == 0  # merged again, nothing run again


# -- what is never saved -------------------------------------------------------------------------


def test_secrets_are_never_saved_and_a_resume_takes_the_key_again(tmp_path: Path) -> None:
    key = "sk-test-0123456789abcdef"
    dataset = [{"prompt": "fine"}, {"prompt": "lost cause [doomed]"}]
    path = write_jsonl(tmp_path / "p.jsonl", dataset)
    run_dir = tmp_path / "r"
    with OpenAITestServer(Flaky(fails=0), api_key=key, models=["m"]) as server:
        first = trajkit(*run_args(path, tmp_path, server, "--api_key", key, "--max_retries", "0"))
        assert first.returncode == 1, first.stderr
        for name, data in run_files(run_dir).items():
            assert key.encode() not in data, f"the key is in {name}"
        assert "api_key" not in json.loads((run_dir / "run.json").read_text())["config"]
        assert "--api_key is never saved: give it again" in first.stderr

        before = run_files(run_dir)
        without = run_as_printed(printed(first.stderr))
        assert without.returncode == 2, without.stderr
        assert "refused the credentials" in without.stderr and "--api_key" in without.stderr
        assert run_files(run_dir) == before

        with_key = run_as_printed(printed(first.stderr), env={"OPENAI_API_KEY": key})
        assert with_key.returncode == 1, with_key.stderr  # the doomed row, asked again with the key
        assert sessions_started(server)["lost cause [doomed]"] == 2 * 3  # 3 attempts each time


def test_the_ephemeral_prompt_and_prefill_are_fingerprinted_and_given_again(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "fine"}, {"prompt": "lost cause [doomed]"}])
    prefill = tmp_path / "prefill.json"
    prefill.write_text(
        json.dumps([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
    )
    run_dir = tmp_path / "r"
    secret_ish = "Answer like a pirate; this text is never saved."
    with OpenAITestServer(doomed_anywhere) as server:
        extra = ["--ephemeral_system_prompt", secret_ish, "--prefill_messages_file", str(prefill)]
        first = trajkit(*run_args(path, tmp_path, server, *extra, "--max_retries", "0"))
        assert first.returncode == 1, first.stderr
        for name, data in run_files(run_dir).items():
            assert b"pirate" not in data and b"hello" not in data, name
        config = json.loads((run_dir / "run.json").read_text())["config"]
        assert config["prefill_messages_file"] == str(prefill) and config["prefill_messages_used"] == 2

        bare = trajkit("run", "--resume", str(run_dir))
        assert bare.returncode == 2
        assert "ephemeral_system_prompt was used and is not given now" in bare.stderr
        assert "give --prefill_messages_file again" in bare.stderr

        command = printed(first.stderr)
        assert "--ephemeral_system_prompt" in command and str(prefill) in command
        server.reset()
        again = run_as_printed(command)
        assert again.returncode == 1, again.stderr
        (request, *_) = server.requests
        assert secret_ish in request.body["messages"][0]["content"]
        assert [m["content"] for m in request.body["messages"][1:3]] == ["hi", "hello"]


def doomed_anywhere(body: dict[str, Any]) -> dict[str, Any]:
    """Fails every request of a conversation that has "[doomed]" in any user message."""
    if any("[doomed]" in str(m.get("content")) for m in body["messages"] if m["role"] == "user"):
        return {"_status": 503, "_error": "upstream overloaded"}
    return dialect_policy(body)


# -- nothing written before the pre-flight checks pass ------------------------------------------------


@pytest.mark.parametrize(
    ("case", "flags", "message"),
    [
        ("unreachable", ["--base_url", "http://127.0.0.1:9/v1"], "cannot connect"),
        ("newline in the key", ["--api_key", "sk-abc\ndef"], "newline"),
        ("unknown model", ["--model", "no-such-model"], "no-such-model"),
    ],
)
def test_a_run_failing_its_preflight_writes_nothing(
    tmp_path: Path, case: str, flags: list[str], message: str
) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a"}, {"prompt": "b"}])
    with OpenAITestServer(dialect_policy, models=["m"]) as server:
        failed = trajkit(*run_args(path, tmp_path, server), *flags)
        assert failed.returncode == 2, (case, failed.stderr)
        assert message in failed.stderr
        assert not (tmp_path / "r").exists(), case
        # the corrected command is a new run: nothing to continue, no change to log
        fixed = trajkit(*run_args(path, tmp_path, server))
    assert fixed.returncode == 0, fixed.stderr
    assert "changed" not in fixed.stderr
    manifest = json.loads((tmp_path / "r" / "run.json").read_text())
    assert len(manifest["invocations"]) == 1


def test_a_resume_failing_its_preflight_leaves_the_run_as_it_was(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "fine"}, {"prompt": "lost cause [doomed]"}])
    run_dir = tmp_path / "r"
    with OpenAITestServer(Flaky(fails=0)) as server:
        assert trajkit(*run_args(path, tmp_path, server, "--max_retries", "0")).returncode == 1
    before = run_files(run_dir)
    down = trajkit("run", "--resume", str(run_dir))  # the server is gone
    assert down.returncode == 2 and "cannot connect" in down.stderr
    assert run_files(run_dir) == before


def test_resume_names_a_run_directory_that_exists(tmp_path: Path) -> None:
    missing = trajkit("run", "--resume", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "no such run directory" in missing.stderr
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a"}])
    assert (
        trajkit(
            "run", "--dataset_file", str(path), "--run_name", "r", "--output_dir", str(tmp_path)
        ).returncode
        == 0
    )
    other = trajkit("run", "--resume", str(tmp_path / "r"), "--run_name", "other")
    assert other.returncode == 2 and "name different runs" in other.stderr
    held = trajkit("run", "--dataset_file", str(path), "--run_name", "r", "--output_dir", str(tmp_path))
    assert held.returncode == 2 and f"continue it with `trajkit run --resume {tmp_path / 'r'}`" in held.stderr


def test_a_resume_without_its_key_says_how_to_give_it_and_writes_nothing(tmp_path: Path) -> None:
    """A run against a remote endpoint, its key never saved: the resume asks for it again."""
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a"}])
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    config = resolve(
        load_plugins(),
        {"dataset_file": path, "run_name": "r", "output_dir": tmp_path, "model": "vendor/model"}
        | {"base_url": "https://api.example.invalid/v1", "api_key": "sk-never-written-0123456789"},
    )
    (run_dir / "run.json").write_text(
        json.dumps({"run_name": "r", "invocations": [], "config": config.manifest()})
    )
    assert "sk-never-written" not in (run_dir / "run.json").read_text()
    before = run_files(run_dir)
    result = trajkit("run", "--resume", str(run_dir))
    assert result.returncode == 2, result.stderr
    assert "no API key for https://api.example.invalid/v1: pass --api_key or set" in result.stderr
    assert "a run directory never keeps a key" in result.stderr
    assert run_files(run_dir) == before
