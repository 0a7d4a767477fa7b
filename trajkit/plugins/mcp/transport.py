"""Byte pipes to MCP servers that speak JSON-RPC over standard input and output, one message a line,
and the HTTP client of a Streamable HTTP server, bounded alike.

Two kinds of pipe: a process of the runner's machine (a ``shared`` server) and a background process
of a session's sandbox (a ``per_session`` server, through :meth:`trajkit.sandbox.Sandbox.start_process`,
so it runs wherever the sandbox runs). :func:`message_streams` turns either into the two streams the
``mcp`` SDK's ``ClientSession`` takes. Unlike the SDK's own stdio client it holds at most
``max_message`` bytes of one line: a longer one (a flood) is skipped as it streams and said with
:attr:`Flood.seen`, so a server cannot grow the runner's memory. :func:`http_client` holds a URL
server's plain-JSON answers to as much (its server-sent events are bounded by the SDK).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import shutil
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from trajkit.sandbox import Sandbox
    from trajkit.sandbox.processes import SandboxProcess

READ_SIZE = 64 * 1024
HEAD = 512
"""Bytes of a skipped message kept to find which request it answered."""
_ANSWER_ID = re.compile(rb'^\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"id"\s*:\s*(-?\d+|"[^"\\]{0,200}")')
POLL_FIRST = 0.005
POLL_MOST = 0.2
"""Seconds between looks at a sandbox process's output while an answer is awaited."""
HOST_ENVIRONMENT = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "USER", "LOGNAME", "SHELL", "TERM")
"""The runner's variables a host server inherits; any other reaches it only when configured."""


class Pipe(Protocol):
    dropped: int
    """Bytes of output lost before what :meth:`read` returned last (0 but after a flood)."""

    async def read(self) -> bytes:
        """The next bytes of the server's output; ``b""`` once it has ended."""

    async def write(self, data: bytes) -> None: ...

    async def close(self) -> None:
        """End the server and everything it started."""

    def awaiting(self, waiting: bool) -> None:
        """Whether an answer is awaited (a pipe that polls, polls only then)."""


class HostPipe:
    """A server process of the runner's machine, with a small environment of its own."""

    dropped = 0

    def __init__(self, process: asyncio.subprocess.Process, directory: str) -> None:
        self.process = process
        self.directory = directory

    @classmethod
    async def start(cls, command: str, args: Sequence[str], env: Mapping[str, str]) -> HostPipe:
        """``command`` in an empty directory of its own, removed when it is closed."""
        inherited = {key: os.environ[key] for key in HOST_ENVIRONMENT if key in os.environ}
        cwd = tempfile.mkdtemp(prefix="trajkit-mcp-")
        try:
            process = await cls._spawn(command, args, {**inherited, **env}, cwd)
        except BaseException:
            shutil.rmtree(cwd, ignore_errors=True)
            raise
        return cls(process, cwd)

    @staticmethod
    async def _spawn(
        command: str, args: Sequence[str], env: Mapping[str, str], cwd: str
    ) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            command,
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,  # its own process group: closing kills what it started too
        )

    async def read(self) -> bytes:
        assert self.process.stdout is not None
        return await self.process.stdout.read(READ_SIZE)

    async def write(self, data: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(data)
        await self.process.stdin.drain()

    def awaiting(self, waiting: bool) -> None:
        pass

    async def close(self) -> None:
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, 9)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.process.wait(), 10)
        shutil.rmtree(self.directory, ignore_errors=True)


class SandboxPipe:
    """A server run as a background process of a sandbox. Its output arrives in the process's
    :class:`~trajkit.sandbox.processes.OutputLog`, read here by position while an answer is awaited; bytes
    the log dropped before they were read (a flood) come back as a line break, which cuts the
    message they belonged to."""

    def __init__(self, process: SandboxProcess) -> None:
        self.process = process
        self.position = 0
        self.dropped = 0
        self.waiting = asyncio.Event()

    @classmethod
    async def start(
        cls, sandbox: Sandbox, command: str, args: Sequence[str], env: Mapping[str, str], max_message: int
    ) -> SandboxPipe:
        line = shlex.join([command, *args]) + " 2>/dev/null"  # its output is the protocol alone
        return cls(await sandbox.start_process(line, env=env, output_kept=2 * max_message))

    async def read(self) -> bytes:
        pause = POLL_FIRST
        while True:
            await self.waiting.wait()
            await self.process.refresh()
            data, self.position, self.dropped = self.process.output.read_from(self.position)
            if data:
                return data
            if self.process.returncode is not None:
                return b""
            await asyncio.sleep(pause)
            pause = min(pause * 2, POLL_MOST)

    async def write(self, data: bytes) -> None:
        await self.process.write(data)

    def awaiting(self, waiting: bool) -> None:
        if waiting:
            self.waiting.set()
        else:
            self.waiting.clear()

    async def close(self) -> None:
        if self.process.returncode is None:
            await self.process.kill()


async def _read(pipe: Pipe) -> bytes:
    try:
        return await pipe.read()
    except (OSError, RuntimeError):  # a sandbox that closed under the server: as if it ended
        return b""


