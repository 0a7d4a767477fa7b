"""``trajkit run --config``: every flag and more in a file, flags overriding it, errors located."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import read_jsonl, trajkit, write_jsonl


def test_config_file_settings_with_flags_overriding(tmp_path: Path) -> None:
    dataset = write_jsonl(
        tmp_path / "p.jsonl",
        [{"prompt": "plain row"}, {"prompt": "imaged row", "image": "python:3.11-slim"}],
    )
    config = tmp_path / "run.toml"
    config.write_text(
        f"""
dataset_file = "{dataset}"
run-name = "from-file"
output_dir = "{tmp_path}"
max_turns = 3
distribution = "files_and_shell"
seed = 11

[distributions.files_and_shell]
file = 1.0
terminal = 0.5

[[routes]]
image = "python:*"
backend = "local-but-not-really"
"""
    )
    result = trajkit("run", "--config", str(config), "--max-turns", "6")
    assert result.returncode == 1  # the routed row names a backend nobody has
    assert f"{dataset}:2: unknown sandbox backend 'local-but-not-really'" in result.stderr
    run_dir = tmp_path / "from-file"
    saved = json.loads((run_dir / "run.json").read_text())["config"]
    assert (saved["max_turns"], saved["seed"], saved["distribution"]) == (6, 11, "files_and_shell")
    assert saved["distributions"] == {"files_and_shell": {"file": 1.0, "terminal": 0.5}}
    record = read_jsonl(run_dir / "trajectories.jsonl")[0]
    assert "file" in record["toolsets_used"] and "code" not in record["toolsets_used"]
    assert sorted(record["tool_stats"]) == [
        "patch",
        "process",
        "read_file",
        "search_files",
        "terminal",
        "write_file",
    ]


def test_unknown_keys_are_errors_with_their_place(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(
        "dataset_file: x.jsonl\nrun_name: r\nmax_turnz: 3\nroutes:\n  - image: '*'\n    backnd: docker\n"
    )
    result = trajkit("run", "--config", str(config))
    assert result.returncode == 2
    assert f"{config}: max_turnz: no such setting (did you mean max_turns?)" in result.stderr
    assert f"{config}: routes.0.backnd: no such setting" in result.stderr


def test_broken_config_file_is_a_clear_error(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text("max_turns = = 3\n")
    result = trajkit("run", "--config", str(config))
    assert result.returncode == 2 and f"{config}:" in result.stderr
