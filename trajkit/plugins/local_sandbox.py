"""The local sandbox: a fresh directory per prompt, isolated by bubblewrap wherever it can be.

Settings (``--sandbox_option local.KEY=VALUE``, ``[sandbox_options.local]``): see
:class:`LocalSettings`. By default every command runs in bubblewrap when it works here (see
:mod:`trajkit.plugins.bubblewrap`: read-only host, private /tmp, no network, own PID namespace, no
host sockets), and otherwise the run says once that commands run unconfined; ``isolation=none`` is
the explicit opt-out.

Whatever the isolation, the file tools reach only the prompt's working directory, through
:class:`trajkit.confined.Beneath`: no symlink or ``..`` out of it, regular files only, reads capped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import secrets
import shutil
import stat
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field

from trajkit import hookimpl
from trajkit.confined import Beneath
from trajkit.fileio import in_file_thread
from trajkit.plugins import bubblewrap, local_cgroups
from trajkit.plugins.local_command import Command
from trajkit.plugins.local_processes import kill_marked
from trajkit.sandbox import (
    DEFAULT_CWD,
    DEFAULT_OUTPUT_CAP,
    DEFAULT_READ_LIMIT,
    ByteSize,
    ExecResult,
    Sandbox,
    SandboxBackend,
    SandboxError,
    SandboxInfo,
    SandboxSpec,
    lowered,
    owner_gone,
    owner_tag,
)
from trajkit.settings import StrictSettings

log = logging.getLogger(__name__)

CGROUP_PREFIX = "trajkit-"
"""A backend's sandbox cgroups live in a directory named CGROUP_PREFIX + its process's pid + a token
of its own: several backends of one process (a library user's, a test's) never share one."""
OWNER_FILE = "owner.json"
OWNER_GRACE = 600.0
"""Seconds a sandbox directory without a readable owner file is left alone by the reaper."""
MARKER = "TRAJKIT_SANDBOX"
"""Set in every unconfined command's environment, so its processes can be found and killed."""
INLINE_IO = 256 * 1024
"""Files up to this size are read and written on the event loop; larger ones in a worker thread."""
INLINE_REMOVE = 32
"""A sandbox that ran no command and got at most this many files is removed on the event loop."""
BASE_ENV = {"LC_CTYPE": "C.UTF-8", "TERM": "dumb"}
"""UTF-8 through LC_CTYPE alone: C.UTF-8's other categories are C's, and LANG or LC_ALL would make
every shell start load all of the locale's files, about a tenth of what a ``bash -c`` costs."""


@hookimpl
def trajkit_sandbox_backends() -> list[type[SandboxBackend]]:
    return [LocalBackend]


