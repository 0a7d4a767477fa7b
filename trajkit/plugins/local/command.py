"""One command of the local sandbox run to its end, watched by the event loop itself.

Its own process group is killed when it exits, times out or is cancelled, so background children
never outlive it; its output is read into capped buffers while it streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Mapping
from typing import Protocol

from trajkit.sandbox import CappedBuffer

READ_SIZE = 65536
ESCAPED_PIPE_GRACE = 5.0
"""Seconds to wait, after the command exited and its group was killed, for a process that escaped
the group (``setsid``) to close the output pipes it inherited, before closing them on it."""


def pidfd_or_none(pid: int) -> int:
    """A pidfd of the child ``pid``, readable once it exits; -1 where there are none (not Linux,
    Linux before 5.3)."""
    pidfd_open = getattr(os, "pidfd_open", None)
    try:
        return pidfd_open(pid) if pidfd_open else -1
    except OSError:
        return -1


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


class Sink(Protocol):
    def feed(self, data: bytes) -> None: ...


class PipeReader:
    """Output pipes of a process, non-blocking, read by the event loop into their sinks as they
    stream; done once the process has exited (:meth:`_finish_if_done`) and every pipe is closed."""

    loop: asyncio.AbstractEventLoop
    pipes: dict[int, Sink]
    grace: asyncio.TimerHandle | None

    def _read(self, fd: int) -> bool:
        """Read what the pipe holds; False once there is nothing more for now."""
        try:
            data = os.read(fd, READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            data = b""
        if data:
            self.pipes[fd].feed(data)
            return True
        self._close_pipe(fd)
        self._finish_if_done()
        return False

    def _drain(self) -> None:
        """After the exit: what each pipe holds (at most READ_SIZE unless resized), then usually
        EOF, so most commands finish here without another turn of the loop. A pipe still held open
        (by a dying background child, or one that escaped the group) is closed on it after
        :data:`ESCAPED_PIPE_GRACE`."""
        for fd in list(self.pipes):
            if self._read(fd):
                self._read(fd)
        if self.pipes:
            self.grace = self.loop.call_later(ESCAPED_PIPE_GRACE, self._close_pipes)
        self._finish_if_done()

    def _close_pipe(self, fd: int) -> None:
        self.loop.remove_reader(fd)
        os.close(fd)
        del self.pipes[fd]

    def _close_pipes(self) -> None:
        for fd in list(self.pipes):
            self._close_pipe(fd)
        self._finish_if_done()

    def _finish_if_done(self) -> None:
        raise NotImplementedError


class Command(PipeReader):
    """One command run to its end, its output pipes and its exit watched by the event loop itself.

    The exit is a pidfd's readability, the output two non-blocking pipes read into capped buffers:
    three readers on the loop and no task, where asyncio's subprocess transport, child watcher and
    stream readers cost half again as much runner CPU per start. Without pidfds (not Linux, Linux
    before 5.3) a thread waits for the exit instead.
    """

    def __init__(
        self,
        argv: list[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        output_cap: int,
        pass_fd: int | None = None,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.stdout, self.stderr = CappedBuffer(output_cap), CappedBuffer(output_cap)
        self.returncode: int | None = None
        self.timed_out = False
        self.done = self.loop.create_future()
        self.grace: asyncio.TimerHandle | None = None
        (out_read, out_write), (err_read, err_write) = os.pipe(), os.pipe()
        try:
            self.proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out_write,
                stderr=err_write,
                start_new_session=True,  # its own process group, killed as a whole below
                pass_fds=() if pass_fd is None else (pass_fd,),
            )
        except BaseException:
            os.close(out_read)
            os.close(err_read)
            raise
        finally:
            os.close(out_write)
            os.close(err_write)
        self.pid = self.proc.pid
        self.pipes: dict[int, Sink] = {out_read: self.stdout, err_read: self.stderr}
        for fd in self.pipes:
            os.set_blocking(fd, False)
            self.loop.add_reader(fd, self._read, fd)
        pidfd = pidfd_or_none(self.pid)
        if pidfd >= 0:
            self.loop.add_reader(pidfd, self._pidfd_ready, pidfd)
        else:
            threading.Thread(target=self._wait_in_thread, daemon=True).start()

    async def wait(self, timeout: float) -> None:
        """Until the command exited and its output pipes closed; on timeout its group is killed."""
        timer = self.loop.call_later(timeout, self._time_out)
        try:
            await self.done
        except asyncio.CancelledError:
            # Cancelled from outside: the whole tree still dies, and is reaped, before this ends.
            kill_group(self.pid)
            self._close_pipes()
            if self.returncode is None:
                self.done = self.loop.create_future()
                await self.done
            raise
        finally:
            timer.cancel()

    def _pidfd_ready(self, pidfd: int) -> None:
        self.loop.remove_reader(pidfd)
        os.close(pidfd)
        self._exited(_reap(self.pid))

    def _wait_in_thread(self) -> None:
        returncode = self.proc.returncode = _reap(self.pid)
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            self.loop.call_soon_threadsafe(self._exited, returncode)

    def _exited(self, returncode: int) -> None:
        self.returncode = self.proc.returncode = returncode
        # The command's own process group: background children die with it, always.
        kill_group(self.pid)
        self._drain()

    def _time_out(self) -> None:
        if self.returncode is None:
            self.timed_out = True
            kill_group(self.pid)

    def _finish_if_done(self) -> None:
        if self.returncode is not None and not self.pipes and not self.done.done():
            self.done.set_result(None)
        if not self.pipes and self.grace is not None:
            self.grace.cancel()


def _reap(pid: int) -> int:
    """Wait for the child ``pid``; its exit code, or minus the signal that killed it."""
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:  # reaped elsewhere (an old SIGCHLD-based asyncio child watcher)
        return 255
    return os.waitstatus_to_exitcode(status)
