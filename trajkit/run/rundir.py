"""The run directory: its file names, atomic writes, the lock, the manifest and the derived files.

Every command that reads or writes a run goes through here. The ledger (``batch_N.jsonl``) is the
truth; ``statistics.json``, ``checkpoint.json`` and ``rejected.jsonl`` are derived from it by each
merge, and ``run.json`` keeps what the ledger cannot (the run's settings, each invocation), the
spend files (``spend/RUN_ID.jsonl``) what each invocation's model answers cost, to the last one.
``tools.json`` keeps the tool schemas offered to the model (:mod:`trajkit.tools.catalog`). A
derived file that is damaged or missing is rebuilt with a warning, never a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import functools
import json
import logging
import os
import re
import socket
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

log = logging.getLogger("trajkit")

BATCH_FILE = re.compile(r"^batch_(\d+)\.jsonl$")
MANIFEST_FILE = "run.json"
CHECKPOINT_FILE = "checkpoint.json"
STATISTICS_FILE = "statistics.json"
FAILURES_FILE = "failures.jsonl"
REJECTED_FILE = "rejected.jsonl"
KEPT_FILE = "trajectories.jsonl"
"""The sharegpt writer's output: every kept record in dataset order, what readers of a run use."""
TOOLS_FILE = "tools.json"
"""The tool schemas offered to the model: schema-set key -> the schemas, as the OpenAI ``tools``
list has them, sorted by tool name; each record's ``tool_schemas_key`` names its set."""
LOCK_FILE = "run.lock"
"""Not a dot file: the merge removes dot files (its own temporaries) left by a crash."""
SPEND_KEYS = ("requests", "prompt_tokens", "completion_tokens", "cost")
ACCOUNTS_INTERVAL = 5.0
"""Seconds between updates of the invocation's entry in run.json (what it has spent so far), by a
run and by ``trajkit serve --record`` alike (:class:`ManifestKeeper`)."""
"""What a model client counts over every response it received (``ModelClient.statistics``)."""
SPEND_DIR = "spend"
"""One append-only file per invocation, ``spend/RUN_ID.jsonl``: a line of what the invocation's
model answers have cost so far (:data:`SPEND_KEYS`) as each answer arrives, so that a killed
invocation's spend is known to its last answer."""


class RunIOError(Exception):
    """Reading or writing a file of the run failed (a full disk, an I/O error, permissions)."""

    def __init__(self, path: Path | str, cause: OSError | str) -> None:
        self.path = Path(path)
        self.cause = cause
        reason = cause if isinstance(cause, str) else (cause.strerror or type(cause).__name__)
        super().__init__(f"{path}: {reason}")

    @classmethod
    def of(cls, exc: OSError, fallback: Path) -> RunIOError:
        return cls(exc.filename if isinstance(exc.filename, str | Path) else fallback, exc)


def batch_files(run_dir: Path) -> list[tuple[int, Path]]:
    """Ledger files in numeric order (batch_2 before batch_10)."""
    found = []
    if run_dir.is_dir():
        for path in run_dir.iterdir():
            match = BATCH_FILE.match(path.name)
            if match:
                found.append((int(match.group(1)), path))
    return sorted(found)


def batch_path(run_dir: Path, number: int) -> Path:
    return run_dir / f"batch_{number}.jsonl"


def holds_a_run(run_dir: Path) -> bool:
    return bool(batch_files(run_dir)) or (run_dir / FAILURES_FILE).exists()


def ledger_state(run_dir: Path) -> dict[str, list[int]]:
    """The size and modification time of every file the statistics are made from (the ledger,
    the failure log, the spend files): a merge notes them in ``statistics.json``, so a reader can
    tell whether the ledger has changed since (:mod:`trajkit.run.view`)."""
    paths = [path for _, path in batch_files(run_dir)] + [run_dir / FAILURES_FILE]
    spend = run_dir / SPEND_DIR
    if spend.is_dir():
        paths += sorted(spend.iterdir())
    state = {}
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            stat = path.stat()
            state[str(path.relative_to(run_dir))] = [stat.st_size, stat.st_mtime_ns]
    return state


