"""Ledger reading and the pairing of dataset rows with finished records."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import write_jsonl
from trajkit.dataset import read_dataset
from trajkit.ledger import LedgerWriter, assign, batch_files, scan


def finished(ledger: LedgerWriter, work_id: str) -> None:
    ledger.append({"work_id": work_id, "prompt_id": work_id.split(".")[0]})


def test_batch_files_sort_numerically_and_new_invocations_start_new_files(tmp_path: Path) -> None:
    ledger = LedgerWriter(tmp_path, batch_size=1)
    for i in range(12):
        finished(ledger, f"p{i}.0")
    ledger.close()
    assert [n for n, _ in batch_files(tmp_path)] == list(range(12))
    second = LedgerWriter(tmp_path, batch_size=5)
    finished(second, "q.0")
    second.close()
    assert (tmp_path / "batch_12.jsonl").read_text().count("\n") == 1


def test_torn_last_line_is_ignored_and_reported(tmp_path: Path) -> None:
    ledger = LedgerWriter(tmp_path, batch_size=10)
    finished(ledger, "a.0")
    ledger.close()
    complete = (tmp_path / "batch_0.jsonl").stat().st_size
    with (tmp_path / "batch_0.jsonl").open("a") as handle:
        handle.write('{"work_id": "b.0", "prom')
    index = scan(tmp_path)
    assert list(index.records) == ["a.0"]
    assert index.torn == [f"batch_0.jsonl at byte {complete}"]


def test_duplicates_resume_k_minus_j_and_edits_keep_identity(tmp_path: Path) -> None:
    rows = [{"prompt": "same"}, {"prompt": "other"}, {"prompt": "same"}, {"prompt": "same"}]
    items, _ = read_dataset(write_jsonl(tmp_path / "d.jsonl", rows))
    ledger = LedgerWriter(tmp_path, batch_size=10)
    finished(ledger, items[2].work_id)  # occurrence 1 of "same" finished
    ledger.close()
    paired = assign(items, scan(tmp_path))
    assert [location is not None for _, location in paired] == [True, False, False, False]
    pending_ids = [item.work_id for item, location in paired if location is None]
    assert len(set(pending_ids)) == 3 and items[2].work_id not in pending_ids

    # The dataset is reordered and one copy removed: one finished + one more needed.
    edited, _ = read_dataset(write_jsonl(tmp_path / "e.jsonl", [rows[1], rows[0], rows[2]]))
    paired = assign(edited, scan(tmp_path))
    assert [location is not None for _, location in paired] == [False, True, False]


def test_ledger_lines_are_complete_json(tmp_path: Path) -> None:
    ledger = LedgerWriter(tmp_path, batch_size=3)
    for i in range(7):
        finished(ledger, f"p{i}.0")
    ledger.close()
    lines = [json.loads(line) for _, p in batch_files(tmp_path) for line in p.read_text().splitlines()]
    assert [line["work_id"] for line in lines] == [f"p{i}.0" for i in range(7)]
