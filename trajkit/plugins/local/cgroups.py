"""Per-sandbox process and memory limits for the local backend, through the kernel's cgroups.

Each sandbox that runs a command gets a cgroup of its own below this process's, in every hierarchy
that controls pids or memory (cgroup v1 has one per controller, v2 one for all), with ``pids.max``
and the memory limit written once. Making and removing a memory cgroup costs the kernel a
millisecond or more, so a sandbox's cgroups are taken from a pool (:meth:`Cgroups.acquire`) and,
once empty again, given back for the next sandbox (:meth:`Cgroups.release`). Each command joins its sandbox's cgroup before it starts anything (a
``/bin/sh`` prefix writes its own pid, then ``exec``s the command), so a fork bomb meets its
sandbox's limit, not the machine's, and every process of the sandbox can be found and killed
however it left its process group. Where no cgroup can be made (no write access, v2 without
delegated controllers), :func:`detect` says why and sandboxes run without limits.
"""

from __future__ import annotations

import contextlib
import os
import signal

CGROUP_ROOT = "/sys/fs/cgroup"
KILL_PASSES = 20


class Cgroups:
    """The parent cgroup directories of this runner's sandboxes, one per hierarchy, and the limits."""

    def __init__(self, parents: dict[str, str], *, max_processes: int, memory: int, v2: bool) -> None:
        self.parents = parents
        """Controller ("pids", "memory", or "unified") -> this runner's own directory of sandbox cgroups."""
        self.max_processes = max_processes
        self.memory = memory
        self.v2 = v2
        self.free: list[str] = []
        """Names of made, empty sandbox cgroups to hand out again."""
        self.made = 0

    def acquire(self) -> tuple[str, list[str]]:
        """A sandbox cgroup (its name and the ``cgroup.procs`` files to join): an empty one from the
        pool, else a new one. Safe to call from a worker thread."""
        try:
            name = self.free.pop()
        except IndexError:
            self.made += 1
            name = f"s{self.made}"
            return name, self.create(name)
        return name, self.joins(name)

    def joins(self, name: str) -> list[str]:
        """The ``cgroup.procs`` files a process writes its pid to, to join the cgroups ``name``."""
        return [os.path.join(parent, name, "cgroup.procs") for parent in self.parents.values()]

    def release(self, name: str) -> None:
        """Kill whatever is left in the sandbox cgroup ``name`` and its children, and pool it."""
        for parent in self.parents.values():
            path = os.path.join(parent, name)
            with contextlib.suppress(OSError):
                for child in os.scandir(path):
                    if child.is_dir(follow_symlinks=False):
                        remove(child.path)
            kill_all(path)
        self.free.append(name)

    def create(self, name: str, *, limits: bool = True) -> list[str]:
        """Make the cgroups ``name`` (a sandbox, or ``sandbox/command`` below one, which its
        sandbox's limits already bound); the ``cgroup.procs`` files to join."""
        for controller, parent in self.parents.items():
            path = os.path.join(parent, name)
            os.makedirs(path, exist_ok=True)
            for limit_file, value in self._limits(controller) if limits else ():
                with open(os.path.join(path, limit_file), "w") as handle:
                    handle.write(str(value))
        return self.joins(name)

    def _limits(self, controller: str) -> list[tuple[str, int | str]]:
        if self.v2:
            return [("pids.max", self.max_processes), ("memory.max", self.memory), ("memory.swap.max", 0)]
        if controller == "pids":
            return [("pids.max", self.max_processes)]
        return [("memory.limit_in_bytes", self.memory)]

    def kill(self, name: str) -> None:
        """SIGKILL every process of the cgroups ``name``, however they left their process group."""
        for parent in self.parents.values():
            kill_all(os.path.join(parent, name))

    def empty(self, name: str) -> bool:
        """True if no process is left in the cgroups ``name`` (killed ones leave as they exit)."""
        return not any(_pids(os.path.join(parent, name)) for parent in self.parents.values())

    def close(self) -> None:
        """Remove this runner's directories of sandbox cgroups, and whatever is still in them."""
        for parent in self.parents.values():
            remove(parent)