# -- atomic writes ---------------------------------------------------------------------------------


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
    """A temporary path beside ``target``, renamed onto it only if the block succeeds. A failing
    write (in the block too) is a :class:`RunIOError` naming ``target``, not its temporary."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = temporary_beside(target)
    except OSError as exc:
        raise RunIOError(target, exc) from None
    try:
        yield tmp
        os.replace(tmp, target)
    except OSError as exc:
        raise RunIOError(target, exc) from None
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` so that a reader sees the old file or the new one, never half.
    A failure is a :class:`RunIOError` naming ``path``."""
    try:
        tmp = temporary_beside(path)
    except OSError as exc:
        raise RunIOError(path, exc) from None
    try:
        with tmp.open("w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        raise RunIOError(path, exc) from None
    finally:
        tmp.unlink(missing_ok=True)


def json_text(data: Any) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False, sort_keys=True) + "\n"


def write_json_atomic(path: Path, data: Any) -> None:
    write_atomic(path, json_text(data))


def read_json_object(
    path: Path, required: dict[str, type | tuple[type, ...]], remedy: str
) -> dict[str, Any] | None:
    """A JSON object file with ``required`` keys of the given types; None with a warning (ending in
    ``remedy``) when it is damaged (invalid JSON, another shape), None silently when it does not
    exist. An I/O error other than a missing file is a :class:`RunIOError`."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise RunIOError(path, exc) from None
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        problem: str | None = f"invalid JSON ({exc})"
    else:
        problem = _shape_problem(data, required)
        if problem is None:
            return dict(data)
    log.warning("%s is damaged: %s; %s", path, problem, remedy)
    return None


def read_run_json(run_dir: Path, remedy: str) -> dict[str, Any] | None:
    """``run.json`` as a reader of the run sees it (:func:`read_json_object`: None, with a warning
    naming ``remedy``, when it is damaged; None when the run has none)."""
    return read_json_object(run_dir / MANIFEST_FILE, {"invocations": list}, remedy)


def _shape_problem(data: Any, required: dict[str, type | tuple[type, ...]]) -> str | None:
    if not isinstance(data, dict):
        return f"expected a JSON object, got {type(data).__name__}"
    for key, kind in required.items():
        if not isinstance(data.get(key), kind):
            return f"field {key!r} is missing or not of the expected type"
    return None


# -- the lock --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Holder:
    """The process that holds a run directory, as it wrote itself into the lock file."""

    pid: int | None
    host: str
    started: str

    def __str__(self) -> str:
        if self.pid is None:
            return "another process (it has not written its details yet)"
        return f"pid {self.pid} on host {self.host}, started {self.started}"


class RunLocked(RuntimeError):
    """Another invocation holds the run directory."""

    def __init__(self, run_dir: Path, holder: Holder) -> None:
        self.holder = holder
        super().__init__(
            f"{run_dir} is in use by another trajkit invocation ({holder}); one invocation per run "
            "directory: wait for it to finish or stop it (`trajkit status` still reads the run)"
        )


class RunLock:
    """An exclusive ``flock`` on ``run.lock``, held for the life of the process.

    The kernel releases it when the process dies, however it dies, so ``kill -9`` leaves no stale
    lock; the descriptor is close-on-exec so that no sandbox process inherits it. Readers never
    take it.
    """

    ATTEMPTS = 10
    """A reader probing the lock (:func:`lock_holder`) holds it shared for an instant."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / LOCK_FILE
        self.fd: int | None = None

    def take(self) -> None:
        """Make the run directory (and its parents) if need be, then :meth:`acquire` the lock: how
        the one writer of a run directory (a run, or a recording server) begins."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RunIOError(self.path.parent, exc) from None
        self.acquire()

    def acquire(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except OSError as exc:
            raise RunIOError(self.path, exc) from None
        for attempt in range(self.ATTEMPTS):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if attempt + 1 < self.ATTEMPTS:
                    time.sleep(0.05)
            except OSError as exc:
                os.close(fd)
                raise RunIOError(self.path, exc) from None
        else:
            holder = _read_holder(fd)
            os.close(fd)
            raise RunLocked(self.path.parent, holder)
        self.fd = fd
        details = {"pid": os.getpid(), "host": socket.gethostname(), "started": _now()}
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(details) + "\n").encode(), 0)
        except OSError as exc:
            self.release()
            raise RunIOError(self.path, exc) from None

    def release(self) -> None:
        if self.fd is not None:
            # an emptied lock file: a finished run's directory is the same after every invocation
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, 0)
            os.close(self.fd)  # closing the only descriptor releases the flock
            self.fd = None


def lock_holder(run_dir: Path) -> Holder | None:
    """Who holds the run directory now, or None. Probes with a shared lock taken for an instant."""
    try:
        fd = os.open(run_dir / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_holder(fd)
        except OSError as exc:
            if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP):
                return None
            raise
        return None
    finally:
        os.close(fd)


def _read_holder(fd: int) -> Holder:
    try:
        details = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return Holder(int(details["pid"]), str(details["host"]), str(details["started"]))
    except (OSError, ValueError, KeyError, TypeError):
        return Holder(None, "", "")


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# -- the manifest (run.json) -----------------------------------------------------------------------


def read_manifest(run_dir: Path, run_name: str, version: str) -> dict[str, Any]:
    """``run.json``, or a fresh one. A damaged one is kept as ``run.json.damaged`` and rebuilt: the
    configuration is written again by the next invocation; the history of earlier ones is lost."""
    path = run_dir / MANIFEST_FILE
    manifest = read_run_json(run_dir, "rebuilding it")
    if manifest is not None and all(isinstance(i, dict) for i in manifest["invocations"]):
        return manifest
    fresh: dict[str, Any] = {"trajkit_version": version, "run_name": run_name, "invocations": []}
    if path.exists():
        log.warning(
            "%s: kept as %s.damaged; the spend and history of earlier invocations are not known",
            path,
            MANIFEST_FILE,
        )
        try:
            os.replace(path, run_dir / f"{MANIFEST_FILE}.damaged")
        except OSError as exc:
            raise RunIOError(path, exc) from None
        fresh["rebuilt"] = _now()
    return fresh


def write_manifest(run_dir: Path, manifest: dict[str, Any]) -> None:
    write_json_atomic(run_dir / MANIFEST_FILE, manifest)


def spend_path(run_dir: Path, run_id: str) -> Path:
    return run_dir / SPEND_DIR / f"{run_id}.jsonl"


def read_spend(run_dir: Path) -> dict[str, dict[str, float]]:
    """Run id -> what that invocation's model answers cost: the last whole line of its spend file."""
    found: dict[str, dict[str, float]] = {}
    directory = run_dir / SPEND_DIR
    try:
        paths = sorted(directory.iterdir()) if directory.is_dir() else []
    except OSError as exc:
        raise RunIOError(directory, exc) from None
    for path in paths:
        if path.suffix == ".jsonl" and not path.name.startswith("."):
            last = _last_spend_line(path)
            if last is not None:
                found[path.stem] = last
    return found


