"""Honest flags: a trajectory cut off mid tool turn is `partial` and rejected by default, with its
reason; `toolsets_used` names what the model used, `toolsets_offered` what it was given.

The offline scripted model writes a notes file, runs a command and reads the notes back (three
tool turns), then answers: with ``--max_turns 2`` it is cut off after a tool result.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.helpers import read_jsonl, trajkit, write_jsonl
from trajkit.plugins.filters import Partial

ROWS: list[dict[str, Any] | str] = [{"prompt": f"Task {i}"} for i in range(3)]


def run(tmp_path: Path, name: str, *extra: str) -> Path:
    dataset = write_jsonl(tmp_path / "p.jsonl", ROWS)
    result = trajkit(
        "run",
        "--dataset_file",
        str(dataset),
        "--run_name",
        name,
        "--output_dir",
        str(tmp_path),
        "--quiet",
        *extra,
    )
    assert result.returncode == 0, result.stderr
    return tmp_path / name


def test_a_trajectory_cut_off_by_max_turns_is_partial_and_rejected_with_its_reason(tmp_path: Path) -> None:
    run_dir = run(tmp_path, "cut", "--max_turns", "2")
    assert read_jsonl(run_dir / "trajectories.jsonl") == []
    rejected = read_jsonl(run_dir / "rejected.jsonl")
    assert {r["reason"] for r in rejected} == {
        "partial: max_turns reached after 2 model calls, after a tool result"
    }
    for line in rejected:
        record = line["record"]
        assert (record["completed"], record["partial"], record["finish_reason"]) == (False, True, "max_turns")
        assert record["conversations"][-1]["from"] == "tool"
    kept = run(tmp_path, "kept", "--max_turns", "2", "--no_filter", "partial")
    assert len(read_jsonl(kept / "trajectories.jsonl")) == 3
    whole = run(tmp_path, "whole", "--max_turns", "4")
    records = read_jsonl(whole / "trajectories.jsonl")
    assert len(records) == 3 and not any(r["partial"] for r in records)


def test_toolsets_used_are_those_called_beside_those_offered(tmp_path: Path) -> None:
    records = read_jsonl(run(tmp_path, "sets") / "trajectories.jsonl")
    for record in records:
        assert record["toolsets_offered"] == ["code", "file", "terminal"]
        assert record["toolsets_used"] == ["file", "terminal"]  # notes written and read, a command run
        assert (
            "execute_code" in record["tools_offered"] and record["tool_stats"]["execute_code"]["count"] == 0
        )


def test_the_partial_reason_says_how_it_ended() -> None:
    check = Partial().check
    base = {"completed": False, "partial": True, "api_calls": 10}
    assert check({**base, "finish_reason": "length", "conversations": [{"from": "gpt"}]}) == (
        "the last answer was cut off by the token limit"
    )
    assert check({**base, "finish_reason": "max_turns", "conversations": [{"from": "gpt"}]}) == (
        "max_turns reached after 10 model calls, on an assistant turn"
    )
    assert (
        check({**base, "partial": False, "completed": True, "finish_reason": "stop", "conversations": []})
        is None
    )
