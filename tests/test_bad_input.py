"""Bad input gets a clear error naming file, line and problem; the valid rows still run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.helpers import read_jsonl, trajkit, write_jsonl
from trajkit.run.dataset import read_dataset


def test_invalid_rows_are_reported_and_valid_rows_run(tmp_path: Path) -> None:
    dataset = write_jsonl(
        tmp_path / "mixed.jsonl",
        [
            {"prompt": "first good row"},
            '{"prompt": "broken json",',
            {"text": "no prompt field"},
            {"prompt": 42},
            {"prompt": "runs on a backend nobody has", "backend": "nosuch"},
            "",
            {"prompt": "second good row", "docker_image": None},
            "[1, 2]",
        ],
    )
    result = trajkit(
        "run", "--dataset_file", str(dataset), "--run_name", "bad", "--output_dir", str(tmp_path)
    )
    assert result.returncode == 1
    err = result.stderr
    assert f"{dataset}:2: invalid JSON" in err
    assert f"{dataset}:3: missing required field 'prompt'" in err
    assert f"{dataset}:4: field 'prompt': input should be a valid string" in err
    assert f"{dataset}:5: unknown sandbox backend 'nosuch'" in err
    assert f"{dataset}:8: expected a JSON object, got list" in err
    records = read_jsonl(tmp_path / "bad" / "trajectories.jsonl")
    assert [r["prompt_index"] for r in records] == [0, 6]


def test_unknown_distribution_is_a_usage_error(tmp_path: Path) -> None:
    dataset = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "hi"}])
    result = trajkit("run", "--dataset_file", str(dataset), "--run_name", "x", "--output_dir", str(tmp_path),
                     "--distribution", "nope")  # fmt: skip
    assert result.returncode == 2
    assert "unknown distribution 'nope'" in result.stderr
    assert "terminal_only" in result.stderr
    assert not (tmp_path / "x").exists()


def test_backend_from_a_missing_package_names_the_package(tmp_path: Path) -> None:
    dataset = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "hi", "backend": "modal"}, {"prompt": "ok"}])
    result = trajkit(
        "run", "--dataset_file", str(dataset), "--run_name", "x", "--output_dir", str(tmp_path),
        env={"TRAJKIT_DISABLE_PLUGINS": "modal"},
    )  # fmt: skip
    assert result.returncode == 1
    assert (
        f"{dataset}:1: sandbox backend 'modal' is not installed: pip install ./trajkit_modal from the root"
        in result.stderr
    )
    assert len(read_jsonl(tmp_path / "x" / "trajectories.jsonl")) == 1


def test_missing_api_key_names_the_offline_model(tmp_path: Path) -> None:
    dataset = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "hi"}])
    result = trajkit("run", "--dataset_file", str(dataset), "--run_name", "x", "--output_dir", str(tmp_path),
                     "--model", "some/model")  # fmt: skip
    assert result.returncode == 2
    assert "no API key" in result.stderr and "--model scripted" in result.stderr


def test_existing_run_needs_resume_or_overwrite(tmp_path: Path) -> None:
    dataset = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "hi"}])
    args = ("run", "--dataset_file", str(dataset), "--run_name", "x", "--output_dir", str(tmp_path))
    assert trajkit(*args).returncode == 0
    again = trajkit(*args)
    assert again.returncode == 2 and "--resume" in again.stderr and "--overwrite" in again.stderr
    assert trajkit(*args, "--overwrite").returncode == 0
    assert len(list((tmp_path / "x").glob("batch_*.jsonl"))) == 1


def test_list_distributions_in_both_spellings() -> None:
    for flag in ("--list_distributions", "--list-distributions"):
        result = trajkit("run", flag)
        assert result.returncode == 0, result.stderr
        assert "terminal_only" in result.stdout and "terminal 100%" in result.stdout


def test_providers_flags_take_comma_lists(tmp_path: Path) -> None:
    from trajkit.plugins.openai.client import request_extras
    from trajkit.plugins.openai.settings import OpenAISettings

    settings = OpenAISettings(
        providers_allowed=["a", "b"], provider_sort="price", reasoning_effort="high", max_tokens=100
    )
    extras = request_extras(settings)
    assert extras["provider"] == {"only": ["a", "b"], "sort": "price"}
    assert extras["reasoning"] == {"effort": "high"}
    quiet = request_extras(
        OpenAISettings(providers_ignored=["c"], reasoning_disabled=True, reasoning_effort="high")
    )
    assert quiet["provider"] == {"ignore": ["c"]} and quiet["reasoning"] == {"enabled": False}
    local = OpenAISettings(base_url="http://127.0.0.1:1/v1", reasoning_disabled=True)
    assert request_extras(local)["reasoning_effort"] == "none" and "provider" not in request_extras(local)
    dataset = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "hi"}])
    result = trajkit("run", "--dataset_file", str(dataset), "--run_name", "p", "--output_dir", str(tmp_path),
                     "--providers_allowed=a,b", "--providers-order", "c")  # fmt: skip
    assert result.returncode == 0, result.stderr
    manifest = json.loads((tmp_path / "p" / "run.json").read_text())
    assert manifest["config"]["providers_allowed"] == ["a", "b"]
    assert manifest["config"]["providers_order"] == ["c"]


def test_dataset_identity_is_content_with_multiplicity(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [{"prompt": "a"}, {"prompt": "b", "image": "x"}, {"prompt": "a", "extra": 1}, {"prompt": "b"}],
    )
    items, errors = read_dataset(path)
    assert errors == []
    assert items[0].prompt_id == items[2].prompt_id  # extra fields do not change identity
    assert (items[0].occurrence, items[2].occurrence) == (0, 1)
    assert items[1].prompt_id != items[3].prompt_id  # the image does
    assert items[2].row.extra_fields == {"extra": 1}


# -- a dataset that cannot run is refused before the first session ---------------------------------


def run_on(dataset: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return trajkit("run", "--dataset_file", str(dataset), "--run_name", "x", "--output_dir", str(out), *extra)


def test_a_dataset_that_cannot_run_is_refused_with_its_reason(tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n  \n\n")
    invalid = write_jsonl(tmp_path / "invalid.jsonl", ["not json", {"text": "no prompt"}])
    good = write_jsonl(tmp_path / "good.jsonl", [{"prompt": "hi"}])
    cases = [
        (folder, (), f"dataset file {folder} is a directory"),
        (tmp_path / "missing.jsonl", (), f"dataset file {tmp_path / 'missing.jsonl'} does not exist"),
        (empty, (), f"dataset file {empty} is empty"),
        (blank, (), f"{blank} holds only blank lines"),
        (invalid, (), f"no row of {invalid} has a 'prompt' field (the rows have: text)"),
        (
            write_jsonl(tmp_path / "bad.jsonl", ["not json", "[1]"]),
            (),
            f"no valid rows in {tmp_path / 'bad.jsonl'}",
        ),
        (good, ("--max_samples", "0"), "--max_samples 0 selects no rows"),
        (good, ("--resume", "--overwrite"), "--resume continues the run and --overwrite deletes it"),
    ]
    for dataset, extra, message in cases:
        result = run_on(dataset, tmp_path / "out", *extra)
        assert result.returncode == 2, (message, result.stderr)
        assert f"error: {message}" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
        assert not (tmp_path / "out").exists(), f"{message}: nothing may be written"


def test_invalid_utf8_is_a_row_error_naming_file_and_line(tmp_path: Path) -> None:
    dataset = tmp_path / "d.jsonl"
    dataset.write_bytes(b'\xef\xbb\xbf{"prompt": "first"}\n{"prompt": "caf\xe9"}\n{"prompt": "third"}\n')
    items, errors = read_dataset(dataset)
    assert [item.row.prompt for item in items] == ["first", "third"]  # a BOM is not part of the row
    assert [str(e) for e in errors] == [f"{dataset}:2: invalid UTF-8 (invalid continuation byte at byte 16)"]
    result = run_on(dataset, tmp_path)
    assert result.returncode == 1 and f"{dataset}:2: invalid UTF-8" in result.stderr
    assert len(read_jsonl(tmp_path / "x" / "trajectories.jsonl")) == 2


def test_a_run_whose_filters_reject_everything_says_so_and_how_to_merge_again(tmp_path: Path) -> None:
    from trajkit.testing.openai_server import OpenAITestServer
    from trajkit.testing.policies import dialect_policy

    dataset = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"task {i} [dialect:none]"} for i in range(3)])
    with OpenAITestServer(dialect_policy) as server:
        result = run_on(dataset, tmp_path, "--model", "m", "--base_url", server.base_url)
    assert result.returncode == 0, result.stderr
    assert "every trajectory was rejected (by no_reasoning)" in result.stderr
    again = f"trajkit run --resume {tmp_path / 'x'} --no_filter no_reasoning --allow_change disabled_filters"
    assert again in result.stderr
    assert read_jsonl(tmp_path / "x" / "trajectories.jsonl") == []
    merged = trajkit(*again.split()[1:])  # as printed: the run's model and endpoint come from run.json
    assert merged.returncode == 0, merged.stderr
    assert len(read_jsonl(tmp_path / "x" / "trajectories.jsonl")) == 3
