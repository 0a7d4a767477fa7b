"""The run's ledger: append-only ``batch_N.jsonl`` files, one line per successful session.

One writer, in the driving process. Each line is handed to the OS as its prompt finishes (a killed
process loses nothing it wrote) and fsynced in small groups on a thread of its own (a power loss
loses at most a moment; a slow disk never stalls the sessions). Each invocation starts a new batch
file after the highest existing one, so no file is ever appended to by two invocations. Reading
tolerates a torn last line.
"""

from __future__ import annotations

import functools
import json
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from trajkit.dataset import WorkItem
from trajkit.jsonutil import dumps_line, loads

BATCH_FILE = re.compile(r"^batch_(\d+)\.jsonl$")
FAILURES_FILE = "failures.jsonl"
FSYNC_INTERVAL = 0.5


def batch_files(run_dir: Path) -> list[tuple[int, Path]]:
    """Ledger files in numeric order (batch_2 before batch_10)."""
    found = []
    if run_dir.is_dir():
        for path in run_dir.iterdir():
            match = BATCH_FILE.match(path.name)
            if match:
                found.append((int(match.group(1)), path))
    return sorted(found)


@dataclass(frozen=True)
class Location:
    file: int
    """Batch number."""
    offset: int


@dataclass
class LedgerIndex:
    """Where each finished work item's record is, and what was unreadable."""

    records: dict[str, Location] = field(default_factory=dict)
    """work_id -> location of its record (the first, if a work item somehow appears twice)."""
    by_prompt: dict[str, list[int]] = field(default_factory=dict)
    """prompt_id -> occurrence numbers already done."""
    torn: list[str] = field(default_factory=list)
    paths: dict[int, Path] = field(default_factory=dict)


def scan(run_dir: Path, known: LedgerIndex | None = None) -> LedgerIndex:
    """Index the whole ledger, streaming: memory holds the index, never the records.

    With ``known`` (an index of this run directory made earlier), only the batch files it has not
    seen are read and added to it: an invocation only ever appends to batch files of its own.
    """
    index = known if known is not None else LedgerIndex()
    for number, path in batch_files(run_dir):
        if number in index.paths:
            continue
        index.paths[number] = path
        with path.open("rb") as handle:
            offset = 0
            for raw in handle:
                here, offset = offset, offset + len(raw)
                work_id = _work_id(raw)
                if work_id is None:
                    if raw.strip():
                        index.torn.append(f"{path.name} at byte {here}")
                    continue
                if work_id in index.records:
                    continue
                index.records[work_id] = Location(number, here)
                prompt_id, _, occurrence = work_id.rpartition(".")
                index.by_prompt.setdefault(prompt_id, []).append(int(occurrence))
    return index


# Records are written with their work_id first, so the index can be built without parsing each
# record (ten times faster on a large ledger); anything else falls back to a full parse. Both
# spellings: orjson's compact one, and json.dumps' (older ledgers, and orjson's fallback).
_WORK_ID_PREFIX = re.compile(rb'\{"work_id": ?"([0-9a-f]+\.[0-9]+)",')


def _work_id(raw: bytes) -> str | None:
    if not raw.endswith(b"\n"):
        return None  # a torn last line: the write never completed
    match = _WORK_ID_PREFIX.match(raw)
    if match and raw.endswith(b"}\n"):
        return match.group(1).decode()
    try:
        work_id = loads(raw).get("work_id")
    except (ValueError, AttributeError):
        return None
    return work_id if isinstance(work_id, str) and "." in work_id else None


class RecordReader:
    """Reads records back by location, keeping one open handle per batch file."""

    def __init__(self, index: LedgerIndex) -> None:
        self.index = index
        self.handles: dict[int, IO[bytes]] = {}

    def read(self, location: Location) -> dict[str, Any]:
        handle = self.handles.get(location.file)
        if handle is None:
            handle = self.handles[location.file] = self.index.paths[location.file].open("rb")
        handle.seek(location.offset)
        record: dict[str, Any] = loads(handle.readline())
        return record

    def close(self) -> None:
        for handle in self.handles.values():
            handle.close()
        self.handles.clear()


class AppendLog:
    """A JSONL file appended line by line: each line handed to the OS as it comes, fsynced at most
    every half second on the fsync thread (never on the caller's), and on disk once closed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None
        self.last_sync = 0.0
        self.syncing: Future[None] | None = None
        """This file's fsync on the fsync thread, until it is seen done."""

    def append(self, entry: dict[str, Any]) -> None:
        if self.fd is None:
            self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
        _write_all(self.fd, dumps_line(entry))
        now = time.monotonic()
        if now - self.last_sync > FSYNC_INTERVAL:
            if self.syncing is not None:
                if not self.syncing.done():
                    return  # a slow disk: one fsync at a time, the next after this one
                syncing, self.syncing = self.syncing, None
                syncing.result()  # an fsync that failed is raised here, as it was on this thread
            self.syncing = _in_background(functools.partial(os.fsync, self.fd))
            self.last_sync = now

    def close(self) -> None:
        """Fsync and close on the caller's thread: the file is on disk when this returns."""
        fd, syncing = self._detach()
        if fd is None:
            return
        try:
            if syncing is not None:
                wait([syncing])  # never close the descriptor under its running fsync
            os.fsync(fd)
        finally:
            os.close(fd)
        if syncing is not None:
            syncing.result()  # that fsync failed: the final one succeeding does not undo it

    def close_in_background(self) -> Future[None] | None:
        """Fsync and close on the fsync thread, after this file's running fsync; the caller waits for
        neither. The returned future is done when the file is on disk (or holds the fsync's error)."""
        fd, syncing = self._detach()
        if fd is None:
            return None

        def fsync_and_close() -> None:
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            if syncing is not None:
                syncing.result()  # done: it ran before this, on the same thread

        return _in_background(fsync_and_close)

    def _detach(self) -> tuple[int | None, Future[None] | None]:
        fd, syncing = self.fd, self.syncing
        self.fd = self.syncing = None
        return fd, syncing


