"""One local sandbox: its commands, background processes and files, and its end.

Isolated (the default wherever bubblewrap works), a sandbox's first command starts its
:class:`~trajkit.plugins.local.supervisor.Supervisor`, in a cgroup of the sandbox's own, and every
command after that is a request to it. Unconfined (``isolation=none``), every command is a process
of this user's, started by :class:`~trajkit.plugins.local.command.Command`, with a mark in its
environment and a cgroup of its own so that what it leaves behind can be killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import Mapping
from typing import TYPE_CHECKING

from trajkit.plugins.local import bubblewrap
from trajkit.plugins.local import cgroups as local_cgroups
from trajkit.plugins.local.command import Command
from trajkit.plugins.local.processes import kill_marked
from trajkit.plugins.local.supervisor import KILL_GRACE, Job, Supervisor
from trajkit.sandbox import (
    DEFAULT_OUTPUT_CAP,
    DEFAULT_OUTPUT_KEPT,
    DEFAULT_READ_LIMIT,
    ExecResult,
    Sandbox,
    SandboxError,
    SandboxInfo,
)
from trajkit.sandbox.confined import Beneath
from trajkit.sandbox.fileio import in_file_thread
from trajkit.sandbox.processes import SandboxProcess

if TYPE_CHECKING:
    from trajkit.plugins.local.sandbox import LocalBackend

MARKER = "TRAJKIT_SANDBOX_TAG"  # not TRAJKIT_SANDBOX: that variable is the --sandbox setting
"""Set in every unconfined command's environment, so its processes can be found and killed."""
INLINE_IO = 256 * 1024
"""Files up to this size are read and written on the event loop; larger ones in a worker thread."""
BASE_ENV = {"LC_CTYPE": "C.UTF-8", "TERM": "dumb"}
"""UTF-8 through LC_CTYPE alone: C.UTF-8's other categories are C's, and LANG or LC_ALL would make
every shell start load all of the locale's files, about a tenth of what a ``bash -c`` costs."""
TIMEOUT_EXIT_CODE = 124
STDIN_WAIT = 10.0
"""Seconds a write to a background process's standard input may wait for the process to read."""


