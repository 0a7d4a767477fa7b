"""The one confined process tree of a local sandbox: started once, running every command it is given.

A session's first command starts bubblewrap (:mod:`trajkit.plugins.local.bubblewrap`) with a small bash
supervisor as its PID 1 (``scripts/supervisor.bash``), then moves it into the session's cgroup;
every command after that is one request on a pipe: the supervisor starts it as a job of its own
(two forks of an already running shell, no program loaded) and reports its exit status when it
and everything it started are dead. The command's output comes back through FIFOs that the runner
makes for each command in the session's control directory (bound read-only into the sandbox) and
reads while they stream, into capped buffers.

Whatever runs in the sandbox may read or write what the supervisor reports (it is the same user):
its reports are parsed as untrusted input, and a supervisor that floods them is stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

from trajkit.plugins.local import bubblewrap
from trajkit.plugins.local.bubblewrap import HostUser
from trajkit.plugins.local.command import READ_SIZE, PipeReader, Sink, pidfd_or_none
from trajkit.sandbox import CappedBuffer, SandboxError, shell

START_TIMEOUT = 60.0
"""Seconds for bubblewrap and the supervisor to be ready."""
KILL_GRACE = 10.0
"""Seconds a killed command's report may take before it is given up on."""
MAX_REPORT_LINE = 64
MAX_GARBAGE = 1 << 20
"""Bytes of lines that are no report before the supervisor is taken for tampered with and stopped."""
KILLED_STATUS = 137
SCRIPT_VARIABLE = "TRAJKIT_SUPERVISOR"
"""The supervisor's script reaches it in this variable, which it removes from its environment."""
SUPERVISOR_LOST = "\n[the sandbox's processes were killed: its supervisor ended]\n"


def supervisor_script() -> str:
    return shell.script("trajkit.plugins.local", "supervisor.bash")


class Job(PipeReader):
    """One command run by the supervisor: its output FIFOs read into capped buffers, its status.

    ``background`` jobs read their standard input from a FIFO the runner writes and get their
    standard error merged into their standard output.
    """

    def __init__(
        self, supervisor: Supervisor, job_id: str, output_cap: int, *, background: bool, sink: Sink | None
    ) -> None:
        self.supervisor = supervisor
        self.id = job_id
        self.background = background
        self.loop = supervisor.loop
        self.stdout, self.stderr = CappedBuffer(output_cap), CappedBuffer(output_cap)
        self.sink: Sink = sink if sink is not None else self.stdout
        self.status: int | None = None
        self.killed = False
        self.done: asyncio.Future[None] = self.loop.create_future()
        self.grace: asyncio.TimerHandle | None = None
        self.stdin = -1
        self.pipes: dict[int, Sink] = {}
        self.paths = [supervisor.fifo(job_id, "o")]
        if background:
            self.paths.append(supervisor.fifo(job_id, "i"))
            self.stdin = os.open(self.paths[1], os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        else:
            self.paths.append(supervisor.fifo(job_id, "e"))
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
        self.pipes[os.open(self.paths[0], flags)] = self.sink
        if not background:
            self.pipes[os.open(self.paths[1], flags)] = self.stderr
        for fd in self.pipes:
            self.loop.add_reader(fd, self._read, fd)

    async def wait(self, timeout: float | None) -> bool:
        """Until the job ended and its output is read; True if it ran out of ``timeout`` and was killed."""
        timer = None if timeout is None else self.loop.call_later(timeout, self.kill)
        try:
            await asyncio.shield(self.done)
        except asyncio.CancelledError:
            self.kill()  # the whole tree still dies before this ends
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.done), KILL_GRACE)
            raise
        finally:
            if timer is not None:
                timer.cancel()
        return self.killed

    def kill(self) -> None:
        if self.status is None and not self.killed:
            self.killed = True
            self.supervisor.kill(self.id)

    def write(self, data: bytes) -> int:
        """Write to the job's standard input without blocking; how many bytes went in."""
        if self.stdin < 0:
            raise BrokenPipeError("standard input is closed")
        try:
            return os.write(self.stdin, data)
        except BlockingIOError:
            return 0

    def close_stdin(self) -> None:
        if self.stdin >= 0:
            os.close(self.stdin)
            self.stdin = -1

    def exited(self, status: int) -> None:
        if self.status is not None:
            return
        self.status = status
        self.close_stdin()
        self._drain()

    def _finish_if_done(self) -> None:
        if self.status is None or self.pipes or self.done.done():
            return
        if self.grace is not None:
            self.grace.cancel()
        for path in self.paths:
            with contextlib.suppress(OSError):
                os.unlink(path)
        self.supervisor.jobs.pop(self.id, None)
        self.done.set_result(None)


