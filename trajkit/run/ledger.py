"""The run's ledger: append-only ``batch_N.jsonl`` files, one line per successful session.

One writer, in the driving process (the run directory's lock sees to that). Each line is handed to
the OS as its prompt finishes (a killed process loses nothing it wrote) and fsynced in small groups
on a thread of its own (a power loss loses at most a moment; a slow disk never stalls the sessions).
Each invocation starts a new batch file after the highest existing one, so no file is ever appended
to by two invocations.

A write the disk refuses (full, failing) is cut back to the last complete line and its record kept
in memory to be written again, so a line is never left half-written for the next one to be appended
onto. Reading validates every line (parsed, the fields the merge needs present): a line that is
not a whole record (torn by a crash, two records run together, a block zeroed by a power cut,
garbage) is reported with its file and line number, and its prompt simply runs again.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from trajkit.jsonutil import dumps_line, loads
from trajkit.record.schema import record_problem
from trajkit.run.dataset import PlannedRow, WorkItem

if TYPE_CHECKING:
    from trajkit.run.rundir import RunDir

log = logging.getLogger("trajkit")

FSYNC_INTERVAL = 0.5


@dataclass(frozen=True)
class Location:
    file: int
    """Batch number."""
    offset: int


@dataclass(frozen=True)
class BadLine:
    path: Path
    line: int
    problem: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.problem}"


@dataclass
class LedgerIndex:
    """Where each finished work item's record is, and which lines are not whole records."""

    records: dict[str, Location] = field(default_factory=dict)
    """work_id -> location of its record (the first, if a work item somehow appears twice)."""
    by_prompt: dict[str, list[int]] = field(default_factory=dict)
    """prompt_id -> occurrence numbers already done."""
    bad: list[BadLine] = field(default_factory=list)
    paths: dict[int, Path] = field(default_factory=dict)


def scan(run_dir: RunDir, known: LedgerIndex | None = None) -> LedgerIndex:
    """Index the whole ledger, streaming: memory holds the index, never the records.

    With ``known`` (an index of this run directory made earlier), only the batch files it has not
    seen are read and added to it: an invocation only ever appends to batch files of its own.
    """
    index = known if known is not None else LedgerIndex()
    for number, path in run_dir.batch_files():
        if number in index.paths:
            continue
        index.paths[number] = path
        with path.open("rb") as handle:
            offset = 0
            for line, raw in enumerate(handle, 1):
                here, offset = offset, offset + len(raw)
                work_id, problem = check_line(raw)
                if work_id is None:
                    if not raw.strip():
                        continue
                    work_id, start, problem = _salvage(raw, problem)
                    index.bad.append(BadLine(path, line, problem))
                    if work_id is None:
                        continue
                    here += start
                if work_id in index.records:
                    continue
                index.records[work_id] = Location(number, here)
                prompt_id, _, occurrence = work_id.rpartition(".")
                index.by_prompt.setdefault(prompt_id, []).append(int(occurrence))
    return index


def check_line(raw: bytes) -> tuple[str | None, str]:
    """``(work_id, "")`` for a whole record line, ``(None, problem)`` for anything else."""
    if not raw.endswith(b"\n"):
        return None, "incomplete last line (a write cut off)"
    try:
        record = loads(raw)
    except (ValueError, RecursionError):
        if b"\0" in raw:
            return None, "NUL bytes (a block zeroed by a crash or power loss)"
        return None, "not valid JSON"
    problem = record_problem(record)
    return (None, problem) if problem else (record["work_id"], "")


_RECORD_START = b'{"work_id":'


def _salvage(raw: bytes, problem: str) -> tuple[str | None, int, str]:
    """A whole record at the end of a bad line (one written after a fragment, or after a zeroed
    block) is kept: ``(work_id, its offset in the line, the problem as reported)``."""
    start = raw.rfind(_RECORD_START, 1)
    if start > 0:
        work_id, _ = check_line(raw[start:])
        if work_id is not None:
            what = "two records on one line" if raw.startswith(_RECORD_START) else problem
            return work_id, start, f"{what}; the whole record at byte {start} of the line ({work_id}) is kept"
    return None, 0, problem


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


def records(index: LedgerIndex) -> Iterator[dict[str, Any]]:
    """Every record of ``index`` (one per finished work item), in ledger order, read one at a time.

    Batch files are only ever appended to, so this reads a run that is still going as it stood
    when ``index`` was made.
    """
    reader = RecordReader(index)
    try:
        for location in sorted(index.records.values(), key=lambda at: (at.file, at.offset)):
            yield reader.read(location)
    finally:
        reader.close()


