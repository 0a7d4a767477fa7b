"""Check files: what a row's check reads, put fresh into the sandbox just before the check runs.

A check runs in the sandbox the model worked in, so it reads whatever the model left there: a test
file rewritten to pass, a ``unittest.py`` beside it. A row's ``check_files`` names files or
directories of the dataset's own that are copied into the sandbox after the session, over whatever
is at their place (a directory is removed first, so nothing the model added in it survives), as
SWE-bench applies its test files again before it runs them::

    {"prompt": "...", "check": "python -m unittest -q tests/test_core.py", "check_files": "tests"}
    {"prompt": "...", "check": "pytest -q /checks", "check_files": {"/checks": "suite/task7/checks"}}

- A string or a list of strings: paths relative to the directory that holds the dataset file, each
  copied to the same relative path below the sandbox's working directory.
- An object: sandbox path (relative to the working directory, or absolute) -> dataset path
  (relative to that directory, or absolute on the machine where sessions run).

Each row's check files are checked before any session (a bad row names file, line and what is
wrong): they must exist, be regular files or directories holding only regular files and
directories (no symlink, device or FIFO: nothing leads elsewhere on the host), at most
:data:`MAX_FILE_BYTES` each, :data:`MAX_TOTAL_BYTES` and :data:`MAX_FILES` in all; a sandbox path
may not be the working directory or ``/`` itself, nor climb with ``..``. They are read where the
session runs, when it is scored (on a cluster, at the same path on every node).
"""

from __future__ import annotations

import os
import posixpath
import shlex
import stat
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trajkit.sandbox import DEFAULT_READ_LIMIT, InvalidPath, Sandbox, check_path

FIELD = "check_files"
MAX_FILE_BYTES = DEFAULT_READ_LIMIT
MAX_TOTAL_BYTES = 64 * 1024 * 1024
MAX_FILES = 10_000
INSTALL_TIMEOUT = 120.0
"""Seconds each of the commands that clear the check files' places and set their modes may take."""


@dataclass(frozen=True, slots=True)
class CheckFile:
    """One file or directory of a row's check, where it comes from and where it goes."""

    sandbox_path: str
    """Relative to the sandbox's working directory, or absolute in the sandbox."""
    host_path: str
    """Absolute, on the machine where the session runs."""


class CheckFilesError(OSError):
    """The check files could not be put in place: the row's checks fail, naming why."""


def resolve(value: Any, base: Path | None) -> tuple[CheckFile, ...]:
    """A row's ``check_files`` checked and resolved against ``base`` (the directory holding the
    dataset file, None when it has none); ValueError says what is wrong."""
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        pairs = [(_relative(v), v) for v in value]
    elif isinstance(value, Mapping) and value and all(isinstance(v, str) for v in (*value, *value.values())):
        pairs = list(value.items())
    else:
        raise ValueError(
            f"'{FIELD}' must be a path, a list of paths or an object of sandbox path -> dataset path, "
            f"got {value!r}"
        )
    resolved = tuple(CheckFile(_sandbox_path(to), _host_path(source, base)) for to, source in pairs)
    files = total = 0
    for check_file in resolved:
        for _, size, _ in _walk(Path(check_file.host_path)):
            files, total = files + 1, total + size
    if files > MAX_FILES or total > MAX_TOTAL_BYTES:
        raise ValueError(
            f"'{FIELD}' holds {files} files of {total} bytes; at most {MAX_FILES} files of {MAX_TOTAL_BYTES}"
        )
    return resolved


def _relative(path: str) -> str:
    if path.startswith("/") or ".." in path.split("/"):
        raise ValueError(
            f"'{FIELD}' path {path!r}: a path in a list is relative to the dataset's directory and "
            "lands at the same place below the working directory; map it with an object to put it elsewhere"
        )
    return path


