"""Finding and killing an unconfined local sandbox's processes by the marker in their environment.

Without bubblewrap there is no PID namespace to tear down: a command can leave its process group
with ``setsid`` and outlive its sandbox, or the runner (``kill -9``). Every such command carries
``MARKER=<sandbox>`` in its environment, which its descendants inherit; after each command, at the
sandbox's end and in the reaper, the processes carrying it are killed. A process that empties its
own environment escapes this: that is what the explicit ``isolation=none`` opt-out accepts.
"""

from __future__ import annotations

import contextlib
import os
import signal

PASSES = 5
"""Scans per kill: a process may fork between the scan that finds it and the kill."""


def marked(name: str, value: str) -> list[int]:
    """Pids of this user's processes whose environment holds ``name=value`` or ``name=value/...``."""
    needle = f"{name}={value}".encode()
    below = needle + b"/"
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                environ = handle.read()
        except OSError:  # gone, or another user's
            continue
        if any(item == needle or item.startswith(below) for item in environ.split(b"\0")):
            found.append(int(entry))
    return found


def kill_marked(name: str, value: str) -> int:
    """SIGKILL every process carrying ``name=value`` (or a value below it); how many were killed."""
    killed = 0
    for _ in range(PASSES):
        pids = [pid for pid in marked(name, value) if pid != os.getpid()]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
    return killed