class AppendLog:
    """A JSONL file appended line by line: each line handed to the OS as it comes, fsynced at most
    every half second on the fsync thread (never on the caller's), and on disk once closed.

    A write the disk refuses leaves the file as it was before that line (a short write is cut back;
    where even that fails, the next line starts on a line of its own) and the line waits in
    :attr:`unwritten` for :meth:`flush` to write it, in order, with every later line.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None
        self.size = 0
        """Bytes of whole lines in the file: this is the only writer (the run directory's lock)."""
        self.needs_newline = False
        """The file ends in a fragment that could not be cut away."""
        self.unwritten: list[bytes] = []
        self.error: OSError | None = None
        """The last write or fsync error, until a flush succeeds."""
        self.last_sync = 0.0
        self.syncing: Future[None] | None = None
        """This file's fsync on the fsync thread, until it is seen done."""

    def append(self, entry: dict[str, Any]) -> bool:
        """Write one line; False when the disk refused it (it is kept, see :attr:`error`)."""
        self.unwritten.append(dumps_line(entry))
        return self.flush()

    @property
    def held(self) -> int:
        """Lines the disk refused, held in memory."""
        return len(self.unwritten)

    def flush(self) -> bool:
        """Write every unwritten line; False (with :attr:`error` set) if the disk still refuses."""
        if self.fd is None and not self.unwritten:
            return True  # nothing was ever appended: no file to create
        try:
            if self.fd is None:
                self._open()
            while self.unwritten:
                self._write(self.unwritten[0])
                del self.unwritten[0]
            self._sync_now_and_then()
        except OSError as exc:
            self.error = exc
            return False
        self.error = None
        return True

    def _open(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
        size = os.fstat(fd).st_size
        self.fd, self.size = fd, size
        # an earlier process died in the middle of a line: never append onto its fragment
        self.needs_newline = False
        if size > 0:
            with open(self.path, "rb") as reader:
                reader.seek(size - 1)
                self.needs_newline = reader.read(1) != b"\n"

    def _write(self, line: bytes) -> None:
        assert self.fd is not None
        data = b"\n" + line if self.needs_newline else line
        done = 0
        try:
            while done < len(data):  # a short write; a full disk raises on the next one
                done += os.write(self.fd, data[done:])
        except OSError:
            if done:
                try:
                    os.ftruncate(self.fd, self.size)
                except OSError:
                    self.size += done
                    self.needs_newline = True
            raise
        self.size += len(data)
        self.needs_newline = False

    def _sync_now_and_then(self) -> None:
        assert self.fd is not None
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

    def __init__(self, run_dir: RunDir, batch_size: int) -> None:
        existing = run_dir.batch_files()
        self.run_dir = run_dir
        self.batch_size = batch_size
        self.batch = existing[-1][0] + 1 if existing else 0
        self.lines_in_batch = 0
        self.log = AppendLog(run_dir.batch_path(self.batch))
        self.closing: list[Future[None]] = []
        """Full batch files being fsynced and closed on the fsync thread."""

    def next_batch_num(self) -> int:
        """The batch number the next appended record will land in."""
        return (
            self.batch + 1
            if self.lines_in_batch >= self.batch_size and not self.log.unwritten
            else self.batch
        )

    def append(self, record: dict[str, Any]) -> bool:
        """Write a record; False when the disk refused it (it is kept in memory: :meth:`flush`)."""
        if self.lines_in_batch >= self.batch_size and not self.log.unwritten:
            closing = self.log.close_in_background()
            self.closing = [f for f in self.closing if not f.done() or f.exception() is not None]
            if closing is not None:
                self.closing.append(closing)
            self.batch += 1
            self.lines_in_batch = 0
            self.log = AppendLog(self.run_dir.batch_path(self.batch))
        self.lines_in_batch += 1
        return self.log.append(record)

    def flush(self) -> bool:
        """Write the records the disk refused so far; True once none is left."""
        return self.log.flush()

    @property
    def error(self) -> OSError | None:
        return self.log.error

    @property
    def held(self) -> int:
        """Finished records held in memory because the disk refused them."""
        return self.log.held

    @property
    def path(self) -> Path:
        return self.log.path

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


SERVED = "serve"
"""The backend named in a served session's identity (``trajkit serve --record``)."""


def in_ledger_order(index: LedgerIndex) -> list[tuple[WorkItem, Location | None]]:
    """The records of a run without a dataset (served sessions), each as the merge sees a dataset
    row: numbered by its position in the ledger."""
    ordered = sorted(index.records.items(), key=lambda pair: (pair[1].file, pair[1].offset))
    paired: list[tuple[WorkItem, Location | None]] = []
    for position, (work_id, location) in enumerate(ordered):
        identity, _, occurrence = work_id.rpartition(".")
        row = PlannedRow(prompt="", image=None, cwd=None, backend=SERVED, extra=None)
        item = WorkItem(
            index=position, line=position + 1, row=row, prompt_id=identity, occurrence=int(occurrence)
        )
        paired.append((item, location))
    return paired


async def write_held(logs: list[LedgerWriter | AppendLog], error: object, wait_s: float) -> None:
    """Lines the disk refused are finished, paid-for work: keep writing them again for up to
    ``wait_s`` seconds, saying what is held and how to keep it (``error`` names path and cause)."""
    deadline = time.monotonic() + wait_s
    delay, said = 0.2, 0.0
    while held := sum(log_.held for log_ in logs if not log_.flush()):
        now = time.monotonic()
        if now >= deadline:
            log.error("%s: %d finished lines could not be written; they run again on --resume", error, held)
            return
        if now - said >= 10:
            said = now
            log.warning(
                "%s: %d finished lines held in memory; retrying for %.0fs (free space to keep them)",
                error,
                held,
                deadline - now,
            )
        await asyncio.sleep(delay)
        delay = min(delay * 2, 2.0)
    if said:
        log.warning("every finished line held in memory is written now")