class Supervisor:
    """A sandbox's bubblewrap and the supervisor in it; made by :meth:`start`, ended by :meth:`stop`."""

    def __init__(
        self,
        options: Sequence[str],
        control: str,
        *,
        host_user: HostUser | None,
        cgroup_joins: Sequence[str],
        shell: str,
    ) -> None:
        """``options``: bubblewrap's (from :meth:`Confinement.options`); ``control``: the host
        directory of the FIFOs; ``shell``: what runs each command, empty for the supervisor's bash."""
        self.options = list(options)
        self.control = control
        self.host_user = host_user
        self.cgroup_joins = list(cgroup_joins)
        self.shell = shell
        self.loop = asyncio.get_running_loop()
        self.jobs: dict[str, Job] = {}
        self.next_id = 0
        self.ready: asyncio.Future[None] = self.loop.create_future()
        self.ready.add_done_callback(_retrieve)
        self.ended: asyncio.Future[None] = self.loop.create_future()
        self.pending = bytearray()
        """Requests not yet written: before the supervisor is ready, or while its pipe is full."""
        self.reports = bytearray()
        self.garbage = 0
        self.startup_text = bytearray()
        self.proc: subprocess.Popen[bytes] | None = None
        self.pid = 0
        """The supervisor's pid on the host."""
        self.requests = self.events = self.pidfd = -1
        self.spawning: asyncio.Future[subprocess.Popen[bytes]] | None = None

    # -- life ------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start bubblewrap and the supervisor, in the session's cgroups. Raises SandboxError."""
        requests_read, self.requests = os.pipe()
        self.events, events_write = os.pipe()
        # Started from a worker thread: the thread that starts a program waits until the child
        # has loaded it (vfork), a millisecond or more on a busy machine, which the loop every
        # session shares must not wait.
        self.spawning = asyncio.ensure_future(asyncio.to_thread(self._spawn, requests_read, events_write))
        try:
            self.proc = await asyncio.shield(self.spawning)
        except OSError as exc:
            os.close(self.requests)
            os.close(self.events)
            self.requests = self.events = -1
            raise SandboxError(f"local sandbox: cannot start bubblewrap: {exc}") from exc
        os.set_blocking(self.requests, False)
        os.set_blocking(self.events, False)
        self.loop.add_reader(self.events, self._on_events)
        self.pidfd = pidfd_or_none(self.proc.pid)
        if self.pidfd >= 0:
            self.loop.add_reader(self.pidfd, self._on_exit)
        try:
            await asyncio.wait_for(asyncio.shield(self.ready), START_TIMEOUT)
        except (TimeoutError, SandboxError) as exc:
            await self.stop()
            if isinstance(exc, SandboxError):
                raise
            raise SandboxError(f"local sandbox: bubblewrap did not start in {START_TIMEOUT:g}s") from None

    def _spawn(self, requests_read: int, events_write: int) -> subprocess.Popen[bytes]:
        """bubblewrap with the supervisor in it, its options in a memory file (not on its command
        line); the child's ends of the pipes are closed here."""
        try:
            options = os.memfd_create("bwrap-args", os.MFD_CLOEXEC)
        except OSError:
            os.close(requests_read)
            os.close(events_write)
            raise
        try:
            script = ["--setenv", SCRIPT_VARIABLE, supervisor_script()]
            os.write(options, b"\0".join(o.encode() for o in (*self.options, *script)) + b"\0")
            os.lseek(options, 0, os.SEEK_SET)
            prefix, user = bubblewrap.as_user(self.host_user)
            argv = [
                *prefix, "bwrap", "--args", str(options), "--", "bash", "--noprofile", "--norc", "-c",
                f'eval "${SCRIPT_VARIABLE}"', "bash", bubblewrap.CONTROL_DIR, self.shell,
            ]  # fmt: skip
            return subprocess.Popen(  # type: ignore[call-overload]
                argv,
                stdin=requests_read,
                stdout=events_write,
                stderr=events_write,
                pass_fds=(options,),
                cwd="/",
                env={"PATH": bubblewrap.PATH},
                start_new_session=True,
                **user,
            )
        finally:
            for fd in (requests_read, events_write, options):
                os.close(fd)

    async def stop(self) -> None:
        """End the supervisor and everything in its namespaces; wait for bubblewrap to exit."""
        if self.spawning is not None and not self.spawning.done():
            await asyncio.wait([self.spawning])  # a start cut short: its process is ended below
        if self.proc is None and self.spawning is not None and _outcome(self.spawning) is None:
            self.proc = self.spawning.result()
        if self.requests >= 0:
            os.close(self.requests)  # the supervisor reads EOF and exits: the kernel kills the rest
            self.requests = -1
        if self.proc is None:  # it never started
            if self.events >= 0:
                os.close(self.events)
                self.events = -1
            return
        for pid in (self.pid, self.proc.pid):
            if pid:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        if self.pidfd < 0:
            await asyncio.to_thread(self.proc.wait)
            self._lost()
        # Its PID namespace ends with it: the kernel kills every process in it before bubblewrap,
        # its parent, sees it exit.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.ended), KILL_GRACE)

    @property
    def alive(self) -> bool:
        return not self.ended.done()

    # -- commands --------------------------------------------------------------------------------

    def run(
        self,
        command: str,
        cwd: str,
        env: Mapping[str, str],
        output_cap: int,
        *,
        background: bool = False,
        sink: Sink | None = None,
    ) -> Job:
        """Start ``command`` in ``cwd`` with ``env`` added to the sandbox's environment; a
        background job's output goes to ``sink``."""
        if not self.alive:
            raise SandboxError("local sandbox: its supervisor has ended")
        self.next_id += 1
        job_id = str(self.next_id)
        fields = [cwd.encode(), str(len(env)).encode(), *(f"{k}={v}".encode() for k, v in env.items())]
        request = os.path.join(self.control, f"{job_id}.x")
        with open(request, "wb") as handle:  # private to the sandbox: nothing else reads it
            handle.write(b"\0".join((*fields, command.encode())) + b"\0")
        job = Job(self, job_id, output_cap, background=background, sink=sink)
        job.paths.append(request)
        self.jobs[job.id] = job
        self._send(b"x\0%s\0%s\0" % (job.id.encode(), b"b" if background else b"f"))
        return job

    def kill(self, job_id: str) -> None:
        self._send(b"k\0" + job_id.encode() + b"\0")

    def fifo(self, job_id: str, kind: str) -> str:
        path = os.path.join(self.control, f"{job_id}.{kind}")
        os.mkfifo(path, 0o600)
        bubblewrap.hand_over(path, self.host_user)
        return path

    # -- the pipes -------------------------------------------------------------------------------

    def _send(self, request: bytes) -> None:
        if self.requests < 0:
            return
        had_pending = bool(self.pending)
        self.pending += request
        if self.ready.done() and not had_pending:
            self._flush()

    def _flush(self) -> None:
        if self.requests < 0:
            self.pending.clear()
            return
        try:
            written = os.write(self.requests, self.pending)
        except BlockingIOError:
            written = 0
        except OSError:  # the supervisor is gone; its end is seen on the report pipe
            self.pending.clear()
            return
        del self.pending[:written]
        if self.pending:
            self.loop.add_writer(self.requests, self._on_writable)

    def _on_writable(self) -> None:
        self.loop.remove_writer(self.requests)
        self._flush()

    def _on_events(self) -> None:
        try:
            data = os.read(self.events, READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._lost()
            return
        if not self.ready.done():
            self.startup_text += data[:4096]
        self.reports += data
        *lines, rest = self.reports.split(b"\n")
        self.reports = bytearray(rest if len(rest) <= MAX_REPORT_LINE else b"")
        self.garbage += len(rest) if len(rest) > MAX_REPORT_LINE else 0
        for line in lines:
            self._report(bytes(line))
        if self.garbage > MAX_GARBAGE:
            self._lost()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.proc.pid if self.proc else 0, signal.SIGKILL)

    def _report(self, line: bytes) -> None:
        fields = line.split()
        if len(fields) == 3 and fields[0] == b"E" and fields[2].isdigit():
            job = self.jobs.get(fields[1].decode("ascii", "replace"))
            if job is not None:
                job.exited(int(fields[2]))
            return
        if fields == [b"R"] and not self.ready.done():
            self._on_ready()
            return
        self.garbage += len(line) + 1

    def _on_ready(self) -> None:
        if not self.cgroup_joins:  # only the supervisor's pid to find: one read of /proc
            try:
                self._join()
            except (OSError, ValueError, IndexError) as exc:
                self._joined(exc)
            else:
                self._joined(None)
            return
        # Moving a process into a cgroup waits for the kernel's cgroup lock, milliseconds on a
        # busy machine: in a worker thread, so the loop goes on meanwhile.
        joining = asyncio.ensure_future(asyncio.to_thread(self._join))
        joining.add_done_callback(lambda done: self._joined(_outcome(done)))

    def _join(self) -> None:
        """Find the supervisor (bubblewrap's child) and move it into the sandbox's cgroups."""
        assert self.proc is not None
        with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as handle:
            self.pid = int(handle.read().split()[0])
        for join in self.cgroup_joins:  # before it starts anything: every job is in them
            with open(join, "w") as handle:
                handle.write(str(self.pid))

    def _joined(self, problem: BaseException | None) -> None:
        if self.ready.done():  # it ended meanwhile
            return
        if problem is not None:
            self.ready.set_exception(SandboxError(f"local sandbox: cannot limit its supervisor: {problem}"))
            return
        self.ready.set_result(None)
        if self.pending:
            self._flush()

    def _on_exit(self) -> None:
        self.loop.remove_reader(self.pidfd)
        os.close(self.pidfd)
        self.pidfd = -1
        if self.proc is not None:
            with contextlib.suppress(ChildProcessError):
                self.proc.wait()
        self._lost()

    def _lost(self) -> None:
        """The supervisor has ended: every job of it ended with it."""
        if self.events >= 0:
            self.loop.remove_reader(self.events)
            os.close(self.events)
            self.events = -1
        if self.requests >= 0:
            self.loop.remove_writer(self.requests)
        if not self.ready.done():
            text = self.startup_text.decode("utf-8", "replace").strip() or "it exited at once"
            self.ready.set_exception(SandboxError(f"local sandbox: bubblewrap failed: {text[:2000]}"))
        for job in list(self.jobs.values()):
            job.stderr.feed(SUPERVISOR_LOST.encode())
            job.exited(KILLED_STATUS)
        if self.pidfd < 0 and not self.ended.done():
            self.ended.set_result(None)


def _outcome(future: asyncio.Future[Any]) -> BaseException | None:
    """The exception a finished future holds (its cancellation's too), or None."""
    if future.cancelled():
        return asyncio.CancelledError()
    return future.exception()


def _retrieve(future: asyncio.Future[None]) -> None:
    """Take the outcome nobody may wait for any more, so asyncio does not report it as lost."""
    if not future.cancelled():
        future.exception()
