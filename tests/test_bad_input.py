"""Bad input gets a clear error naming file, line and problem; the valid rows still run."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import read_jsonl, trajkit, write_jsonl
from trajkit.dataset import read_dataset


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
        f"{dataset}:1: sandbox backend 'modal' is not installed: pip install trajkit-modal" in result.stderr
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
    from trajkit.config import RunConfig
    from trajkit.plugins.openai_client import request_extras

    config = RunConfig(
        providers_allowed=["a", "b"], provider_sort="price", reasoning_effort="high", max_tokens=100
    )
    extras = request_extras(config)
    assert extras["provider"] == {"only": ["a", "b"], "sort": "price"}
    assert extras["reasoning"] == {"effort": "high"}
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
