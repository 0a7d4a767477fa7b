"""Background processes of a sandbox: started by :meth:`Sandbox.start_process`, ended by ``kill`` or
the sandbox's end.

:class:`SandboxProcess` is what every backend gives: the process's output as far as it is kept (an
:class:`OutputLog`), its exit status once it has one, its standard input, and a kill. The default,
:class:`ExecProcess`, is built on nothing but ``exec`` and files inside the sandbox, so every
backend has background processes; a backend that can do better (the local sandbox's supervisor
streams the output as it comes) overrides ``start_process``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import shlex
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping
from importlib import resources
from typing import TYPE_CHECKING

from trajkit.sandbox import SandboxError, truncation_marker

if TYPE_CHECKING:
    from trajkit.sandbox import Sandbox

BACKGROUND_TIMEOUT = 7 * 24 * 3600.0
"""The ``exec`` that holds a background process is not what ends it: the sandbox's lifetime is."""
CONTROL_TIMEOUT = 30.0
"""Seconds for one of the short commands that read, write or kill a background process."""


class OutputLog:
    """What a process wrote, as far as it is kept: the first ``cap // 2`` bytes and the last
    ``cap - cap // 2``; the middle of a longer output is dropped and marked where it was."""

    def __init__(self, cap: int) -> None:
        self.head_cap = cap // 2
        self.tail_cap = cap - self.head_cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > self.tail_cap:
                del self.tail[: len(self.tail) - self.tail_cap]

    def skip(self, count: int) -> None:
        """``count`` bytes were written that were never seen (only their number is known): what
        follows them is no longer contiguous with what came before."""
        if count <= 0:
            return
        self.head_cap = len(self.head)
        self.total += count
        self.tail.clear()

    def read_from(self, position: int) -> tuple[bytes, int, int]:
        """The bytes from ``position`` on as far as they are kept, the position after them, and
        how many bytes from ``position`` on were dropped before them (for a reader that needs
        the bytes as they came, such as a protocol spoken over the output)."""
        head_end = len(self.head)
        tail_start = self.total - len(self.tail)
        data = bytes(self.head[min(position, head_end) :]) if position < head_end else b""
        dropped = max(0, tail_start - max(position, head_end))
        if dropped and data:  # what follows the head is not contiguous with it
            return data, head_end, 0
        return data + bytes(self.tail[max(position - tail_start, 0) :]), self.total, dropped

    def since(self, position: int) -> str:
        """The output from byte ``position`` on, as far as it is kept."""
        head_end = len(self.head)
        tail_start = self.total - len(self.tail)
        gap = tail_start - max(position, head_end)
        text = bytes(self.head[min(position, head_end) :]).decode("utf-8", "replace")
        if gap > 0:
            text += truncation_marker(gap)
        return text + bytes(self.tail[max(position - tail_start, 0) :]).decode("utf-8", "replace")


class SandboxProcess(ABC):
    """One background process of a sandbox."""

    def __init__(self, command: str, output_kept: int) -> None:
        self.command = command
        self.output = OutputLog(output_kept)
        self.returncode: int | None = None
        self.started = time.time()

    async def refresh(self) -> None:
        """Bring :attr:`output` and :attr:`returncode` up to date (a no-op where they stream in)."""

    @abstractmethod
    async def wait(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds for the process to end; True if it has."""

    @abstractmethod
    async def write(self, data: bytes) -> None:
        """Send ``data`` to the process's standard input. Raises BrokenPipeError once it is closed."""

    @abstractmethod
    async def close_stdin(self) -> None:
        """Close the process's standard input: it reads end of file."""

    @abstractmethod
    async def kill(self) -> None:
        """Kill the process and everything it started."""


@functools.cache
def _script() -> str:
    return (resources.files("trajkit.sandbox") / "scripts" / "background.sh").read_text()


class ExecProcess(SandboxProcess):
    """A background process built on ``exec`` alone: one long ``exec`` runs it, with its output in
    a file and its standard input a FIFO in a directory of the sandbox's temporary directory, and
    short ``exec`` calls read the new output, write to the FIFO or kill the process group."""

    def __init__(
        self, sandbox: Sandbox, command: str, env: Mapping[str, str] | None, output_kept: int
    ) -> None:
        super().__init__(command, output_kept)
        self.sandbox = sandbox
        self.env = dict(env or {})
        self.directory = f".trajkit-process-{uuid.uuid4().hex[:12]}"
        self.read_to = 0
        self.stdin_open = True
        self.task: asyncio.Future[int] | None = None

    def _action(self, action: str, **values: str | int) -> str:
        assignments = "".join(f"__tk_{key}={shlex.quote(str(value))}\n" for key, value in values.items())
        return f"__tk_action={action}\n__tk_dir={shlex.quote(self.directory)}\n{assignments}{_script()}"

    async def _control(self, action: str, **values: str | int) -> tuple[int, str, str]:
        result = await self.sandbox.exec(
            self._action(action, **values),
            timeout=CONTROL_TIMEOUT,
            output_cap=4 * self.output.tail_cap + 4096,
        )
        return result.exit_code, result.stdout, result.stderr

    async def start(self) -> None:
        code, _, error = await self._control("prepare")
        if code != 0:
            raise SandboxError(f"cannot prepare a background process: {error.strip()[:500]}")
        self.task = asyncio.ensure_future(self._run())
        # Until the process has started, neither a write nor a kill would find it.
        pause = 0.02
        deadline = time.monotonic() + CONTROL_TIMEOUT
        while (await self._control("started"))[0] != 0:
            if self.task.done() or time.monotonic() > deadline:
                break
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.5)

    async def _run(self) -> int:
        result = await self.sandbox.exec(
            self._action("run", command=self.command), timeout=BACKGROUND_TIMEOUT, env=self.env
        )
        return result.exit_code

    async def refresh(self) -> None:
        if self.task is not None and self.task.done() and self.returncode is None:
            self.returncode = _outcome(self.task)
        code, stdout, stderr = await self._control("read", offset=self.read_to, cap=self.output.tail_cap)
        size_line, _, head = stdout.partition("\n")
        if code != 0 or not size_line.isdigit():
            return
        size = int(size_line)
        first, last = head.encode(), stderr.encode()
        self.output.feed(first)
        if last:  # more than fits came: the first part above, then the last part
            self.output.skip(size - self.read_to - len(first) - len(last))
            self.output.feed(last)
        self.read_to = size

    async def wait(self, timeout: float) -> bool:
        if self.task is not None and self.returncode is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.task), timeout)
        await self.refresh()
        return self.returncode is not None

    async def write(self, data: bytes) -> None:
        if not self.stdin_open or self.returncode is not None:
            raise BrokenPipeError("the process's standard input is closed")
        code, _, error = await self._control("write", data=data.decode("utf-8", "replace"))
        if code != 0:
            raise BrokenPipeError(error.strip() or "the process's standard input is full")

    async def close_stdin(self) -> None:
        self.stdin_open = False
        await self._control("close")

    async def kill(self) -> None:
        await self._control("kill")
        if self.task is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.task), CONTROL_TIMEOUT)
            if self.task.done() and self.returncode is None:
                self.returncode = _outcome(self.task)


def _outcome(task: asyncio.Future[int]) -> int:
    """The exit code the holding ``exec`` returned, or that of a killed process if it failed."""
    if task.cancelled() or task.exception() is not None:
        return 137
    return task.result()
