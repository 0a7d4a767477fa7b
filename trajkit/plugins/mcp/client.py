"""One client connection to an MCP server through the ``mcp`` SDK, and what can go wrong with it.

A :class:`Connection` is owned by a task of its own (the SDK's task groups must be entered and left
by one task), so the sessions and the run that use it may open, call and close it from any task.
Every fault of the server is a :class:`~trajkit.tools.ToolError` of the call it hit: a server that
ended is started again once (its state is lost), then its tools say it is gone; a call that takes
longer than its timeout is given up; an answer longer than the connection takes is skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trajkit.plugins.mcp.transport import Pipe, Traffic, http_client, message_streams
from trajkit.tools import ToolError

log = logging.getLogger("trajkit")

RESTARTS = 1
"""Times a connection whose server ended is opened again before its tools give up."""


class ServerFailed(Exception):
    """The server could not be started, or did not answer ``initialize`` and ``tools/list``."""


@dataclass
class Endpoint:
    """How to reach one server: a pipe to open, or a URL with its headers."""

    label: str
    """``MCP server 'git'``: how messages name it."""
    open_pipe: Callable[[], Awaitable[Pipe]] | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    max_message: int = 1 << 20
    start_timeout: float = 30.0


class Connection:
    """A started server: its tools as listed when it started, and calls to them."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.restarts = RESTARTS
        self.tools: list[Any] = []
        self.list_changed = False
        """The server said its tool list changed (the run keeps offering what it listed first)."""
        self._session: Any = None
        self._owner: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self._traffic: Traffic | None = None
        self._dead = "its server ended"
        self._lock = asyncio.Lock()
        """Held while the server is started again: concurrent calls restart it once."""
        self._generation = 0
        """How many times the server was started."""

    async def open(self) -> list[Any]:
        """Start the server and list its tools; :class:`ServerFailed` if it cannot."""
        self._generation += 1
        self._closing = asyncio.Event()
        ready: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._owner = asyncio.ensure_future(self._own(ready))
        try:
            self.tools = await asyncio.wait_for(asyncio.shield(ready), self.endpoint.start_timeout)
        except TimeoutError:
            await self.close()
            raise ServerFailed(
                f"{self.endpoint.label} did not answer within {self.endpoint.start_timeout:g}s of starting"
            ) from None
        except Exception as exc:
            await self.close()
            raise ServerFailed(f"{self.endpoint.label} failed to start: {_reason(exc)}") from None
        return self.tools

    async def _own(self, ready: asyncio.Future[list[Any]]) -> None:
        from mcp.client.session import ClientSession

        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await self._streams(stack)
                session = await stack.enter_async_context(
                    ClientSession(read, write, message_handler=self._on_message)
                )
                await session.initialize()
                tools = await _all_tools(session)
                self._session = session
                ready.set_result(tools)
                await self._closing.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else ServerFailed("cancelled"))
            if not isinstance(exc, Exception):
                raise
        finally:
            self._session = None

    async def _streams(self, stack: contextlib.AsyncExitStack) -> tuple[Any, Any]:
        endpoint = self.endpoint
        if endpoint.open_pipe is not None:
            pipe = await endpoint.open_pipe()
            self._traffic = Traffic(pipe)
            streams = message_streams(pipe, endpoint.max_message, self._traffic)
            read, write = await stack.enter_async_context(streams)
            return read, write
        from mcp.client.streamable_http import streamable_http_client

        assert endpoint.url is not None
        client = await stack.enter_async_context(http_client(endpoint.headers, endpoint.max_message))
        opened = streamable_http_client(
            endpoint.url, http_client=client, max_sse_event_size=endpoint.max_message
        )
        read, write, *_ = await stack.enter_async_context(opened)
        return read, write

    async def _on_message(self, message: Any) -> None:
        import mcp_types as types

        if isinstance(message, types.ToolListChangedNotification):
            self.list_changed = True

    @property
    def alive(self) -> bool:
        ended = self._traffic is not None and self._traffic.ended
        return self._session is not None and self._owner is not None and not self._owner.done() and not ended

    async def call(self, name: str, arguments: dict[str, Any], timeout: float) -> Any:
        """The server's ``CallToolResult`` for ``name``; a :class:`ToolError` for any fault."""
        if not self.alive:
            await self._restart(self._generation, "it had ended before this call")
        session, generation = self._session, self._generation
        try:
            return await asyncio.wait_for(session.call_tool(name, arguments), timeout)
        except TimeoutError:
            if self._traffic is not None:
                self._traffic.forget()
            raise ToolError(f"{self.endpoint.label} did not answer within {timeout:g}s") from None
        except Exception as exc:
            await asyncio.sleep(0)  # let the owner see the streams end
            if self.alive and (self._traffic is not None or not _connection_lost(exc)):
                raise ToolError(f"{self.endpoint.label}: {_reason(exc)}") from None
            await self._restart(generation, "it ended during this call")
            raise ToolError(
                f"{self.endpoint.label} ended during this call and was started again (what it held is lost)"
            ) from None

    async def _restart(self, generation: int, why: str) -> None:
        """Start the server again, unless a concurrent call did since ``generation`` started."""
        async with self._lock:
            if self._generation != generation and self.alive:
                return
            await self.close()
            await self._reopen(why)

    async def _reopen(self, why: str) -> None:
        if self.restarts <= 0:
            raise ToolError(f"{self.endpoint.label} is unavailable: {self._dead}")
        self.restarts -= 1
        self._dead = f"its server ended again after a restart ({why})"
        log.warning("%s ended (%s); starting it again", self.endpoint.label, why)
        try:
            await self.open()
        except ServerFailed as exc:
            self.restarts = 0
            self._dead = str(exc)
            raise ToolError(f"{self.endpoint.label} is unavailable: {exc}") from None

    async def close(self) -> None:
        self._closing.set()
        owner, self._owner = self._owner, None
        if owner is not None and not owner.done():
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(owner), 15)
            if not owner.done():
                owner.cancel()
                with contextlib.suppress(BaseException):
                    await owner


async def _all_tools(session: Any) -> list[Any]:
    import mcp_types as types

    tools: list[Any] = []
    cursor = None
    for _ in range(100):  # a server that pages forever is cut off
        result = await session.list_tools(
            params=types.PaginatedRequestParams(cursor=cursor) if cursor else None
        )
        tools.extend(result.tools)
        cursor = result.next_cursor
        if not cursor:
            break
    return tools


def _connection_lost(exc: BaseException) -> bool:
    """For a URL server, where no pipe says it ended: whether a call's error is its connection's."""
    text = f"{type(exc).__name__} {exc}".lower()
    return any(word in text for word in ("closed", "connection", "endofstream", "broken"))


def _reason(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_reason(inner) for inner in exc.exceptions)
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