class LocalSettings(StrictSettings):
    """The local backend's settings; safe by default (bubblewrap where it works, no network)."""

    isolation: Annotated[Literal["auto", "bwrap", "none"], BeforeValidator(lowered)] = Field(
        "auto",
        description="auto: every command in bubblewrap when it works here (read-only host, private "
        "/tmp, no network, own PID namespace), else the run says once that commands run unconfined; "
        "bwrap: insist on bubblewrap; none: the explicit opt-out, commands run as ordinary processes "
        "of this user",
    )
    network: Annotated[Literal["none", "host"], BeforeValidator(lowered)] = Field(
        "none", description="none: isolated commands have no network; host: they share the host's"
    )
    shell: str | None = Field(
        None,
        description="the shell running commands (a path or a name on PATH); bash, else /bin/sh, when "
        "unset; /bin/sh (dash) starts on about 40 % less CPU",
    )
    root: str | None = Field(
        None,
        description="where the prompts' directories live; unset: a private (0700) directory of this "
        "user's in the temporary directory",
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


class LocalBackend(SandboxBackend):
    name = "local"
    description = "directory per prompt, in bubblewrap where installed; isolation=none opts out"
    Settings = LocalSettings
    settings: LocalSettings

    def __init__(self, settings: LocalSettings | Mapping[str, object] | None = None) -> None:
        super().__init__(settings)
        self.root_text = self.settings.root or os.path.join(
            tempfile.gettempdir(), f"trajkit-local-{os.getuid()}"
        )
        self.root = Path(self.root_text)
        self.shell = _find_shell(self.settings.shell or "")
        self.isolated = _isolation(self.settings.isolation)
        self.bwrap = bubblewrap.Bubblewrap(self.root_text, network=self.settings.network == "host")
        self.root_ready = False
        cgroups = local_cgroups.detect(
            f"{CGROUP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}",
            max_processes=self.settings.max_processes,
            memory=self.settings.memory,
        )
        self.cgroups = cgroups if isinstance(cgroups, local_cgroups.Cgroups) else None
        if self.cgroups is None:
            log.warning("local sandbox: no per-sandbox process or memory limit here: %s", cgroups)

    async def create(self, spec: SandboxSpec) -> Sandbox:
        cwd = os.path.normpath(spec.cwd or DEFAULT_CWD)
        if not cwd.startswith("/"):
            cwd = os.path.normpath(f"{DEFAULT_CWD}/{cwd}")
        if not self.root_ready:
            _private_root(self.root_text)
            self.root_ready = True
        # Plain strings and os calls: at a thousand sessions in flight, pathlib's objects cost more
        # CPU than the system calls they wrap.
        base = tempfile.mkdtemp(prefix=f"{spec.run_id}.", dir=self.root_text)
        owner = {"owner": owner_tag(), "deadline": time.time() + spec.lifetime}
        with open(os.path.join(base, OWNER_FILE), "wb") as handle:
            handle.write(json.dumps(owner).encode())
        workdir = os.path.join(base, "fs", cwd.lstrip("/"))
        os.makedirs(workdir)
        joins = self.cgroups.create(os.path.basename(base)) if self.cgroups else []
        return LocalSandbox(self, base, workdir, cwd, joins)

    async def reap(self, run_id: str | None = None) -> int:
        if run_id is None:
            await asyncio.to_thread(local_cgroups.reap_abandoned, CGROUP_PREFIX)
        if not self.root.is_dir():
            return 0
        removed = 0
        for base in self.root.iterdir():
            if run_id is not None and not base.name.startswith(f"{run_id}."):
                continue
            if run_id is None and not _abandoned(base / OWNER_FILE):
                continue
            await asyncio.to_thread(kill_marked, MARKER, base.name)
            if self.cgroups:
                self.cgroups.destroy(base.name)
            shutil.rmtree(base, ignore_errors=True)
            removed += 1
        return removed

    async def aclose(self) -> None:
        if self.cgroups:
            await asyncio.to_thread(self.cgroups.close)


def _isolation(wanted: str) -> bool:
    if wanted == "none":
        return False
    problem = bubblewrap.works()
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


def _private_root(root: str) -> None:
    """Create the sandbox root readable by this user alone, and refuse one that someone else owns."""
    os.makedirs(root, mode=0o700, exist_ok=True)
    info = os.lstat(root)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise SandboxError(f"local sandbox: {root} is not a directory of this user's; set local.root")
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(root, 0o700)


def _abandoned(owner_file: Path) -> bool:
    """True if the sandbox's owner process is gone or its lifetime is over.

    A sandbox whose owner file cannot be read yet is one that another process is making this
    moment (between its directory and the file, or mid-write): abandoned only once it has stayed
    so for :data:`OWNER_GRACE` seconds, as a crash at that moment leaves it.
    """
    try:
        owner = json.loads(owner_file.read_text())
    except (OSError, ValueError):
        try:
            return time.time() - owner_file.parent.stat().st_mtime > OWNER_GRACE
        except OSError:
            return False  # gone already
    if time.time() > owner.get("deadline", 0):
        return True
    return owner_gone(str(owner.get("owner", "")))


class LocalSandbox(Sandbox):
    def __init__(self, backend: LocalBackend, base: str, workdir: str, cwd: str, joins: list[str]) -> None:
        self.backend = backend
        self.base = base
        self.name = os.path.basename(base)
        self.joins = joins
        """The ``cgroup.procs`` files each command joins first (its sandbox's limits)."""
        self.execs = 0
        self.workdir = workdir
        self.cwd = cwd
        self.files = Beneath(workdir, cwd)
        self.info = SandboxInfo(backend="local")
        self.closed = False
        self.ran_commands = False
        self.files_written = 0
        # A clean environment: the runner's own variables (API keys among them) must never be
        # visible to a command whose output lands in a trajectory.
        self.env = {**BASE_ENV, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        if backend.isolated:
            self.env["HOME"] = cwd
        else:
            self.env.update(HOME=workdir, **{MARKER: self.name})

    async def exec(
        self,
        command: str,
        *,
        timeout: float,
        env: Mapping[str, str] | None = None,
        output_cap: int = DEFAULT_OUTPUT_CAP,
    ) -> ExecResult:
        self._check_open()
        self.ran_commands = True
        full_env = {**self.env, **env} if env else self.env
        if self.backend.isolated:  # its own PID namespace: nothing it starts outlives it
            return await self._run(command, full_env, timeout, output_cap, self.joins)
        # Unconfined: each command gets a mark and a cgroup of its own, so that what it leaves
        # behind (setsid daemons) can be killed without touching the commands running beside it.
        self.execs += 1
        tag = f"{self.name}/{self.execs}"
        cgroups = self.backend.cgroups
        joins = cgroups.create(tag, limits=False) if cgroups else []
        try:
            result = await self._run(command, {**full_env, MARKER: tag}, timeout, output_cap, joins)
        finally:
            if cgroups:
                cgroups.destroy(tag)
            else:
                kill_marked(MARKER, tag)
        # The host path of the working directory stays out of the data.
        return dataclasses.replace(
            result,
            stdout=result.stdout.replace(self.workdir, self.cwd),
            stderr=result.stderr.replace(self.workdir, self.cwd),
        )

    async def _run(
        self, command: str, env: Mapping[str, str], timeout: float, output_cap: int, joins: list[str]
    ) -> ExecResult:
        argv = [self.backend.shell, "-c", command]
        options_fd = None
        if self.backend.isolated:
            argv, options_fd = self.backend.bwrap.argv(self.workdir, self.cwd, env, argv)
        if joins:
            argv = local_cgroups.wrap(argv, joins)
        # Isolated commands start from /: bubblewrap's own PWD, readable inside, names no host path.
        cwd = "/" if self.backend.isolated else self.workdir
        try:
            proc = Command(argv, cwd=cwd, env=env, output_cap=output_cap, pass_fd=options_fd)
        finally:
            if options_fd is not None:
                os.close(options_fd)
        await proc.wait(timeout)
        return ExecResult(
            exit_code=124 if proc.timed_out else (proc.returncode or 0),
            stdout=proc.stdout.text(),
            stderr=proc.stderr.text(),
            timed_out=proc.timed_out,
            truncated=proc.stdout.truncated or proc.stderr.truncated,
        )

    async def read_file(self, path: str, *, limit: int = DEFAULT_READ_LIMIT) -> bytes:
        self._check_open()
        if limit <= INLINE_IO:  # a thread handoff costs more CPU than a small read
            return self.files.read(path, limit)
        return await in_file_thread(self.files.read, path, limit)

    async def write_file(self, path: str, data: bytes) -> None:
        self._check_open()
        self.files_written += 1
        if len(data) <= INLINE_IO:  # a thread handoff costs more CPU than a small write
            self.files.write(path, data)
        else:
            await in_file_thread(self.files.write, path, data)

    def _check_open(self) -> None:
        if self.closed:
            raise SandboxError("sandbox is closed")

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.backend.cgroups:
                self.backend.cgroups.destroy(self.name)
            if self.small_tree:  # a few files: removing them costs less than a thread handoff
                shutil.rmtree(self.base, True)
            else:
                await asyncio.to_thread(shutil.rmtree, self.base, True)

    @property
    def small_tree(self) -> bool:
        """Without a command run, the tree holds only what ``write_file`` put there."""
        return not self.ran_commands and self.files_written <= INLINE_REMOVE


def _find_shell(wanted: str) -> str:
    """The shell's path: ``wanted`` (a path or a name on PATH) if given, else bash, else /bin/sh."""
    if not wanted:
        return shutil.which("bash") or "/bin/sh"
    found = shutil.which(wanted)
    if found is None:
        raise SandboxError(f"local sandbox: shell {wanted!r} is not an executable file or a command on PATH")
    return found
