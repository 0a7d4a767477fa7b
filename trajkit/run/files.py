"""Files written so that a reader never sees half of one, and the error that says which file failed.

What the run directory (:mod:`trajkit.run.rundir`) and the commands that write beside it (export,
compress, report) use for every file they replace.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

log = logging.getLogger("trajkit")


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


@contextlib.contextmanager
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


def _shape_problem(data: Any, required: dict[str, type | tuple[type, ...]]) -> str | None:
    if not isinstance(data, dict):
        return f"expected a JSON object, got {type(data).__name__}"
    for key, kind in required.items():
        if not isinstance(data.get(key), kind):
            return f"field {key!r} is missing or not of the expected type"
    return None


def timestamp() -> str:
    """Now, to the second, as the lock file and run.json note times."""
    return datetime.now(UTC).isoformat(timespec="seconds")
