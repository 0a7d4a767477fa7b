"""The local sandbox: a fresh directory per prompt, isolated by bubblewrap wherever it can be.

Settings (``--sandbox_option local.KEY=VALUE``, ``[sandbox_options.local]``): see
:class:`LocalSettings`. By default a session's commands run in one bubblewrap sandbox of its own
(see :mod:`trajkit.plugins.local.bubblewrap`: an unprivileged user with no capability, only the system
directories read-only, a private /tmp, no network, its own PID namespace), started by its first
command and kept until the session ends, with a supervisor inside that starts every command
(:mod:`trajkit.plugins.local.supervisor`). Where bubblewrap cannot work the run says once that
commands run unconfined; ``isolation=none`` is the explicit opt-out.

Whatever the isolation, the file tools reach only the prompt's working directory, through
:class:`trajkit.sandbox.confined.Beneath`: no symlink or ``..`` out of it, regular files only, reads capped.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import math
import os
import re
import secrets
import shutil
import socket
import stat
import tempfile
import time
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field

from trajkit import hookimpl
from trajkit.config.settings import StrictSettings
from trajkit.plugins.local import bubblewrap
from trajkit.plugins.local import cgroups as local_cgroups
from trajkit.plugins.local.bubblewrap import Confinement, HostUser
from trajkit.plugins.local.processes import kill_marked
from trajkit.plugins.local.run import MARKER, LocalSandbox, find_shell
from trajkit.sandbox import (
    DEFAULT_CWD,
    ByteSize,
    Sandbox,
    SandboxBackend,
    SandboxError,
    SandboxSpec,
    lowered,
    owner_gone,
)

log = logging.getLogger(__name__)


@functools.cache
def this_host() -> str:
    """This host in a sandbox directory's name: a reaper on another host sharing the root (a
    network file system) leaves its sandboxes alone until their deadline."""
    return f"{zlib.crc32(socket.gethostname().encode()):08x}"


CGROUP_PREFIX = "trajkit-"
"""A backend's sandbox cgroups live in a directory named CGROUP_PREFIX + its process's pid + a token
of its own: several backends of one process (a library user's, a test's) never share one."""
SANDBOX_NAME = re.compile(
    r"^.+\.(?P<host>[0-9a-f]{8})-(?P<pid>[0-9]+)-(?P<deadline>[0-9]+)-[a-z0-9_]{8}(\.tmp)?$"
)
"""A sandbox's working directory is named ``RUN_ID.HOST-PID-DEADLINE-XXXXXXXX``: its owner (a hash
of the host's name, the process id), when its lifetime ends (Unix seconds) and
:func:`tempfile.mkdtemp`'s eight characters. A reaper reads all it needs from the name, so nothing
but the prompt's files is made on disk, where every inode costs the kernel up to a millisecond on a
busy ext4 (``bench.sandbox_dirs``). ``NAME.tmp`` beside it is an unconfined sandbox's ``TMPDIR``."""
EARLIER_NAME = re.compile(r"^.+\.[a-z0-9_]{8}$")
"""A sandbox directory of the earlier layout: an owner file beside the working directory ``w``."""
EARLIER_OWNER_FILE = "owner.json"
EARLIER_GRACE = 600.0
"""Seconds a directory of the earlier layout without a readable owner file is left alone."""
ACCOUNTS_DIR = ".accounts"
"""In the sandbox root: the ``passwd`` and ``group`` files bound into every sandbox."""
NOBODY = 65534
CONTROL_PARENT = "/dev/shm"
"""Where isolated sandboxes' control directories (a FIFO or two and a request file per command) live
when it can hold them: on a memory file system they cost a fraction of what they do on a disk's."""
CONTROL_PREFIX = "trajkit-control-"
"""A backend's control directories are in one directory named CONTROL_PREFIX + its process's pid +
a token of its own, removed with the backend, or by a later reaper once that process is gone."""


@hookimpl
def trajkit_sandbox_backends() -> list[type[SandboxBackend]]:
    return [LocalBackend]


