"""The fake Modal's running commands (:mod:`trajkit_modal.testing`): ``ContainerProcess`` and its
stdin, stdout and stderr streams, over plain OS pipes.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from modal import exception
from modal.stream_type import StreamType

from trajkit_modal.fake_cloud import SandboxState, aio_method

READ_CHUNK = 64 * 1024


class StreamReader:
    """An exec's stdout or stderr: iterate it chunk by chunk, or ``read`` it whole, once."""

    def __init__(
        self, state: SandboxState, fd: int | None, deadline: float | None, text: bool, number: int
    ) -> None:
        self._state = state
        self._fd = fd
        self._deadline = deadline
        self._text = text
        self._number = number

    @property
    def file_descriptor(self) -> int:
        return self._number

    @aio_method
    async def read(self) -> str | bytes:
        parts = [part async for part in self]
        return "".join(parts) if self._text else b"".join(parts)

    async def __aiter__(self) -> AsyncIterator[Any]:
        fd, self._fd = self._fd, None
        if fd is None or fd not in self._state.open_fds:  # never piped, already read, or shut down
            return
        self._state.open_fds.discard(fd)
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        reader = asyncio.StreamReader()
        loop = asyncio.get_running_loop()
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0)
        )
        try:
            while chunk := await self._next_chunk(reader):
                yield decoder.decode(chunk) if self._text else chunk
            if self._text and (rest := decoder.decode(b"", final=True)):
                yield rest
        finally:
            transport.close()

    async def _next_chunk(self, reader: asyncio.StreamReader) -> bytes:
        """The next chunk, or nothing once the exec's deadline has passed (Modal ends the stream)."""
        if self._deadline is None:
            return await reader.read(READ_CHUNK)
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            return b""
        try:
            return await asyncio.wait_for(reader.read(READ_CHUNK), remaining)
        except TimeoutError:
            return b""


class StreamWriter:
    """An exec's stdin: ``write`` buffers, ``drain`` sends, ``write_eof`` closes after the next drain."""

    def __init__(self, state: SandboxState, fd: int) -> None:
        self._state = state
        self._fd: int | None = fd
        self._buffer = bytearray()
        self._eof = False

    def write(self, data: bytes | bytearray | memoryview | str) -> None:
        if self._eof:
            raise ValueError("Stdin is closed. Cannot write to it.")
        self._buffer += data.encode("utf-8") if isinstance(data, str) else data

    def write_eof(self) -> None:
        self._eof = True

    @aio_method
    async def drain(self) -> None:
        data, self._buffer = bytes(self._buffer), bytearray()
        if self._fd not in self._state.open_fds:
            if data:
                raise exception.ExecutionError("stdin of a finished process")
            return
        assert self._fd is not None
        try:
            await asyncio.to_thread(_write_all, self._fd, data)
        except BrokenPipeError:
            raise exception.ExecutionError("the process closed its stdin") from None
        if self._eof:
            self._close()

    def _close(self) -> None:
        """Called when the stream ends or its process exits; the sandbox may have closed it already."""
        fd, self._fd = self._fd, None
        if fd is not None and fd in self._state.open_fds:
            self._state.open_fds.discard(fd)
            os.close(fd)


class ContainerProcess:
    """``modal.container_process.ContainerProcess``: a command started by ``Sandbox.exec``."""

    def __init__(
        self,
        state: SandboxState,
        process: asyncio.subprocess.Process,
        stdin: StreamWriter,
        stdout: StreamReader,
        stderr: StreamReader,
        deadline: float | None,
    ) -> None:
        self._state = state
        self._process = process
        self._stdin = stdin
        self._stdout = stdout
        self._stderr = stderr
        self._deadline = deadline
        self._returncode: int | None = None

    @property
    def stdin(self) -> StreamWriter:
        return self._stdin

    @property
    def stdout(self) -> StreamReader:
        return self._stdout

    @property
    def stderr(self) -> StreamReader:
        return self._stderr

    @property
    def returncode(self) -> int:
        if self._returncode is None:
            raise exception.InvalidError("You must call wait() before accessing the returncode.")
        return self._returncode

    @aio_method
    async def poll(self) -> int | None:
        if self._returncode is None and self._process.returncode is not None:
            self._returncode = _exit_code(self._process.returncode)
            self._stdin._close()
        elif self._returncode is None and self._deadline is not None and time.monotonic() > self._deadline:
            self._returncode = -1
        return self._returncode

    @aio_method
    async def wait(self) -> int:
        if self._returncode is not None:
            return self._returncode
        remaining = None if self._deadline is None else max(0.0, self._deadline - time.monotonic())
        try:
            self._returncode = _exit_code(await asyncio.wait_for(self._process.wait(), remaining))
            self._stdin._close()
        except TimeoutError:
            # Modal reports an exec's timeout as -1, not as an exception.
            if self._state.cloud.kill_on_exec_timeout:
                with contextlib.suppress(ProcessLookupError):
                    self._process.kill()
            self._returncode = -1
        return self._returncode


def stdin_pipe(state: SandboxState) -> tuple[int, StreamWriter]:
    """The read end for the process and a writer holding the other end."""
    read_end, write_end = os.pipe()
    state.open_fds.add(write_end)
    return read_end, StreamWriter(state, write_end)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def pipe_for(
    state: SandboxState, kind: StreamType, deadline: float | None, text: bool, number: int
) -> tuple[int, StreamReader]:
    """A write end for the process (-1 for /dev/null) and the reader of the other end.

    Plain pipes rather than asyncio's, so that waiting for the process never waits for a pipe that
    a background child still holds open.
    """
    if kind == StreamType.DEVNULL:
        return os.open(os.devnull, os.O_WRONLY), StreamReader(state, None, deadline, text, number)
    if kind != StreamType.PIPE:
        raise NotImplementedError(f"the Modal fake supports only PIPE and DEVNULL streams, not {kind}")
    read_end, write_end = os.pipe()
    state.open_fds.add(read_end)
    return write_end, StreamReader(state, read_end, deadline, text, number)


def _exit_code(returncode: int) -> int:
    """Modal reports death by signal N as 128 + N, like a shell."""
    return 128 - returncode if returncode < 0 else returncode
