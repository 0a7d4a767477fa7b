"""Samples per prompt: N trajectories per row, each its own work item, exactly N after kills and resumes.

The runs drive the real CLI in a subprocess against the project's HTTP test server, killed with
SIGKILL at several moments (after the Nth record reaches the ledger, in the middle of the merge,
at a time) and resumed.
"""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import plugin_env, read_jsonl, trajkit, write_jsonl
from tests.test_resume import KILLER_PLUGIN, run_killed_after, sessions_started
from trajkit.run.dataset import read_dataset, with_samples
from trajkit.run.ledger import read_jsonl as ledger_lines
from trajkit.testing.openai_server import OpenAITestServer
from trajkit.testing.policies import dialect_policy

SAMPLES = 4


def rows() -> list[dict[str, Any]]:
    dataset: list[dict[str, Any]] = [{"prompt": f"Sampled task {i} [dialect:think]"} for i in range(6)]
    return [*dataset, dict(dataset[2])]  # a duplicate row: 2 rows x 4 samples of one prompt


def run_args(dataset: Path, out: Path, server: OpenAITestServer, *extra: str) -> list[str]:
    return [
        "run", "--dataset_file", str(dataset), "--run_name", "r", "--output_dir", str(out),
        "--model", "m", "--base_url", server.base_url, "--num_workers", "4", "--batch_size", "5",
        "--distribution", "balanced", "--disabled_toolsets", "web,vision,browser", "--quiet", *extra,
    ]  # fmt: skip


def assert_samples_per_row(run_dir: Path, dataset: list[dict[str, Any]], samples: int) -> None:
    """Exactly ``samples`` trajectories per row, numbered 0..samples-1 and next to each other."""
    records = read_jsonl(run_dir / "trajectories.jsonl")
    expected = [(row, sample) for row in range(len(dataset)) for sample in range(samples)]
    assert [(r["prompt_index"], r["sample"]) for r in records] == expected
    for record in records:
        assert record["conversations"][1]["value"] == dataset[record["prompt_index"]]["prompt"]
    ledger = [r for p in run_dir.glob("batch_*.jsonl") for r in ledger_lines(p)]
    assert len({r["work_id"] for r in ledger}) == len(ledger) == len(dataset) * samples, "a sample ran twice"
    stats = json.loads((run_dir / "statistics.json").read_text())
    assert (stats["dataset_rows"], stats["samples_per_prompt"]) == (len(dataset), samples)
    assert (stats["work_items"], stats["done"], stats["pending"]) == (len(dataset) * samples,) * 2 + (0,)
    assert stats["kept"] == len(dataset) * samples


KILL_POINTS = [
    {"KILL_AFTER_RECORDS": "1"},
    {"KILL_AFTER_RECORDS": "7"},
    {"KILL_AFTER_RECORDS": "19"},
    {"KILL_AFTER_RECORDS": "28"},  # the last record: killed before the merge
    {"KILL_IN_MERGE_AT": "9"},
    {"TIMED_KILL": "0.9"},
]


@pytest.fixture
def killer_env(tmp_path: Path) -> dict[str, str]:
    return plugin_env(tmp_path, "killer", KILLER_PLUGIN)


@pytest.mark.parametrize("point", KILL_POINTS, ids=lambda p: "-".join(f"{k}={v}" for k, v in p.items()))
def test_samples_per_prompt_killed_and_resumed_gives_exactly_n_per_row(
    tmp_path: Path, killer_env: dict[str, str], point: dict[str, str]
) -> None:
    dataset = rows()
    path = write_jsonl(tmp_path / "prompts.jsonl", dataset)
    out = tmp_path / "out"
    samples = ("--samples_per_prompt", str(SAMPLES))
    with OpenAITestServer(dialect_policy, latency=0.03) as server:
        if "TIMED_KILL" in point:
            assert run_killed_after(
                float(point["TIMED_KILL"]), run_args(path, out, server, *samples), killer_env
            )
        else:
            writers = ["--writer", "sharegpt", "--writer", "dying"] if "KILL_IN_MERGE_AT" in point else []
            first = trajkit(
                *run_args(path, out, server, *samples, *writers), env={**killer_env, **point}, subprocess=True
            )
            assert first.returncode == -signal.SIGKILL, first.stderr
        resumed = trajkit(*run_args(path, out, server, *samples, "--resume"), env=killer_env, subprocess=True)
        assert resumed.returncode == 0, resumed.stderr
        assert_samples_per_row(out / "r", dataset, SAMPLES)
        # only what was in flight when the process died ran twice
        waste = sum(sessions_started(server).values()) - len(dataset) * SAMPLES
        assert 0 <= waste <= 4 + 1, waste


def test_samples_draw_toolsets_independently_and_a_resume_can_add_samples(tmp_path: Path) -> None:
    dataset = rows()
    path = write_jsonl(tmp_path / "prompts.jsonl", dataset)
    out = tmp_path / "out"
    with OpenAITestServer(dialect_policy) as server:
        first = trajkit(*run_args(path, out, server, "--samples_per_prompt", "2", "--no_filter", "partial"))
        assert first.returncode == 0, first.stderr
        assert_samples_per_row(out / "r", dataset, 2)
        more = ["--samples_per_prompt", "5", "--allow_change", "samples_per_prompt"]
        grown = trajkit(*run_args(path, out, server, "--resume", *more))
        assert grown.returncode == 0, grown.stderr
        assert_samples_per_row(out / "r", dataset, 5)
        rows_x5 = f"{len(dataset) * 5}/{len(dataset) * 5} samples done ({len(dataset)} rows x 5)"
        assert rows_x5 in grown.stderr
        assert sum(sessions_started(server).values()) == len(dataset) * 5, "only the new samples ran"
    records = read_jsonl(out / "r" / "trajectories.jsonl")
    draws: dict[int, set[tuple[str, ...]]] = {}
    for record in records:
        draws.setdefault(record["prompt_index"], set()).add(tuple(record["toolsets_offered"]))
        assert set(record["toolsets_used"]) <= set(record["toolsets_offered"])
    assert any(len(d) > 1 for d in draws.values()), "a row's samples all drew the same toolsets"
    assert len({r["work_id"] for r in records}) == len(records)


def test_samples_are_work_items_numbered_like_identical_rows(tmp_path: Path) -> None:
    items, _ = read_dataset(
        write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a"}, {"prompt": "b"}, {"prompt": "a"}])
    )
    expanded = with_samples(items, 3)
    assert [(i.index, i.sample, i.occurrence) for i in expanded] == [
        (0, 0, 0), (0, 1, 1), (0, 2, 2), (1, 0, 0), (1, 1, 1), (1, 2, 2), (2, 0, 3), (2, 1, 4), (2, 2, 5),
    ]  # fmt: skip
    assert Counter(i.work_id for i in expanded).most_common(1)[0][1] == 1
    assert with_samples(items, 1) == items
