"""Ledger reading and the pairing of dataset rows with finished records."""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import write_jsonl
from trajkit.jsonutil import dumps_bytes, dumps_line, loads
from trajkit.run import ledger as ledger_module
from trajkit.run.dataset import DatasetRow, read_dataset
from trajkit.run.ledger import AppendLog, LedgerWriter, RecordReader, assign, records, scan
from trajkit.run.rundir import RunDir


def ledger_record(work_id: str, **fields: Any) -> dict[str, Any]:
    """A record with every field a record must have (the scan checks them), plus ``fields``."""
    record = {
        "work_id": work_id,
        "prompt_id": work_id.rpartition(".")[0],
        "prompt_index": 0,
        "conversations": [{"from": "human", "value": "task"}],
        "metadata": {},
        "completed": True,
        "partial": False,
        "api_calls": 1,
        "toolsets_used": [],
        "tools_offered": [],
        "tool_stats": {},
        "tool_error_counts": {},
        "invalid_tool_calls": 0,
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2, "cost": None},
        "duration_s": 0.5,
        "attempt": 1,
        "finish_reason": "stop",
        "sandbox": {"backend": "local", "image": None, "digest": None},
    }
    return {**record, **fields}


def finished(ledger: LedgerWriter, work_id: str) -> None:
    ledger.append(ledger_record(work_id))


def test_batch_files_sort_numerically_and_new_invocations_start_new_files(tmp_path: Path) -> None:
    ledger = LedgerWriter(RunDir(tmp_path), batch_size=1)
    for i in range(12):
        finished(ledger, f"p{i}.0")
    ledger.close()
    assert [n for n, _ in RunDir(tmp_path).batch_files()] == list(range(12))
    second = LedgerWriter(RunDir(tmp_path), batch_size=5)
    finished(second, "q.0")
    second.close()
    assert (tmp_path / "batch_12.jsonl").read_text().count("\n") == 1


def test_a_known_index_is_extended_with_the_new_batch_files_only(tmp_path: Path) -> None:
    first = LedgerWriter(RunDir(tmp_path), batch_size=2)
    for i in range(3):
        finished(first, f"a{i}.0")
    first.close()
    index = scan(RunDir(tmp_path))
    second = LedgerWriter(RunDir(tmp_path), batch_size=2)
    for i in range(3):
        finished(second, f"b{i}.0")
    finished(second, "a0.1")
    second.close()
    # a line appended to an old file behind the index's back is not read again
    with (tmp_path / "batch_0.jsonl").open("a") as handle:
        handle.write(json.dumps(ledger_record("zz.0")) + "\n")

    extended = scan(RunDir(tmp_path), index)
    full = scan(RunDir(tmp_path))
    assert extended is index
    assert set(extended.records) == set(full.records) - {"zz.0"}
    assert {k: v for k, v in full.records.items() if k != "zz.0"} == extended.records
    assert extended.by_prompt["a0"] == [0, 1] and sorted(extended.paths) == sorted(full.paths)


def test_torn_last_line_is_ignored_and_reported(tmp_path: Path) -> None:
    ledger = LedgerWriter(RunDir(tmp_path), batch_size=10)
    finished(ledger, "a.0")
    ledger.close()
    with (tmp_path / "batch_0.jsonl").open("a") as handle:
        handle.write('{"work_id": "b.0", "prom')
    index = scan(RunDir(tmp_path))
    assert list(index.records) == ["a.0"]
    assert [str(bad) for bad in index.bad] == [
        f"{tmp_path / 'batch_0.jsonl'}:2: incomplete last line (a write cut off)"
    ]


def test_records_are_read_back_in_ledger_order_once_each(tmp_path: Path) -> None:
    ledger = LedgerWriter(RunDir(tmp_path), batch_size=2)
    for work_id in ("c.0", "a.0", "b.0", "a.1", "d.0"):
        ledger.append(ledger_record(work_id, prompt_index=ord(work_id[0])))
    ledger.close()
    with (tmp_path / "batch_1.jsonl").open("a") as handle:  # a repeat, then a torn line
        handle.write(json.dumps(ledger_record("a.0", prompt_index=-1)) + "\n" + '{"work_id": "e.0"')
    index = scan(RunDir(tmp_path))
    read = list(records(index))
    assert [r["work_id"] for r in read] == ["c.0", "a.0", "b.0", "a.1", "d.0"]
    assert [r["prompt_index"] for r in read][:2] == [ord("c"), ord("a")], "the first record of a work item"


