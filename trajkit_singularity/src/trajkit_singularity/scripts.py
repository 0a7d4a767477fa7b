"""Shell programs run inside an instance, and the host-side watchdog.

The in-container programs live in this package's ``programs/`` directory, each saying at its top
what it takes and does; they are written once into a content-addressed host directory and bound
read-only into every instance at :data:`MOUNT`, so a ``ps`` inside shows ``/bin/sh /.trajkit/launch
COMMAND`` rather than pages of script. Every value (the command, a path, a marker) reaches them as an
argv element, never spliced into script text, so no quoting of untrusted strings is ever needed. They
use only POSIX sh and what BusyBox has (grep, kill, cat, mkdir), so any image with a shell runs them.

How an exec's processes are found again: the launcher starts with ``TRAJKIT_EXEC_ID=<random marker>``
in its environment and runs the command under ``setsid``. Every descendant inherits the marker in its
initial environment (``/proc/PID/environ``), and the command leads its own session. The sweep kills whatever
carries the marker and whatever sits in a session one of them leads, so a child that clears its
environment is still found, and so is one that starts its own session; and it kills every orphan (a
process descending from the instance's init rather than from an exec), so one that does both is
found too. Instances therefore run no service of their own beside the execs.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from trajkit.sandbox.shell import script

if TYPE_CHECKING:
    from trajkit_singularity.users import Switch

MOUNT = "/.trajkit"
MARKER_VARIABLE = "TRAJKIT_EXEC_ID"

READER_MISSING = 2
READER_IS_DIRECTORY = 21
READER_NOT_REGULAR = 22

WATCHDOG = 'sleep "$1"; "$2" instance stop --force "$3"; rm -rf -- "$4"'
"""Host side, argv: SECONDS BINARY INSTANCE DIRECTORY. Stops the instance and removes its directory
once the sandbox's lifetime is over, whether or not trajkit still runs."""


# Denied to every process of an instance when trajkit runs as root: making namespaces (a user
# namespace gives back, inside it, every capability the sandbox dropped; the rest need one) and
# entering another's. clone3 takes its flags in memory that a filter cannot read, so it stays
# allowed: glibc starts threads with it, and Apptainer's own runtime inside the container too.
CLONE_NEWUSER = 0x10000000
SECCOMP_FILE = "seccomp.json"


def seccomp_profile() -> str:
    """The seccomp filter (Apptainer's JSON profile) that :data:`SECCOMP_FILE` holds."""
    denied_clone = {"index": 0, "value": CLONE_NEWUSER, "valueTwo": CLONE_NEWUSER, "op": "SCMP_CMP_MASKED_EQ"}
    syscalls = [
        {"names": ["unshare", "setns"], "action": "SCMP_ACT_ERRNO"},
        {"names": ["clone"], "action": "SCMP_ACT_ERRNO", "args": [denied_clone]},
    ]
    return json.dumps({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": syscalls}, indent=1)


def text(name: str) -> str:
    """The text of ``programs/NAME.sh``."""
    return resources.files("trajkit_singularity").joinpath("programs", f"{name}.sh").read_text()


def sweep() -> str:
    """The functions the launch and kill programs start with: trajkit's ``marked`` (the exec's
    marker, found with builtins alone), then ``programs/sweep.sh``."""
    return script("trajkit.sandbox", "marked.sh") + "\n" + text("sweep")


@functools.cache
def programs() -> dict[str, str]:
    """File name -> text of everything :func:`install` writes. ``launch`` and ``kill`` start with
    :func:`sweep`'s functions: one file each, so an exec reads one script."""
    functions = sweep()
    own = {name: text(name) for name in ("read", "write", "enter", "probe")}
    return {
        "launch": functions + text("launch"),
        "kill": functions + text("kill"),
        **own,
        SECCOMP_FILE: seccomp_profile(),
    }


def program(name: str, switch: Switch | None = None) -> list[str]:
    """The argv prefix that runs program ``name`` inside an instance, as the sandbox's user: entered
    through ``switch`` (see :mod:`trajkit_singularity.users`), or directly without one."""
    command = ["/bin/sh", f"{MOUNT}/{name}"]
    if switch is None:
        return command
    return ["/bin/sh", f"{MOUNT}/enter", *switch.argv(command)]


def install(cache_dir: Path) -> Path:
    """Write the in-container programs under ``cache_dir`` (once per version) and return their directory.

    Blocking: call it in a worker thread.
    """
    version = hashlib.sha256(repr(sorted(programs().items())).encode()).hexdigest()[:12]
    directory = cache_dir / f"programs-{version}"
    if directory.is_dir():
        return directory
    partial = cache_dir / f".programs-{version}.{os.getpid()}.partial"
    partial.mkdir(parents=True, exist_ok=True)
    for name, content in programs().items():
        (partial / name).write_text(content)
    try:
        partial.rename(directory)
    except OSError:  # another process installed the same version first
        for child in partial.iterdir():
            child.unlink()
        partial.rmdir()
    return directory