def _write_all(fd: int, data: bytes) -> None:
    written = os.write(fd, data)
    while written < len(data):  # a short write; a full disk raises on the next one
        data = data[written:]
        written = os.write(fd, data)


_fsync_thread: ThreadPoolExecutor | None = None
_fsync_thread_lock = threading.Lock()


def _in_background(work: Callable[[], None]) -> Future[None]:
    """Run ``work`` on the one fsync thread. Jobs run one at a time in the order given, so a file's
    close always comes after its fsyncs and no fsync ever meets a closed descriptor."""
    global _fsync_thread
    with _fsync_thread_lock:
        if _fsync_thread is None:
            _fsync_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trajkit-fsync")
        try:
            return _fsync_thread.submit(work)
        except RuntimeError:  # the interpreter is shutting down: no new threads, so do it here
            pass
    done: Future[None] = Future()
    try:
        work()
    except Exception as exc:
        done.set_exception(exc)
    else:
        done.set_result(None)
    return done


class LedgerWriter:
    """Appends records to batch files of ``batch_size`` lines, starting after existing ones."""

    def __init__(self, run_dir: Path, batch_size: int) -> None:
        existing = batch_files(run_dir)
        self.run_dir = run_dir
        self.batch_size = batch_size
        self.batch = existing[-1][0] + 1 if existing else 0
        self.lines_in_batch = 0
        self.log = AppendLog(self._path())
        self.closing: list[Future[None]] = []
        """Full batch files being fsynced and closed on the fsync thread."""

    def _path(self) -> Path:
        return self.run_dir / f"batch_{self.batch}.jsonl"

    def next_batch_num(self) -> int:
        """The batch number the next appended record will land in."""
        return self.batch + 1 if self.lines_in_batch >= self.batch_size else self.batch

    def append(self, record: dict[str, Any]) -> None:
        if self.lines_in_batch >= self.batch_size:
            closing = self.log.close_in_background()
            self.closing = [f for f in self.closing if not f.done() or f.exception() is not None]
            if closing is not None:
                self.closing.append(closing)
            self.batch += 1
            self.lines_in_batch = 0
            self.log = AppendLog(self._path())
        self.log.append(record)
        self.lines_in_batch += 1

    def close(self) -> None:
        """Every batch file of this writer is on disk when this returns (an fsync error is raised)."""
        try:
            self.log.close()
        finally:
            closing, self.closing = self.closing, []
            for future in closing:
                future.result()


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Every complete JSON object line of ``path``; a torn or garbled line is skipped."""
    if not path.exists():
        return
    with path.open("rb") as handle:
        for raw in handle:
            if not raw.endswith(b"\n"):
                continue
            try:
                entry = loads(raw)
            except ValueError:
                continue
            if isinstance(entry, dict):
                yield entry


@functools.cache
def _file_mode() -> int:
    """The mode ``open()`` would give a new file: temporary files are 0600 until told otherwise."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def temporary_beside(path: Path) -> Path:
    """An empty file next to ``path``, with ordinary permissions, to be renamed over it."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.fchmod(fd, _file_mode())
    os.close(fd)
    return Path(tmp)


@contextmanager
def atomic_replace(target: Path) -> Iterator[Path]:
    """A temporary path beside ``target``, renamed onto it only if the block succeeds."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_beside(target)
    try:
        yield tmp
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` so that a reader sees the old file or the new one, never half."""
    tmp = temporary_beside(path)
    try:
        with tmp.open("w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, data: Any) -> None:
    write_atomic(path, json.dumps(data, indent=2, ensure_ascii=False, sort_keys=True) + "\n")


def assign(items: list[WorkItem], index: LedgerIndex) -> list[tuple[WorkItem, Location | None]]:
    """Pair each dataset row with a finished record, or with a fresh work id if it still needs one.

    Identical rows are interchangeable: if a prompt has k rows and j finished records, the first
    min(j, k) rows (in dataset order) take the records and the others get occurrence numbers that
    no record uses yet, so a resume runs exactly k - j more.
    """
    done: dict[str, list[int]] = {p: sorted(occ) for p, occ in index.by_prompt.items()}
    used: dict[str, set[int]] = {p: set(occ) for p, occ in done.items()}
    taken: dict[str, int] = {}
    next_free: dict[str, int] = {}
    paired: list[tuple[WorkItem, Location | None]] = []
    for item in items:
        finished = done.get(item.prompt_id, [])
        position = taken.get(item.prompt_id, 0)
        taken[item.prompt_id] = position + 1
        if position < len(finished):
            occurrence = finished[position]
            paired.append(
                (replace(item, occurrence=occurrence), index.records[f"{item.prompt_id}.{occurrence}"])
            )
            continue
        occupied = used.setdefault(item.prompt_id, set())
        occurrence = next_free.get(item.prompt_id, 0)
        while occurrence in occupied:
            occurrence += 1
        occupied.add(occurrence)
        next_free[item.prompt_id] = occurrence + 1
        paired.append((replace(item, occurrence=occurrence), None))
    return paired
