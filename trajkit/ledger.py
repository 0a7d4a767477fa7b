"""The run's ledger: append-only ``batch_N.jsonl`` files, one line per successful session.

One writer, in the driving process. Lines are flushed as each prompt finishes (a killed process
loses nothing it wrote) and fsynced in small groups (a power loss loses at most a moment). Each
invocation starts a new batch file after the highest existing one, so no file is ever appended
to by two invocations. Reading tolerates a torn last line.
"""

from __future__ import annotations

import functools
import json
import os
import re
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from trajkit.dataset import WorkItem

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


def scan(run_dir: Path) -> LedgerIndex:
    """Index the whole ledger, streaming: memory holds the index, never the records."""
    index = LedgerIndex()
    for number, path in batch_files(run_dir):
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
# record (ten times faster on a large ledger); anything else falls back to a full parse.
_WORK_ID_PREFIX = re.compile(rb'\{"work_id": "([0-9a-f]+\.[0-9]+)", ')


def _work_id(raw: bytes) -> str | None:
    if not raw.endswith(b"\n"):
        return None  # a torn last line: the write never completed
    match = _WORK_ID_PREFIX.match(raw)
    if match and raw.endswith(b"}\n"):
        return match.group(1).decode()
    try:
        work_id = json.loads(raw).get("work_id")
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
        record: dict[str, Any] = json.loads(handle.readline())
        return record

    def close(self) -> None:
        for handle in self.handles.values():
            handle.close()
        self.handles.clear()


class AppendLog:
    """A JSONL file appended line by line: flushed per line, fsynced at most every half second."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.handle: IO[str] | None = None
        self.last_sync = 0.0

    def append(self, entry: dict[str, Any]) -> None:
        if self.handle is None:
            self.handle = self.path.open("a", encoding="utf-8")
        self.handle.write(json.dumps(entry, ensure_ascii=False) + "\n")
        self.handle.flush()
        now = time.monotonic()
        if now - self.last_sync > FSYNC_INTERVAL:
            os.fsync(self.handle.fileno())
            self.last_sync = now

    def close(self) -> None:
        if self.handle is not None:
            self.handle.flush()
            os.fsync(self.handle.fileno())
            self.handle.close()
            self.handle = None


class LedgerWriter:
    """Appends records to batch files of ``batch_size`` lines, starting after existing ones."""

    def __init__(self, run_dir: Path, batch_size: int) -> None:
        existing = batch_files(run_dir)
        self.run_dir = run_dir
        self.batch_size = batch_size
        self.batch = existing[-1][0] + 1 if existing else 0
        self.lines_in_batch = 0
        self.log = AppendLog(self._path())

    def _path(self) -> Path:
        return self.run_dir / f"batch_{self.batch}.jsonl"

    def next_batch_num(self) -> int:
        """The batch number the next appended record will land in."""
        return self.batch + 1 if self.lines_in_batch >= self.batch_size else self.batch

    def append(self, record: dict[str, Any]) -> None:
        if self.lines_in_batch >= self.batch_size:
            self.log.close()
            self.batch += 1
            self.lines_in_batch = 0
            self.log = AppendLog(self._path())
        self.log.append(record)
        self.lines_in_batch += 1

    def close(self) -> None:
        self.log.close()


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Every complete JSON object line of ``path``; a torn or garbled line is skipped."""
    if not path.exists():
        return
    with path.open("rb") as handle:
        for raw in handle:
            if not raw.endswith(b"\n"):
                continue
            try:
                entry = json.loads(raw)
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