_TAIL = 64 * 1024


def _last_spend_line(path: Path) -> dict[str, float] | None:
    """The last whole line of a spend file (one cut short by a kill is passed over)."""
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - _TAIL))
            lines = handle.read().split(b"\n")[:-1]  # what follows the last newline is no whole line
            if size > _TAIL:
                lines = lines[1:]  # the first may start mid-line
    except OSError as exc:
        raise RunIOError(path, exc) from None
    for raw in reversed(lines):
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        if isinstance(entry, dict) and all(isinstance(entry.get(k), int | float) for k in SPEND_KEYS):
            return {k: entry[k] for k in SPEND_KEYS}
    return None


def spent(run_dir: Path, invocations: list[dict[str, Any]]) -> dict[str, float]:
    """What every invocation of the run sent and paid for: each one's spend file (to its last
    answer, killed invocations included), else what ``run.json`` says it spent (invocations made
    before spend files, served sessions); a spend file whose invocation ``run.json`` lost counts too."""
    files = read_spend(run_dir)
    entries = list(files.values())
    for invocation in invocations:
        client = invocation.get("model_client")
        if invocation.get("run_id") not in files and isinstance(client, dict):
            entries.append(client)
    return spend_total(entries)


def spend_total(entries: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    total = dict.fromkeys(SPEND_KEYS, 0.0)
    for entry in entries:
        for key in SPEND_KEYS:
            value = entry.get(key)
            if isinstance(value, int | float):
                total[key] += value
    return {k: (round(v, 6) if k == "cost" else int(v)) for k, v in total.items()}


def summed(entries: list[dict[str, Any]]) -> dict[str, float]:
    """Every numeric counter of the entries, summed."""
    total: dict[str, float] = {}
    for entry in entries:
        for key, value in entry.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                total[key] = total.get(key, 0) + value
    return {k: round(v, 6) for k, v in sorted(total.items())}


# -- statistics.json and checkpoint.json -----------------------------------------------------------


def read_statistics(run_dir: Path) -> dict[str, Any] | None:
    """The last merge's statistics; None (with a warning when damaged) if there are none."""
    return read_json_object(
        run_dir / STATISTICS_FILE,
        {"dataset_rows": int, "done": int, "pending": int},
        "the next merge (trajkit run --resume) rebuilds it from the ledger",
    )


def write_statistics(run_dir: Path, statistics: dict[str, Any]) -> None:
    write_json_atomic(run_dir / STATISTICS_FILE, statistics)


def write_checkpoint(run_dir: Path, checkpoint: dict[str, Any]) -> None:
    """``checkpoint.json``: where the run stood at the end of its last merge, for people and scripts.
    Resume never reads it (the ledger is the truth), so a damaged one costs nothing."""
    write_json_atomic(run_dir / CHECKPOINT_FILE, checkpoint)


class Manifest:
    """``run.json`` as the invocation holding the lock keeps it: read once, written whole each time
    it changes (the configuration, and each invocation's entry as it goes)."""

    def __init__(self, run_dir: Path, run_name: str, version: str) -> None:
        self.run_dir = run_dir
        self.data = read_manifest(run_dir, run_name, version)

    @property
    def invocations(self) -> list[dict[str, Any]]:
        invocations: list[dict[str, Any]] = self.data["invocations"]
        return invocations

    def start(
        self,
        config: dict[str, Any],
        plugins: dict[str, str],
        entry: dict[str, Any],
        changes: Mapping[str, list[Any]],
    ) -> None:
        """Record a new invocation, the settings it runs with (the run's settings from now on) and
        the output-shaping ``changes`` it makes to them (:mod:`trajkit.run.settings`)."""
        self.data["config"] = config
        self.data["plugins"] = plugins
        self.invocations.append({**entry, "config_changes": dict(changes)})
        self.save()

    def update(self, **fields: Any) -> None:
        """Update the running invocation's entry and write the manifest."""
        self.invocations[-1].update(fields)
        self.save()

    def save(self) -> None:
        write_manifest(self.run_dir, self.data)


class ManifestKeeper:
    """Writes the running invocation's entry (``fields()``: progress, what it has spent) into
    ``run.json`` every ``interval`` seconds, so that a killed invocation's spend is known. The write
    runs on a thread (it fsyncs); :meth:`stop` waits for it, so run.json never has two writers."""

    def __init__(
        self, manifest: Manifest, fields: Callable[[], dict[str, Any]], interval: float = ACCOUNTS_INTERVAL
    ) -> None:
        self.manifest = manifest
        self.fields = fields
        self.interval = interval
        self.stopping = asyncio.Event()
        self.task = asyncio.create_task(self._keep())

    async def _keep(self) -> None:
        while not self.stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), self.interval)
            if self.stopping.is_set():
                return
            self.manifest.invocations[-1].update(updated=_now(), **self.fields())
            text = json_text(self.manifest.data)  # here: the loop thread owns the manifest
            try:
                await asyncio.to_thread(write_atomic, self.manifest.run_dir / MANIFEST_FILE, text)
            except RunIOError as exc:
                log.warning("%s (the spend so far is not saved)", exc)

    async def stop(self) -> None:
        self.stopping.set()
        await self.task