def _sandbox_path(path: str) -> str:
    try:
        check_path(path)
    except InvalidPath as exc:
        raise ValueError(f"'{FIELD}' sandbox path {path[:100]!r}: {exc.strerror}") from None
    normal = posixpath.normpath(path)
    if normal in (".", "/") or ".." in normal.split("/"):
        raise ValueError(
            f"'{FIELD}' sandbox path {path!r} would replace the working directory or climb out of it"
        )
    return normal


def _host_path(path: str, base: Path | None) -> str:
    given = path
    if not os.path.isabs(path):
        if base is None:
            raise ValueError(f"'{FIELD}' path {path!r}: this dataset has no directory, give an absolute path")
        path = str(base / path)
    found = Path(os.path.normpath(path))
    shown = repr(given) if given == str(found) else f"{given!r} ({found})"
    try:
        mode = found.lstat().st_mode
    except OSError as exc:
        raise ValueError(f"'{FIELD}' path {shown}: {(exc.strerror or str(exc)).lower()}") from None
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise ValueError(
            f"'{FIELD}' path {shown} is no regular file or directory (a symlink, device or FIFO)"
        )
    return str(found)


def _walk(root: Path) -> Iterator[tuple[str, int, bool]]:
    """``(relative path, size, executable)`` of each regular file at or below ``root``; ValueError
    for anything else met on the way (a symlink, a device, a FIFO) or a file over the limit."""
    info = root.lstat()
    if stat.S_ISREG(info.st_mode):
        yield "", _checked_size(root, info), bool(info.st_mode & 0o111)
        return
    for directory, subdirectories, names in os.walk(root):
        for name in sorted(subdirectories + names):
            child = Path(directory) / name
            info = child.lstat()
            if stat.S_ISDIR(info.st_mode):
                continue
            if not stat.S_ISREG(info.st_mode):
                raise ValueError(
                    f"'{FIELD}': {child} is no regular file or directory (a symlink, device or FIFO)"
                )
            yield str(child.relative_to(root)), _checked_size(child, info), bool(info.st_mode & 0o111)


def _checked_size(path: Path, info: os.stat_result) -> int:
    if info.st_size > MAX_FILE_BYTES:
        raise ValueError(f"'{FIELD}': {path} is {info.st_size} bytes; at most {MAX_FILE_BYTES} each")
    return info.st_size


async def install(sandbox: Sandbox, files: Sequence[CheckFile]) -> None:
    """Put ``files`` in place in ``sandbox``: whatever is at each place is removed, then the files
    are written through the sandbox's file operations (never a command line), executables made
    so. CheckFilesError when the sandbox refuses; a SandboxError (a broken sandbox) passes."""
    places = " ".join(shlex.quote(f.sandbox_path) for f in files)
    # What the model left may be unreadable to its own user until given back its permissions.
    await _run(
        sandbox, f"chmod -R u+rwX -- {places} 2>/dev/null; rm -rf -- {places}", "clearing their places"
    )
    directories, executables = [], []
    for check_file in files:
        root = Path(check_file.host_path)
        if root.is_dir():
            directories.append(check_file.sandbox_path)
        for relative, _, executable in _walk(root):
            target = (
                posixpath.join(check_file.sandbox_path, relative) if relative else check_file.sandbox_path
            )
            try:
                await sandbox.write_file(
                    target, (root / relative).read_bytes() if relative else root.read_bytes()
                )
            except OSError as exc:
                raise CheckFilesError(f"writing {target}: {exc.strerror or type(exc).__name__}") from exc
            if executable:
                executables.append(target)
    made = [f"mkdir -p -- {' '.join(shlex.quote(d) for d in directories)}"] if directories else []
    if executables:
        made.append(f"chmod +x -- {' '.join(shlex.quote(e) for e in executables)}")
    if made:
        await _run(sandbox, " && ".join(made), "setting their modes")


async def _run(sandbox: Sandbox, command: str, doing: str) -> None:
    result = await sandbox.exec(command, timeout=INSTALL_TIMEOUT, output_cap=4096)
    if result.exit_code != 0 or result.timed_out:
        raise CheckFilesError(f"{doing} failed: {result.stderr.strip()[-300:] or f'exit {result.exit_code}'}")
