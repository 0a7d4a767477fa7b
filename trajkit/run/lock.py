"""The lock of a run directory: one invocation writes it at a time, readers see who.

An exclusive ``flock`` on the run's lock file (:attr:`~trajkit.run.rundir.RunDir.lock_path`), taken
through :meth:`~trajkit.run.rundir.RunDir.lock` and probed by :meth:`~trajkit.run.rundir.RunDir.holder`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trajkit.run.files import RunIOError, timestamp

if TYPE_CHECKING:
    from trajkit.run.rundir import RunDir


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

    def __init__(self, run_dir: RunDir | Path, holder: Holder) -> None:
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
    """A reader probing the lock (:meth:`RunDir.holder`) holds it shared for an instant."""

    def __init__(self, path: Path) -> None:
        self.path = path
        """The lock file (:attr:`RunDir.lock_path`)."""
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
        details = {"pid": os.getpid(), "host": socket.gethostname(), "started": timestamp()}
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


def holder_of(path: Path) -> Holder | None:
    """Who holds the lock file at ``path`` now, or None: a shared lock taken for an instant."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
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