def _paths(value: object) -> object:
    """A comma-separated text (from a flag) as a list of paths; other values pass through."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class LocalSettings(StrictSettings):
    """The local backend's settings; safe by default (bubblewrap where it works, no network)."""

    isolation: Annotated[Literal["auto", "bwrap", "none"], BeforeValidator(lowered)] = Field(
        "auto",
        description="auto: every session's commands in a bubblewrap sandbox when it works here "
        "(unprivileged user, no capability, read-only system directories, private /tmp, no network, "
        "own PID namespace), else the run says once that commands run unconfined; bwrap: insist on "
        "bubblewrap; none: the explicit opt-out, commands run as ordinary processes of this user",
    )
    network: Annotated[Literal["none", "host"], BeforeValidator(lowered)] = Field(
        "none", description="none: isolated commands have no network; host: they share the host's"
    )
    shell: str | None = Field(
        None,
        description="the shell running commands (a path or a name on PATH); bash, else /bin/sh, when "
        "unset. Isolated sessions run bash's commands in their supervisor without starting a program; "
        "any other shell is started for every command",
    )
    root: str | None = Field(
        None,
        description="where the prompts' directories live; unset: a private directory of this user's "
        "in the temporary directory",
    )
    max_processes: int = Field(
        1024, gt=0, description="processes a sandbox may hold at once (through a cgroup of its own)"
    )
    memory: ByteSize = Field(
        4 * 1024**3,
        gt=0,
        description="bytes of memory a sandbox may use (through a cgroup of its own), e.g. 512M or "
        "4G (the default)",
    )
    sandbox_uid: int = Field(
        NOBODY,
        gt=0,
        description="when trajkit runs as root: the unprivileged host user (and group) an isolated "
        "sandbox's processes are, and who owns its working directory",
    )
    read_only: Annotated[list[str], BeforeValidator(_paths)] = Field(
        [],
        description="host directories isolated sandboxes also see, read-only, besides /usr, /etc "
        "and the /bin, /sbin and /lib* links (comma-separated absolute paths, e.g. /opt/conda)",
    )