def test_duplicates_resume_k_minus_j_and_edits_keep_identity(tmp_path: Path) -> None:
    rows = [{"prompt": "same"}, {"prompt": "other"}, {"prompt": "same"}, {"prompt": "same"}]
    items, _ = read_dataset(write_jsonl(tmp_path / "d.jsonl", rows))
    ledger = LedgerWriter(RunDir(tmp_path), batch_size=10)
    finished(ledger, items[2].work_id)  # occurrence 1 of "same" finished
    ledger.close()
    paired = assign(items, scan(RunDir(tmp_path)))
    assert [location is not None for _, location in paired] == [True, False, False, False]
    pending_ids = [item.work_id for item, location in paired if location is None]
    assert len(set(pending_ids)) == 3 and items[2].work_id not in pending_ids

    # The dataset is reordered and one copy removed: one finished + one more needed.
    edited, _ = read_dataset(write_jsonl(tmp_path / "e.jsonl", [rows[1], rows[0], rows[2]]))
    paired = assign(edited, scan(RunDir(tmp_path)))
    assert [location is not None for _, location in paired] == [False, True, False]


def test_a_prompt_s_identity_is_stable_across_versions() -> None:
    """Run directories made by earlier versions must resume: these ids are in their ledgers."""
    assert DatasetRow(prompt="List the files").prompt_id() == "f3b412500e8c97730260"
    row = DatasetRow(prompt='é "q"\n', image="busybox.sif", cwd="/src", backend="singularity")
    assert row.prompt_id() == "9aec66c2fc8419655bdf"


def test_ledger_lines_are_complete_json(tmp_path: Path) -> None:
    ledger = LedgerWriter(RunDir(tmp_path), batch_size=3)
    for i in range(7):
        finished(ledger, f"p{i}.0")
    ledger.close()
    lines = [
        json.loads(line) for _, p in RunDir(tmp_path).batch_files() for line in p.read_text().splitlines()
    ]
    assert [line["work_id"] for line in lines] == [f"p{i}.0" for i in range(7)]


# -- ledger lines: orjson and its fallback ----------------------------------------------------------

HEX_ID = "0123456789abcdef0123"


def test_scan_reads_records_of_either_spelling(tmp_path: Path) -> None:
    record = ledger_record(f"{HEX_ID}.0", value="x")
    older = {**record, "work_id": f"{HEX_ID}.1"}
    with (tmp_path / "batch_0.jsonl").open("w") as handle:
        handle.write(json.dumps(older, ensure_ascii=False) + "\n")  # as ledgers were written before
    ledger = LedgerWriter(RunDir(tmp_path), batch_size=10)
    ledger.append(record)
    ledger.close()
    assert (tmp_path / "batch_1.jsonl").read_bytes().startswith(b'{"work_id":"')
    index = scan(RunDir(tmp_path))
    assert sorted(index.records) == [f"{HEX_ID}.0", f"{HEX_ID}.1"]
    assert index.by_prompt == {HEX_ID: [1, 0]}


ORJSON_REFUSES: dict[str, dict[Any, Any]] = {
    "lone surrogate": {"value": "model output \ud800 cut in half", "reasoning": "\udfff"},
    "integers beyond 64 bits": {"big": 2**70, "negative": -(2**64), "nested": [{"n": 10**30}]},
    "non-string keys": {"tool_stats": {1: 2}},
}


@pytest.mark.parametrize("shape", ORJSON_REFUSES)
def test_values_orjson_refuses_are_written_and_read_back_exactly(tmp_path: Path, shape: str) -> None:
    record = ledger_record(f"{HEX_ID}.0", **ORJSON_REFUSES[shape])
    ledger = LedgerWriter(RunDir(tmp_path), batch_size=10)
    ledger.append(record)
    ledger.append(ledger_record(f"{HEX_ID}.1"))
    ledger.close()
    raw = (tmp_path / "batch_0.jsonl").read_bytes()
    raw.decode("utf-8")  # valid UTF-8 whatever the record held
    index = scan(RunDir(tmp_path))
    assert sorted(index.records) == [f"{HEX_ID}.0", f"{HEX_ID}.1"] and not index.bad
    reader = RecordReader(index)
    read = reader.read(index.records[f"{HEX_ID}.0"])
    reader.close()
    assert read == json.loads(json.dumps(record))  # what json.dumps then json.loads keeps


