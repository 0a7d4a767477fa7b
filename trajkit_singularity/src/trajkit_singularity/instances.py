"""Instance names, the state file each sandbox keeps, and deciding which instances are leftovers.

Apptainer instances carry no labels, so a sandbox is recognised in two ways: its instance name starts
with ``trajkit-<run>-<work>-`` (what an operator sees in ``apptainer instance list``), and its
directory under the scratch root holds ``state.json`` saying which run, host and process own it and
when its lifetime ends. The reaper trusts the state file; the name is for people.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from trajkit_singularity import scripts

PREFIX = "trajkit-"
WATCHDOG_TAG = "trajkit-watchdog"
STATE_FILE = "state.json"
_NOT_LABEL = re.compile(r"[^a-z0-9]+")


def slug(text: str, limit: int) -> str:
    """``text`` as a short lowercase label (letters, digits, dashes); never empty."""
    return _NOT_LABEL.sub("-", text.lower()).strip("-")[:limit].strip("-") or "x"


def instance_prefix(run_id: str) -> str:
    """The start of every instance name of ``run_id``."""
    return f"{PREFIX}{slug(run_id, 24)}-"


def instance_name(run_id: str, work_id: str) -> str:
    """A fresh, unique instance name naming the run and the work item."""
    return f"{instance_prefix(run_id)}{slug(work_id, 16)}-{secrets.token_hex(4)}"


def process_start_time(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), or None if there is no such process.

    Recorded beside the pid so that a recycled pid is not taken for the owner still being alive.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


@dataclass(frozen=True)
class InstanceState:
    """What ``state.json`` records about one sandbox."""

    name: str
    run_id: str
    work_id: str
    image: str
    host: str
    pid: int
    pid_start: int | None
    deadline: float
    """Wall-clock time (``time.time()``) after which the sandbox must not exist."""
    watchdog: int | None = None

    @classmethod
    def new(cls, name: str, run_id: str, work_id: str, image: str, lifetime: float) -> InstanceState:
        pid = os.getpid()
        return cls(
            name=name,
            run_id=run_id,
            work_id=work_id,
            image=image,
            host=socket.gethostname(),
            pid=pid,
            pid_start=process_start_time(pid),
            deadline=time.time() + lifetime,
        )

    def with_watchdog(self, pid: int | None) -> InstanceState:
        return replace(self, watchdog=pid)

    def owner_alive(self) -> bool:
        """True unless the owning process is known to be gone (another host's owner counts as alive)."""
        if self.host != socket.gethostname():
            return True
        start = process_start_time(self.pid)
        return start is not None and (self.pid_start is None or start == self.pid_start)

    def is_leftover(self, run_id: str | None, now: float) -> bool:
        """Whether a reaper may remove this sandbox: its run is being reaped, its owner died, or it is
        past its lifetime."""
        return (run_id is not None and self.run_id == run_id) or now > self.deadline or not self.owner_alive()

    def write(self, directory: Path) -> None:
        """Write atomically: a reaper never reads half a file."""
        partial = directory / f".{STATE_FILE}.partial"
        partial.write_text(json.dumps(asdict(self)))
        partial.replace(directory / STATE_FILE)

    @classmethod
    def read(cls, directory: Path) -> InstanceState | None:
        """The state in ``directory``, or None when absent or unreadable."""
        try:
            data = json.loads((directory / STATE_FILE).read_text())
            return cls(**data)
        except (OSError, ValueError, TypeError):
            return None


def start_watchdog(
    seconds: float, binary: str, name: str, directory: Path, env: Mapping[str, str]
) -> subprocess.Popen[bytes]:
    """Start the process that ends sandbox ``name`` after ``seconds`` even if trajkit dies first.

    It leads a session of its own, so neither a crash of trajkit nor a Ctrl-C at its terminal reaches
    it, and its command line names the instance, which is how :func:`kill_watchdog` recognises it.
    ``Popen`` returns once it runs that command line: a close right after a create finds it.
    Blocking (fork and exec): call it in a worker thread.
    """
    return subprocess.Popen(
        ["/bin/sh", "-c", scripts.WATCHDOG, WATCHDOG_TAG, str(max(1, math.ceil(seconds))), binary, name,
         str(directory)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(env),
        start_new_session=True,
    )  # fmt: skip


def stop_watchdog(process: subprocess.Popen[bytes]) -> None:
    """Kill a watchdog this process started, with its ``sleep``, and reap it. Blocking."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)


def kill_watchdog(pid: int | None, name: str) -> None:
    """Kill the watchdog session ``pid`` (started by another process) if it still watches ``name``."""
    if pid is None:
        return
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return
    if WATCHDOG_TAG.encode() in cmdline and name.encode() in cmdline:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