class LocalBackend(SandboxBackend):
    name = "local"
    description = "directory per prompt, in bubblewrap where installed; isolation=none opts out"
    Settings = LocalSettings
    settings: LocalSettings

    def __init__(self, settings: LocalSettings | Mapping[str, object] | None = None) -> None:
        super().__init__(settings)
        for path in self.settings.read_only:
            if not path.startswith("/"):
                raise SandboxError(f"local sandbox: read_only needs absolute paths, not {path!r}")
        self.root_text = self.settings.root or os.path.join(
            tempfile.gettempdir(), f"trajkit-sandboxes-{os.getuid()}"
        )
        self.root = Path(self.root_text)
        self.shell = find_shell(self.settings.shell or "")
        self.host_user = (
            HostUser(self.settings.sandbox_uid, self.settings.sandbox_uid) if os.geteuid() == 0 else None
        )
        self.isolated = _isolation(self.settings.isolation, self.host_user)
        if self.isolated and self.host_user is not None:
            blocked = _blocked_ancestor(os.path.abspath(self.root_text), self.host_user)
            if blocked:
                raise SandboxError(
                    f"local sandbox: {self.root_text} is out of its sandboxes' reach: they run as "
                    f"uid {self.host_user.uid}, which {blocked} does not let through. Set local.root "
                    "below directories that let others pass (the default, in the temporary "
                    f"directory, does), or let them pass: chmod o+x {blocked}"
                )
        self.confinement: Confinement | None = None
        self.root_ready = False
        self.control_root = ""
        self.cgroup_owner = f"{CGROUP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        self._cgroups: local_cgroups.Cgroups | str | None = None

    @property
    def cgroups(self) -> local_cgroups.Cgroups | None:
        """This backend's sandbox cgroups, made when the first sandbox runs a command."""
        if self._cgroups is None:
            self._cgroups = local_cgroups.detect(
                self.cgroup_owner, max_processes=self.settings.max_processes, memory=self.settings.memory
            )
            if isinstance(self._cgroups, str):
                log.warning("local sandbox: no per-sandbox process or memory limit here: %s", self._cgroups)
        return self._cgroups if isinstance(self._cgroups, local_cgroups.Cgroups) else None

    def _prepare_root(self) -> None:
        _private_root(self.root_text, traversable=self.isolated and self.host_user is not None)
        if self.isolated:
            accounts = os.path.join(self.root_text, ACCOUNTS_DIR)
            os.makedirs(accounts, mode=0o755, exist_ok=True)
            os.chmod(accounts, 0o755)
            self.control_root = _control_root(self.root_text, traversable=self.host_user is not None)
            self.confinement = Confinement(
                self.root_text,
                control_root=self.control_root,
                network=self.settings.network == "host",
                read_only=self.settings.read_only,
                host_user=self.host_user,
                account_files=bubblewrap.write_account_files(accounts),
            )
        self.root_ready = True

    async def create(self, spec: SandboxSpec) -> Sandbox:
        cwd = os.path.normpath(spec.cwd or DEFAULT_CWD)
        if not cwd.startswith("/"):
            cwd = os.path.normpath(f"{DEFAULT_CWD}/{cwd}")
        if not self.root_ready:
            self._prepare_root()
        if self.confinement is not None:
            problem = self.confinement.check_cwd(cwd)
            if problem:
                raise SandboxError(f"local sandbox: {problem}")
        # Its directory is made in a worker thread: on a busy disk, making a directory blocks for
        # a millisecond or more, which the loop every session shares must not wait.
        made = asyncio.ensure_future(asyncio.to_thread(self._make, spec.run_id, time.time() + spec.lifetime))
        try:
            workdir = await asyncio.shield(made)
        except asyncio.CancelledError:  # the directory is still made: removed, not left behind
            made.add_done_callback(_discard)
            raise
        return LocalSandbox(self, workdir, cwd)

    def _make(self, run_id: str, deadline: float) -> str:
        """A sandbox's working directory, named after its owner and deadline (see :data:`SANDBOX_NAME`)."""
        # Plain strings and os calls: at a thousand sessions in flight, pathlib's objects cost more
        # CPU than the system calls they wrap.
        prefix = f"{run_id}.{this_host()}-{os.getpid()}-{math.ceil(deadline)}-"
        workdir = tempfile.mkdtemp(prefix=prefix, dir=self.root_text)
        if self.isolated:
            bubblewrap.hand_over(workdir, self.host_user)
        return workdir

    def control_dir(self, name: str) -> str:
        """The control directory of the sandbox ``name`` (made if missing), for its supervisor."""
        path = os.path.join(self.control_root, name)
        if not os.path.isdir(path):
            os.mkdir(path, 0o700)
            bubblewrap.hand_over(path, self.host_user)
        return path

    async def reap(self, run_id: str | None = None) -> int:
        if run_id is None:
            await asyncio.to_thread(local_cgroups.reap_abandoned, CGROUP_PREFIX)
            await asyncio.to_thread(_reap_control_roots, (CONTROL_PARENT, self.root_text))
        if not self.root.is_dir():
            return 0
        removed = 0
        for base in self.root.iterdir():
            if base.name == ACCOUNTS_DIR:
                continue
            if run_id is not None and not base.name.startswith(f"{run_id}."):
                continue
            if run_id is None and not _abandoned(base):
                continue
            await asyncio.to_thread(kill_marked, MARKER, base.name)
            await asyncio.to_thread(shutil.rmtree, base, True)
            removed += 1
        return removed

    async def aclose(self) -> None:
        if isinstance(self._cgroups, local_cgroups.Cgroups):
            await asyncio.to_thread(self._cgroups.close)
        if self.control_root:
            await asyncio.to_thread(shutil.rmtree, self.control_root, True)


def _discard(made: asyncio.Future[str]) -> None:
    """Remove the directory of a sandbox whose creation was cancelled."""
    if not made.cancelled() and made.exception() is None:
        shutil.rmtree(made.result(), True)


def _isolation(wanted: str, host_user: HostUser | None) -> bool:
    if wanted == "none":
        return False
    problem = bubblewrap.works(host_user)
    if problem is None:
        return True
    if wanted == "bwrap":
        raise SandboxError(f"local sandbox: isolation=bwrap, but {problem}")
    log.warning(
        "local sandbox: commands run UNCONFINED, with this user's access to the machine: %s. "
        "Install bubblewrap to isolate them, or pass --sandbox_option local.isolation=none to say "
        "this is intended.",
        problem,
    )
    return False