class LocalSandbox(Sandbox):
    def __init__(self, backend: LocalBackend, workdir: str, cwd: str) -> None:
        self.backend = backend
        self.name = os.path.basename(workdir)
        self.execs = 0
        self.workdir = workdir
        self.cwd = cwd
        host_user = backend.host_user if backend.isolated else None
        self.files = Beneath(workdir, cwd, (host_user.uid, host_user.gid) if host_user else None)
        self.info = SandboxInfo(backend="local")
        self.closed = False
        self.ran_commands = False
        self.supervisor: Supervisor | None = None
        self.starting = asyncio.Lock()
        self.cgroup = ""
        self.joins: list[str] | None = None
        self.spare_cgroups: list[str] = []
        """Unconfined: the cgroups of finished commands (their processes killed), to use again."""
        """The sandbox's cgroups (their ``cgroup.procs`` files), taken by its first command."""
        # A clean environment: the runner's own variables (API keys among them) must never be
        # visible to a command whose output lands in a trajectory.
        if backend.isolated:
            self.env = {
                **BASE_ENV,
                "PATH": bubblewrap.PATH,
                "HOME": cwd,
                "USER": bubblewrap.INSIDE_USER,
                "LOGNAME": bubblewrap.INSIDE_USER,
            }
        else:
            self.env = {
                **BASE_ENV,
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "HOME": workdir,
                "TMPDIR": f"{workdir}.tmp",  # beside the prompt's files, not among them
                MARKER: self.name,
            }

    def _check_open(self) -> None:
        if self.closed:
            raise SandboxError("sandbox is closed")

    async def _sandbox_cgroups_off_loop(self) -> list[str]:
        """The sandbox's cgroups (their ``cgroup.procs`` files), taken by its first command: made
        (a cgroup in each hierarchy, its limits written) in a worker thread rather than on the
        loop every session shares. Called with :attr:`starting` held."""
        if self.joins is None:
            cgroups = self.backend.cgroups
            self.cgroup, joins = await asyncio.to_thread(cgroups.acquire) if cgroups else ("", [])
            self.joins = joins
            return joins
        return self.joins

    # -- commands --------------------------------------------------------------------------------

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
        if "\0" in command:
            raise ValueError("a command cannot hold a NUL character")
        if self.backend.isolated:
            supervisor = await self._supervisor()
            job = supervisor.run(command, self.cwd, env or {}, output_cap)
            killed = await job.wait(timeout)
            return _result(job, killed)
        return await self._unconfined(command, env, timeout, output_cap)

    async def _supervisor(self) -> Supervisor:
        async with self.starting:
            self._check_open()
            if self.supervisor is not None and self.supervisor.alive:
                return self.supervisor
            if self.supervisor is not None:  # it ended (a broken sandbox): a fresh one, same files
                await self.supervisor.stop()
            confinement = self.backend.confinement
            assert confinement is not None
            control = self.backend.control_dir(self.name)
            shell = "" if os.path.basename(self.backend.shell) == "bash" else self.backend.shell
            self.supervisor = Supervisor(
                confinement.options(self.workdir, self.cwd, control, self.env),
                control,
                host_user=self.backend.host_user,
                cgroup_joins=await self._sandbox_cgroups_off_loop(),
                shell=shell,
            )
            await self.supervisor.start()
            return self.supervisor

    async def _unconfined(
        self, command: str, env: Mapping[str, str] | None, timeout: float, output_cap: int
    ) -> ExecResult:
        # Each command gets a mark and a cgroup of its own, so that what it leaves behind (setsid
        # daemons) can be killed without touching the commands running beside it.
        os.makedirs(self.env["TMPDIR"], exist_ok=True)
        self.execs += 1
        number = self.execs  # its own: commands started at once all wait for the sandbox's cgroups
        tag = f"{self.name}/{number}"
        cgroups = self.backend.cgroups
        joins: list[str] = []
        own_cgroup = ""
        if cgroups:
            if self.joins is None:
                async with self.starting:
                    await self._sandbox_cgroups_off_loop()
            own_cgroup, joins = self._command_cgroup(cgroups, number)
        full_env = {**self.env, **(env or {}), MARKER: tag}
        argv = [self.backend.shell, "-c", command]
        if joins:
            argv = local_cgroups.wrap(argv, joins)
        try:
            proc = Command(argv, cwd=self.workdir, env=full_env, output_cap=output_cap)
            await proc.wait(timeout)
        finally:
            if cgroups:
                cgroups.kill(own_cgroup)  # what it left behind; the cgroup serves a later command
                self.spare_cgroups.append(own_cgroup)
            else:
                kill_marked(MARKER, tag)
        # The host path of the working directory stays out of the data.
        return ExecResult(
            exit_code=TIMEOUT_EXIT_CODE if proc.timed_out else (proc.returncode or 0),
            stdout=proc.stdout.text().replace(self.workdir, self.cwd),
            stderr=proc.stderr.text().replace(self.workdir, self.cwd),
            timed_out=proc.timed_out,
            truncated=proc.stdout.truncated or proc.stderr.truncated,
        )

    def _command_cgroup(self, cgroups: local_cgroups.Cgroups, number: int) -> tuple[str, list[str]]:
        """A cgroup of its own for an unconfined command, below the sandbox's: one an earlier
        command left empty (making and removing one waits for the kernel's cgroup lock, 1-2 ms on
        a busy machine), else a new one named after the command's ``number``; its name and the
        ``cgroup.procs`` files to join."""
        for index, name in enumerate(self.spare_cgroups):
            if cgroups.empty(name):
                del self.spare_cgroups[index]
                return name, cgroups.joins(name)
            cgroups.kill(name)  # still dying, or something outran the last kill
        name = f"{self.cgroup}/c{number}"
        return name, cgroups.create(name, limits=False)

    async def start_process(
        self, command: str, *, env: Mapping[str, str] | None = None, output_kept: int = DEFAULT_OUTPUT_KEPT
    ) -> SandboxProcess:
        self._check_open()
        if not self.backend.isolated:
            return await super().start_process(command, env=env, output_kept=output_kept)
        if "\0" in command:
            raise ValueError("a command cannot hold a NUL character")
        self.ran_commands = True
        process = LocalProcess(command, output_kept)
        supervisor = await self._supervisor()
        process.attach(supervisor.run(command, self.cwd, env or {}, 0, background=True, sink=process.output))
        return process

    # -- files -----------------------------------------------------------------------------------

    async def read_file(self, path: str, *, limit: int = DEFAULT_READ_LIMIT) -> bytes:
        self._check_open()
        fd = self.files.open_regular(path)
        try:
            small = os.fstat(fd).st_size <= INLINE_IO
        except BaseException:
            os.close(fd)
            raise
        if small or limit <= INLINE_IO:  # a thread handoff costs more CPU than a small read
            return self.files.read_open(fd, path, limit)
        return await in_file_thread(self.files.read_open, fd, path, limit)

    async def write_file(self, path: str, data: bytes) -> None:
        self._check_open()
        if len(data) <= INLINE_IO:  # a thread handoff costs more CPU than a small write
            self.files.write(path, data)
        else:
            await in_file_thread(self.files.write, path, data)

    # -- the end ---------------------------------------------------------------------------------

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        async with self.starting:  # a supervisor being started is stopped, not left behind
            if self.supervisor is not None:
                await self.supervisor.stop()
        # The cgroups and the tree in a worker thread: on a busy disk each directory's removal
        # blocks for a millisecond or more, which the loop every session shares must not wait.
        await asyncio.to_thread(self._remove)

    def _remove(self) -> None:
        cgroups = self.backend.cgroups if self.joins else None
        if cgroups:
            cgroups.release(self.cgroup)
        if self.supervisor is not None:
            shutil.rmtree(self.supervisor.control, True)
        if not self.backend.isolated and self.ran_commands:
            shutil.rmtree(self.env["TMPDIR"], True)
        shutil.rmtree(self.workdir, True)