def wrap(argv: list[str], joins: list[str]) -> list[str]:
    """``argv`` started by a /bin/sh that first moves itself into each cgroup of ``joins``."""
    script = "".join(f'echo $$ > "${i}" && ' for i in range(1, len(joins) + 1))
    return ["/bin/sh", "-c", f'{script}shift {len(joins)} && exec "$@"', "trajkit-cgroup", *joins, *argv]


def remove(path: str) -> None:
    """Kill the processes of the cgroup ``path`` (and of its children), then remove it."""
    try:
        os.rmdir(path)  # usually empty already (a sandbox's PID namespace ended with its processes)
        return
    except FileNotFoundError:
        return
    except OSError:
        pass
    with contextlib.suppress(OSError):
        for child in os.scandir(path):
            if child.is_dir(follow_symlinks=False):
                remove(child.path)
    kill_all(path)
    with contextlib.suppress(OSError):  # busy for a moment while the killed exit; the reaper retries
        os.rmdir(path)


def kill_all(path: str) -> None:
    """SIGKILL the processes of the cgroup ``path``, again while new ones appear (a forking loop)."""
    for _ in range(KILL_PASSES):
        pids = _pids(path)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _pids(path: str) -> list[int]:
    try:
        with open(os.path.join(path, "cgroup.procs")) as handle:
            return [int(line) for line in handle if line.strip()]
    except OSError:
        return []


def detect(owner: str, *, max_processes: int, memory: int) -> Cgroups | str:
    """This runner's sandbox cgroups (made now, named ``owner``), or why there can be none here."""
    own = _own_cgroups()
    if "" in own and os.path.exists(os.path.join(CGROUP_ROOT, "cgroup.controllers")):
        base = os.path.join(CGROUP_ROOT, own[""].lstrip("/"))
        return _v2(base, owner, max_processes=max_processes, memory=memory)
    parents: dict[str, str] = {}
    for controller in ("pids", "memory"):
        hierarchy = os.path.join(CGROUP_ROOT, controller)
        if controller not in own or not os.path.isdir(hierarchy):
            return f"no cgroup v1 {controller} hierarchy at {hierarchy}"
        parent = os.path.join(hierarchy, own[controller].lstrip("/"), owner)
        try:
            os.makedirs(parent, exist_ok=True)
        except OSError as exc:
            return f"cannot create {parent}: {exc.strerror}"
        parents[controller] = parent
    return Cgroups(parents, max_processes=max_processes, memory=memory, v2=False)


def _v2(base: str, owner: str, *, max_processes: int, memory: int) -> Cgroups | str:
    try:
        with open(os.path.join(base, "cgroup.subtree_control")) as handle:
            enabled = set(handle.read().split())
    except OSError as exc:
        return f"cannot read {base}/cgroup.subtree_control: {exc.strerror}"
    if not {"pids", "memory"} <= enabled:
        return f"the pids and memory controllers are not delegated to {base}"
    parent = os.path.join(base, owner)
    try:
        os.makedirs(parent, exist_ok=True)
        with open(os.path.join(parent, "cgroup.subtree_control"), "w") as handle:
            handle.write("+pids +memory")
    except OSError as exc:
        return f"cannot create sandbox cgroups under {base}: {exc.strerror}"
    return Cgroups({"unified": parent}, max_processes=max_processes, memory=memory, v2=True)


def _own_cgroups() -> dict[str, str]:
    """Controller -> this process's cgroup path; "" for the v2 hierarchy."""
    own = {}
    with contextlib.suppress(OSError), open("/proc/self/cgroup") as handle:
        for line in handle:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                own[controller] = path
    return own


def reap_abandoned(prefix: str) -> int:
    """Remove the sandbox cgroups of processes that no longer run (``PREFIX<pid>-<token>`` directories)."""
    removed = 0
    for controller, path in _own_cgroups().items():
        hierarchy = CGROUP_ROOT if controller == "" else os.path.join(CGROUP_ROOT, controller)
        with contextlib.suppress(OSError):
            for entry in os.scandir(os.path.join(hierarchy, path.lstrip("/"))):
                pid = entry.name.removeprefix(prefix).partition("-")[0]
                if entry.name.startswith(prefix) and pid.isdigit() and not alive(int(pid)):
                    remove(entry.path)
                    removed += 1
    return removed


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