def _private_root(root: str, *, traversable: bool) -> None:
    """Create the sandbox root, for this user alone (``traversable``: others may pass through it
    to a directory whose name they know, as the sandboxes' own host user must), and refuse one
    that someone else owns."""
    mode = 0o711 if traversable else 0o700
    os.makedirs(root, mode=mode, exist_ok=True)
    info = os.lstat(root)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise SandboxError(f"local sandbox: {root} is not a directory of this user's; set local.root")
    if stat.S_IMODE(info.st_mode) != mode:
        os.chmod(root, mode)


def _control_root(sandbox_root: str, *, traversable: bool) -> str:
    """A new directory of this backend's for its sandboxes' control directories: in
    :data:`CONTROL_PARENT` where it can be made there, else in the sandbox root."""
    prefix = f"{CONTROL_PREFIX}{os.getpid()}-"
    try:
        path = tempfile.mkdtemp(prefix=prefix, dir=CONTROL_PARENT)
    except OSError:
        path = tempfile.mkdtemp(prefix=prefix, dir=sandbox_root)
    if traversable:  # the sandboxes' user reaches its own directory below it, by its name
        os.chmod(path, 0o711)
    return path


def _reap_control_roots(parents: Sequence[str]) -> int:
    """Remove this user's control directories of backends whose process no longer runs."""
    removed = 0
    for parent in parents:
        with contextlib.suppress(OSError), os.scandir(parent) as entries:
            for entry in entries:
                pid = entry.name.removeprefix(CONTROL_PREFIX).partition("-")[0]
                if (
                    not entry.name.startswith(CONTROL_PREFIX)
                    or not pid.isdigit()
                    or local_cgroups.alive(int(pid))
                ):
                    continue
                if (
                    entry.is_dir(follow_symlinks=False)
                    and entry.stat(follow_symlinks=False).st_uid == os.getuid()
                ):
                    shutil.rmtree(entry.path, True)
                    removed += 1
    return removed


def _blocked_ancestor(path: str, user: HostUser) -> str | None:
    """The first existing directory above ``path`` that ``user`` may not pass through, or None."""
    parts = path.strip("/").split("/")
    for depth in range(len(parts)):
        directory = "/" + "/".join(parts[:depth])
        try:
            info = os.stat(directory)
        except FileNotFoundError:
            return None
        if info.st_uid == user.uid:
            allowed = info.st_mode & stat.S_IXUSR
        elif info.st_gid == user.gid:
            allowed = info.st_mode & stat.S_IXGRP
        else:
            allowed = info.st_mode & stat.S_IXOTH
        if not allowed:
            return directory
    return None


def _abandoned(path: Path) -> bool:
    """True if the sandbox directory ``path`` outlived its deadline or its owner process is gone.

    A directory whose name is not a sandbox's is none of ours (a custom root may hold other
    things): never removed.
    """
    named = SANDBOX_NAME.match(path.name)
    if named is None:
        return EARLIER_NAME.match(path.name) is not None and _abandoned_earlier(path)
    if time.time() > int(named["deadline"]):
        return True
    return named["host"] == this_host() and owner_gone(f"{socket.gethostname()}:{named['pid']}")


def _abandoned_earlier(base: Path) -> bool:
    """:func:`_abandoned` for a directory of the earlier layout, by its owner file. One whose file
    cannot be read yet is being made this moment by another process: abandoned only once it has
    stayed so for :data:`EARLIER_GRACE` seconds, as a crash at that moment leaves it."""
    owner_file = base / EARLIER_OWNER_FILE
    try:
        owner = json.loads(owner_file.read_text())
    except (OSError, ValueError):
        try:
            return time.time() - base.stat().st_mtime > EARLIER_GRACE
        except OSError:
            return False  # gone already
    if time.time() > owner.get("deadline", 0):
        return True
    return owner_gone(str(owner.get("owner", "")))
