"""Damaged ledgers and refused writes: every bad line is found and reported, no write leaves a
fragment for the next line to be appended onto, and refused records wait in memory."""

from __future__ import annotations

import contextlib
import errno
import json
import resource
import signal
from collections.abc import Iterator
from pathlib import Path

from tests.test_ledger import ledger_record
from trajkit.jsonutil import dumps_line
from trajkit.run.ledger import AppendLog, LedgerWriter, RecordReader, assign, read_jsonl, scan
from trajkit.run.rundir import RunDir

A, B, C, D = "aaaa.0", "bbbb.0", "cccc.0", "dddd.0"


def lines(*work_ids: str) -> list[bytes]:
    return [dumps_line(ledger_record(w, padding="x" * 200)) for w in work_ids]


def test_two_records_run_together_keep_the_whole_one_and_report_the_line(tmp_path: Path) -> None:
    a, b, c, d = lines(A, B, C, D)
    RunDir(tmp_path).batch_path(0).write_bytes(a + b[:120] + c + d)  # b cut short, c appended onto it
    index = scan(RunDir(tmp_path))
    assert sorted(index.records) == [A, C, D]
    [bad] = index.bad
    assert (bad.path, bad.line) == (RunDir(tmp_path).batch_path(0), 2)
    assert bad.problem.startswith("two records on one line") and C in bad.problem
    reader = RecordReader(index)
    assert reader.read(index.records[C])["work_id"] == C  # read from the middle of the line
    assert reader.read(index.records[D])["work_id"] == D
    reader.close()


def test_a_zeroed_block_across_a_record_boundary_loses_both_records_and_nothing_else(tmp_path: Path) -> None:
    a, b, c, d = lines(A, B, C, D)
    data = bytearray(a + b + c + d)
    boundary = len(a) + len(b)
    data[boundary - 60 : boundary + 60] = bytes(120)  # what a power cut can leave: a block of NULs
    RunDir(tmp_path).batch_path(3).write_bytes(bytes(data))
    index = scan(RunDir(tmp_path))
    assert sorted(index.records) == [A, D]
    assert [str(bad) for bad in index.bad] == [
        f"{RunDir(tmp_path).batch_path(3)}:2: NUL bytes (a block zeroed by a crash or power loss)"
    ]


def test_garbage_and_incomplete_records_are_reported_by_line(tmp_path: Path) -> None:
    a, b, _, d = lines(A, B, C, D)
    missing_usage = {k: v for k, v in ledger_record(C).items() if k != "usage"}
    wrong_owner = ledger_record("eeee.0", prompt_id="ffff")
    odd_occurrence = ledger_record("eeee.\u00b2")  # a digit to str.isdigit, not to int()
    body = [a, b"\x8f\xff garbage \x01\n", json.dumps(missing_usage).encode() + b"\n"]
    body += [b"[1, 2]\n", json.dumps(wrong_owner).encode() + b"\n", b"\n", b]
    body += [json.dumps(odd_occurrence).encode() + b"\n", d[:50]]
    RunDir(tmp_path).batch_path(0).write_bytes(b"".join(body))
    index = scan(RunDir(tmp_path))
    assert sorted(index.records) == [A, B]
    problems = [(bad.line, bad.problem) for bad in index.bad]
    assert problems == [
        (2, "not valid JSON"),
        (3, "field 'usage' missing or of the wrong type"),
        (4, "a JSON list, not a record"),
        (5, "work_id 'eeee.0' does not belong to prompt_id 'ffff'"),
        (8, "work_id 'eeee.\u00b2' does not belong to prompt_id 'eeee'"),
        (9, "incomplete last line (a write cut off)"),
    ]


def test_the_prompts_of_bad_lines_run_again(tmp_path: Path) -> None:
    from trajkit.run.dataset import read_dataset

    dataset = tmp_path / "d.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(3)))
    items, _ = read_dataset(dataset)
    run = tmp_path / "run"
    run.mkdir()
    good, damaged, also_good = (dumps_line(ledger_record(item.work_id)) for item in items)
    RunDir(run).batch_path(0).write_bytes(good + damaged[:-30] + b"\x00" * 29 + b"\n" + also_good)
    paired = assign(items, scan(RunDir(run)))
    assert [location is None for _, location in paired] == [False, True, False]


@contextlib.contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """A real refused write, without root: past RLIMIT_FSIZE the kernel writes short, then EFBIG."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def test_a_short_write_is_cut_back_and_the_line_held_until_the_disk_takes_it(tmp_path: Path) -> None:
    path = tmp_path / "batch_0.jsonl"
    log = AppendLog(path)
    assert log.append(ledger_record(A))
    first = path.read_bytes()
    with file_size_limit(len(first) + 100):  # the next line is written in part, then refused
        assert not log.append(ledger_record(B, padding="y" * 400))
        assert not log.append(ledger_record(C))  # later lines wait behind it, in order
        assert log.error is not None and log.error.errno == errno.EFBIG
        assert path.read_bytes() == first  # no fragment left for the next line to run onto
        assert log.held == 2 and not log.flush()
    assert log.flush() and log.error is None and log.held == 0
    log.close()
    assert [e["work_id"] for e in read_jsonl(path)] == [A, B, C]
    assert not scan(RunDir(tmp_path)).bad


def test_the_ledger_writer_holds_refused_records_and_rotates_only_once_they_are_written(
    tmp_path: Path,
) -> None:
    writer = LedgerWriter(RunDir(tmp_path), batch_size=1)
    assert writer.append(ledger_record(A))
    with file_size_limit(1):
        assert not writer.append(ledger_record(B))  # a new batch file, refused at its first byte
        assert not writer.append(ledger_record(C))
        assert writer.held == 2 and writer.path == RunDir(tmp_path).batch_path(1)
    assert writer.flush() and writer.held == 0
    assert writer.append(ledger_record(D))
    writer.close()
    index = scan(RunDir(tmp_path))
    assert sorted(index.records) == [A, B, C, D] and not index.bad
    assert sorted(index.paths) == [0, 1, 2]


def test_a_fragment_left_by_an_earlier_process_is_never_appended_onto(tmp_path: Path) -> None:
    path = tmp_path / "failures.jsonl"
    path.write_bytes(dumps_line({"work_id": A}) + b'{"work_id": "torn by a kil')
    log = AppendLog(path)
    assert log.append({"work_id": B})
    log.close()
    assert [e["work_id"] for e in read_jsonl(path)] == [A, B]