def test_loads_is_exact_for_both_spellings() -> None:
    value = {
        "work_id": "a.0",
        "floats": [0.1, 1e-07, 1e16, 4.321, -0.0, 2.5e-308, 1.7976931348623157e308],
        "ints": [0, -1, 2**63 - 1, 2**64 - 1, -(2**63)],
        "text": 'é ✓ 你好 \U0001f600 "quoted" \\ \n',
        "nested": {"a": [None, True, False, {}], "": []},
    }
    for text in (
        dumps_bytes(value),
        json.dumps(value).encode(),
        json.dumps(value, ensure_ascii=False).encode(),
    ):
        got = loads(text)
        assert got == value and json.dumps(got) == json.dumps(value)
    # Written by json.dumps (an older ledger): orjson would read these integers as floats.
    assert (
        loads(b'{"work_id": "a.0", "n": 123456789012345678901234567890}')["n"]
        == 123456789012345678901234567890
    )
    assert math.isnan(loads(b'{"work_id": "a.0", "x": NaN}')["x"])  # json's NaN, which orjson refuses


def test_dumps_line_is_one_compact_line() -> None:
    assert dumps_line({"work_id": "a.0", "b": [1, 2]}) == b'{"work_id":"a.0","b":[1,2]}\n'
    assert dumps_line({"n": 2**70}) == b'{"n": 1180591620717411303424}\n'


# -- fsync: off the caller's thread, never on a closed descriptor -----------------------------------


class FsyncSpy:
    """Stands in for os.fsync: notes the thread and the file, checks the descriptor is still open."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.calls: list[tuple[str, str]] = []
        self.release = threading.Event()
        self.release.set()

    def __call__(self, fd: int) -> None:
        self.release.wait(10)
        time.sleep(self.delay)
        os.fstat(fd)  # EBADF if the descriptor was closed under this fsync
        self.calls.append((threading.current_thread().name, Path(os.readlink(f"/proc/self/fd/{fd}")).name))


def open_files(directory: Path) -> list[str]:
    found = []
    for entry in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):
            target = Path(os.readlink(entry))
            if target.parent == directory:
                found.append(target.name)
    return found


needs_proc = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd")


@needs_proc
def test_periodic_fsync_runs_on_its_own_thread_and_close_waits_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = FsyncSpy(delay=0.2)
    monkeypatch.setattr(os, "fsync", spy)
    log = AppendLog(tmp_path / "f.jsonl")
    log.append({"work_id": "a.0"})  # the first line starts an fsync: slow, still running below
    log.close()
    here = threading.current_thread().name
    assert [name for _, name in spy.calls] == ["f.jsonl", "f.jsonl"]
    assert spy.calls[0][0].startswith("trajkit-fsync") and spy.calls[1][0] == here
    assert open_files(tmp_path) == []
    assert (tmp_path / "f.jsonl").read_bytes() == b'{"work_id":"a.0"}\n'


@needs_proc
def test_a_slow_disk_gets_one_fsync_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spy = FsyncSpy()
    spy.release.clear()
    monkeypatch.setattr(os, "fsync", spy)
    monkeypatch.setattr(ledger_module, "FSYNC_INTERVAL", 0.0)
    log = AppendLog(tmp_path / "f.jsonl")
    for i in range(20):
        log.append({"work_id": f"a.{i}"})  # every line is due an fsync; the first one hangs
    assert len((tmp_path / "f.jsonl").read_bytes().splitlines()) == 20  # lines are not held back
    spy.release.set()
    log.close()
    assert len(spy.calls) == 2  # the one that hung, then close's own


@needs_proc
def test_full_batch_files_are_closed_off_the_caller_s_thread_and_all_synced_by_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = FsyncSpy(delay=0.05)
    monkeypatch.setattr(os, "fsync", spy)
    monkeypatch.setattr(ledger_module, "FSYNC_INTERVAL", 3600.0)
    ledger = LedgerWriter(RunDir(tmp_path), batch_size=2)
    for i in range(5):
        finished(ledger, f"p{i}.0")
    ledger.close()
    here = threading.current_thread().name
    last = {name: thread for thread, name in spy.calls}
    assert set(last) == {"batch_0.jsonl", "batch_1.jsonl", "batch_2.jsonl"}
    assert last["batch_0.jsonl"] != here and last["batch_1.jsonl"] != here and last["batch_2.jsonl"] == here
    assert open_files(tmp_path) == []
    assert [
        line["work_id"] for _, p in RunDir(tmp_path).batch_files() for line in map(json.loads, p.open())
    ] == [f"p{i}.0" for i in range(5)]


def test_a_failed_background_fsync_is_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_fsync = os.fsync

    def failing_in_background(fd: int) -> None:
        if threading.current_thread().name.startswith("trajkit-fsync"):
            raise OSError(errno.EIO, "I/O error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", failing_in_background)
    log = AppendLog(tmp_path / "f.jsonl")
    log.append({"work_id": "a.0"})
    with pytest.raises(OSError, match="I/O error"):
        log.close()
    assert log.fd is None