class LocalProcess(SandboxProcess):
    """A background process run by an isolated sandbox's supervisor; its output streams in."""

    job: Job

    def attach(self, job: Job) -> None:
        self.job = job
        job.done.add_done_callback(self._ended)

    def _ended(self, _done: asyncio.Future[None]) -> None:
        self.returncode = self.job.status if self.job.status is not None else 137

    async def wait(self, timeout: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.job.done), timeout)
        return self.returncode is not None

    async def write(self, data: bytes) -> None:
        view = memoryview(data)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STDIN_WAIT
        while view:
            view = view[self.job.write(bytes(view)) :]
            if view:
                if loop.time() > deadline:
                    raise BrokenPipeError("the process does not read its standard input")
                await asyncio.sleep(0.05)

    async def close_stdin(self) -> None:
        self.job.close_stdin()

    async def kill(self) -> None:
        self.job.kill()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.job.done), KILL_GRACE)


def _result(job: Job, killed: bool) -> ExecResult:
    status = job.status if job.status is not None else 137
    return ExecResult(
        exit_code=TIMEOUT_EXIT_CODE if killed else status,
        stdout=job.stdout.text(),
        stderr=job.stderr.text(),
        timed_out=killed,
        truncated=job.stdout.truncated or job.stderr.truncated,
    )


def find_shell(wanted: str) -> str:
    """The shell's path: ``wanted`` (a path or a name on PATH) if given, else bash, else /bin/sh."""
    if not wanted:
        return shutil.which("bash") or "/bin/sh"
    found = shutil.which(wanted)
    if found is None:
        raise SandboxError(f"local sandbox: shell {wanted!r} is not an executable file or a command on PATH")
    return found