class Traffic:
    """What passes over one connection: the requests awaiting an answer, and the messages
    skipped for being longer than the connection takes."""

    def __init__(self, pipe: Pipe) -> None:
        self.pipe = pipe
        self.pending: set[Any] = set()
        self.flooded = asyncio.Event()
        self.largest = 0
        self.ended = False
        """The server's output ended: it is gone."""

    def forget(self) -> None:
        """No answer is awaited any more (the call it was for gave up)."""
        self.pending.clear()
        self.pipe.awaiting(False)


@contextlib.asynccontextmanager
async def message_streams(pipe: Pipe, max_message: int, traffic: Traffic) -> AsyncIterator[tuple[Any, Any]]:
    """The (read, write) stream pair a ``ClientSession`` takes, over ``pipe``; lines that are no
    JSON-RPC message (a server's stray prints) are skipped."""
    import anyio
    import mcp_types as types
    from mcp.shared.message import SessionMessage

    incoming_send, incoming = anyio.create_memory_object_stream[Any](16)
    outgoing, outgoing_receive = anyio.create_memory_object_stream[Any](16)
    pending = traffic.pending

    async def deliver(line: bytes) -> None:
        try:
            message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
        except ValueError:
            return
        answered = getattr(message, "id", None)
        if answered in pending and not hasattr(message, "method"):
            pending.discard(answered)
            pipe.awaiting(bool(pending))
        await incoming_send.send(SessionMessage(message))

    async def flooded(head: bytes, size: int) -> None:
        """A message of ``size`` bytes was skipped: the request it answers (named at its start,
        where servers put the id) gets an error instead."""
        traffic.largest = max(traffic.largest, size)
        traffic.flooded.set()
        found = _ANSWER_ID.search(head)
        answered = json.loads(found.group(1)) if found else None
        if answered is None and len(pending) == 1:  # its start was lost too: the one awaited
            answered = next(iter(pending))
        if answered in pending:
            error = {
                "code": -32000,
                "message": f"the answer was {size} bytes, more than the {max_message} taken",
            }
            await deliver(json.dumps({"jsonrpc": "2.0", "id": answered, "error": error}).encode())

    async def reader() -> None:
        try:
            await read_lines()
        finally:
            traffic.ended = True

    async def read_lines() -> None:
        buffer, head, skipped = bytearray(), b"", -1
        async with incoming_send:
            while chunk := await _read(pipe):
                if pipe.dropped and skipped < 0:
                    head, skipped = bytes(buffer[:HEAD]), len(buffer)
                    buffer.clear()
                if pipe.dropped:
                    skipped += pipe.dropped
                while chunk:
                    end = chunk.find(b"\n")
                    part, chunk = (chunk, b"") if end < 0 else (chunk[:end], chunk[end + 1 :])
                    if skipped >= 0:
                        skipped += len(part)
                    elif len(buffer) + len(part) > max_message:
                        head, skipped = bytes((buffer + part)[:HEAD]), len(buffer) + len(part)
                        buffer.clear()
                    else:
                        buffer += part
                    if end < 0:
                        break
                    if skipped >= 0:
                        await flooded(head, skipped)
                        skipped = -1
                    elif buffer.strip():
                        await deliver(bytes(buffer))
                    buffer.clear()

    async def writer() -> None:
        try:
            async with outgoing_receive:
                async for session_message in outgoing_receive:
                    message = session_message.message
                    if hasattr(message, "method") and getattr(message, "id", None) is not None:
                        pending.add(message.id)
                        pipe.awaiting(True)
                    data = message.model_dump_json(by_alias=True, exclude_unset=True)
                    await pipe.write(data.encode() + b"\n")
        except (OSError, RuntimeError):  # the server is gone: the session sees its streams end
            incoming_send.close()

    async with anyio.create_task_group() as group:
        group.start_soon(reader)
        group.start_soon(writer)
        try:
            yield incoming, outgoing
        finally:
            group.cancel_scope.cancel()
            with anyio.CancelScope(shield=True):
                await pipe.close()


def http_client(headers: Mapping[str, str], max_message: int) -> Any:
    """The SDK's HTTP client for a Streamable HTTP server, but reading at most ``max_message``
    bytes of a plain-JSON answer: a longer one fails as it streams (the SDK makes that failure
    the JSON-RPC error of the request it answered), and so does one the server compressed
    although asked not to, whose size once decoded cannot be told before it is held."""
    import httpx2
    from mcp.shared._httpx_utils import create_mcp_http_client

    class AnswerRefused(httpx2.StreamError):
        pass

    class Bounded(httpx2.AsyncByteStream):
        def __init__(self, inner: Any, refusal: str) -> None:
            self.inner = inner
            self.refusal = refusal

        async def __aiter__(self) -> AsyncIterator[bytes]:
            if self.refusal:
                raise AnswerRefused(self.refusal)
            taken = 0
            async for chunk in self.inner:
                taken += len(chunk)
                if taken > max_message:
                    raise AnswerRefused(f"the answer was more than the {max_message} bytes taken")
                yield chunk

        async def aclose(self) -> None:
            await self.inner.aclose()

    async def bound(response: Any) -> None:
        if not response.headers.get("content-type", "").lower().startswith("application/json"):
            return  # an event stream: the SDK bounds each event
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        refusal = (
            "" if encoding == "identity" else f"the answer was compressed ({encoding}), which was not asked"
        )
        response.stream = Bounded(response.stream, refusal)

    client = create_mcp_http_client(headers={"Accept-Encoding": "identity", **headers})
    client.event_hooks = {"request": [], "response": [bound]}
    return client
