"""The filtering proxy every request of the ``browser`` toolset's Chromium goes through.

Playwright's request interception never sees a redirect's later hops (a 302 to a private address
would load unseen), so the runner owns an HTTP proxy (an aiohttp server) and Chromium is told to
use it for everything, loopback included. Each hop is a separate request to the proxy, and each is
judged by the run's :class:`~trajkit.tools.network.NetworkPolicy`: plain ``http://`` requests are
forwarded by an aiohttp client whose resolver refuses what the policy refuses (redirects are
passed back to the browser, which asks again for the next hop); ``https://`` and WebSocket
traffic arrives as ``CONNECT host:port`` and is tunnelled to an address the policy let through.

Each browser context gets its own listening port (a :class:`Gate`), so a refusal is known to the
session whose page caused it and its tools can say what was refused and why. The browser's own
background traffic (update and account checks) comes through the port given at launch, which
refuses everything.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trajkit.tools.network import GuardedResolver, NetworkPolicy, Refused, public

if TYPE_CHECKING:
    from aiohttp import ClientSession, web

log = logging.getLogger("trajkit")

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
"""Headers that belong to one connection, not to the request or answer the proxy passes on."""
MAX_HEAD = 16 * 1024
"""Most bytes of a CONNECT request's head."""
KEPT_REFUSALS = 20
"""Refusals a gate remembers for its session's tools (the latest ones)."""


@dataclass(eq=False)
class Gate:
    """One browser context's way through the proxy: its own port, and what was refused there."""

    port: int
    listener: asyncio.Server = field(repr=False)
    http: web.Server = field(repr=False)
    refusals: list[str] = field(default_factory=list)
    """What the policy refused, oldest first: ``"http://10.0.0.1/ refused: ..."``."""
    refuse_all: bool = False
    """The launch port: the browser's own traffic, none of it let through."""

    @property
    def server(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def refused(self, message: str) -> None:
        self.refusals.append(message)
        del self.refusals[:-KEPT_REFUSALS]

    def take_refusals(self) -> list[str]:
        """The refusals since the last call, and forget them."""
        taken, self.refusals = self.refusals, []
        return taken


class FilteringProxy:
    """An HTTP/CONNECT proxy on loopback applying ``policy`` to every request; open it inside the
    event loop that uses it, close it with :meth:`aclose`."""

    def __init__(
        self, policy: NetworkPolicy, *, connect_timeout: float = 15.0, connections_per_host: int = 16
    ) -> None:
        self.policy = policy
        self.connect_timeout = connect_timeout
        self.connections_per_host = connections_per_host
        self.background: Gate | None = None
        """The port given at launch: the browser's own traffic, all refused."""
        self._gates: set[Gate] = set()
        self._client: ClientSession | None = None
        self._resolver = GuardedResolver(policy)
        self._tunnels: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        import aiohttp

        resolver: Any = self._resolver  # aiohttp's resolver interface, without importing it at load
        connector = aiohttp.TCPConnector(
            resolver=resolver, limit=0, limit_per_host=self.connections_per_host, ttl_dns_cache=30
        )
        self._client = aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),  # the browser keeps each context's cookies
            trust_env=False,
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout),
        )
        self.background = await self.open_gate(refuse_all=True)

    async def open_gate(self, *, refuse_all: bool = False) -> Gate:
        """A new port for one browser context."""
        from aiohttp import web

        loop = asyncio.get_running_loop()
        gate: Gate | None = None

        async def handle(request: web.BaseRequest) -> web.StreamResponse:
            assert gate is not None
            return await self._handle(request, gate)

        http = web.Server(handle)
        listener = await loop.create_server(lambda: _Front(self, gate, http), "127.0.0.1", 0)  # type: ignore[arg-type]
        gate = Gate(listener.sockets[0].getsockname()[1], listener, http, refuse_all=refuse_all)
        self._gates.add(gate)
        return gate

    async def close_gate(self, gate: Gate) -> None:
        self._gates.discard(gate)
        gate.listener.close()
        await gate.http.shutdown(1.0)

    async def aclose(self) -> None:
        for task in list(self._tunnels):
            task.cancel()
        if self._tunnels:
            await asyncio.gather(*self._tunnels, return_exceptions=True)
        for gate in list(self._gates):
            await self.close_gate(gate)
        if self._client is not None:
            await self._client.close()
        await self._resolver.close()

    async def _handle(self, request: web.BaseRequest, gate: Gate) -> web.StreamResponse:
        """A plain ``http://`` request (absolute-form): forwarded under the policy."""
        from aiohttp import web

        url = request.url
        if request.method == "CONNECT" or not url.absolute or url.scheme != "http":
            return web.Response(status=400, text="a proxy request names an absolute http:// URL")
        shown = public(str(url))
        if gate.refuse_all:
            gate.refused(f"{shown}: the browser's own traffic is not let through")
            return _refusal(gate.refusals[-1])
        try:
            self.policy.check_host(url.raw_host or "", url.port or 80)
            return await self._forward(request, str(url))
        except Refused as exc:
            message = f"{shown} refused: {exc}"
            gate.refused(message)
            return _refusal(message)

    async def _forward(self, request: web.BaseRequest, url: str) -> web.StreamResponse:
        from aiohttp import ClientError, web

        assert self._client is not None
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP]
        body = request.content if request.can_read_body else None
        try:
            async with self._client.request(
                request.method, url, headers=headers, data=body, allow_redirects=False
            ) as upstream:
                response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
                for key, value in upstream.headers.items():
                    if key.lower() not in HOP_BY_HOP:
                        response.headers.add(key, value)
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
        except ClientError as exc:
            if isinstance(exc.__cause__, Refused):
                raise exc.__cause__ from None
            return web.Response(status=502, text=f"{public(url)}: {type(exc).__name__}")

    def start_tunnel(self, gate: Gate, head: bytes, reader: asyncio.StreamReader, writer: Any) -> None:
        task = asyncio.get_running_loop().create_task(self._tunnel(gate, head, reader, writer))
        self._tunnels.add(task)
        task.add_done_callback(self._tunnels.discard)

    async def _tunnel(self, gate: Gate, head: bytes, reader: asyncio.StreamReader, writer: Any) -> None:
        """Answer ``CONNECT host:port`` (the request's ``head``) and copy bytes both ways."""
        try:
            status, upstream = await self._open_tunnel(gate, head)
            writer.write(status)
            if upstream is None:
                return
            try:
                await _pipe(reader, writer, *upstream)
            finally:
                upstream[1].close()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _open_tunnel(self, gate: Gate, head: bytes) -> tuple[bytes, Any]:
        line = head.split(b"\r\n", 1)[0].decode("latin-1")
        target = line.split(" ")[1] if line.count(" ") == 2 else ""
        host, _, port_text = target.rpartition(":")
        if not host or not port_text.isdigit():
            return _status(400, "CONNECT needs host:port"), None
        host, port = host.strip("[]"), int(port_text)
        if gate.refuse_all:
            gate.refused(f"{target}: the browser's own traffic is not let through")
            return _status(403, gate.refusals[-1]), None
        try:
            self.policy.check_host(host, port)
            found = await self._resolver.resolve(host, port)
        except Refused as exc:
            message = f"{target} refused: {exc}"
            gate.refused(message)
            return _status(403, message), None
        except OSError as exc:
            return _status(502, f"cannot resolve {host}: {_reason(exc)}"), None
        try:
            async with asyncio.timeout(self.connect_timeout):
                upstream = await asyncio.open_connection(found[0]["host"], port)
        except (OSError, TimeoutError) as exc:
            return _status(502, f"cannot connect to {target}: {_reason(exc)}"), None
        return b"HTTP/1.1 200 Connection established\r\n\r\n", upstream


class _Front(asyncio.Protocol):
    """A connection to a gate: ``CONNECT`` becomes a tunnel, anything else goes to aiohttp's HTTP
    server (its parser would read a tunnel's bytes as further requests)."""

    def __init__(self, proxy: FilteringProxy, gate: Gate, http: web.Server) -> None:
        self.proxy, self.gate, self.http = proxy, gate, http
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.buffer += data
        if len(self.buffer) < len(b"CONNECT ") and b"CONNECT ".startswith(self.buffer):
            return
        if not self.buffer.startswith(b"CONNECT "):
            handler = self.http()
            self.transport.set_protocol(handler)
            handler.connection_made(self.transport)
            handler.data_received(self.buffer)
            return
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > MAX_HEAD:
                self.transport.close()
            return
        head, rest = self.buffer[: end + 4], self.buffer[end + 4 :]
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 16)
        protocol = asyncio.StreamReaderProtocol(reader)
        self.transport.set_protocol(protocol)
        protocol.connection_made(self.transport)
        if rest:
            reader.feed_data(rest)
        writer = asyncio.StreamWriter(self.transport, protocol, reader, loop)
        self.proxy.start_tunnel(self.gate, head, reader, writer)


def _status(code: int, message: str) -> bytes:
    body = message.encode()
    reason = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway"}[code]
    return (
        f"HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
        "X-Trajkit-Refused: 1\r\nConnection: close\r\n\r\n"
    ).encode() + body


async def _pipe(
    reader: asyncio.StreamReader, writer: Any, up_reader: asyncio.StreamReader, up_writer: Any
) -> None:
    """Copy bytes both ways until either side closes."""

    async def copy(source: asyncio.StreamReader, sink: Any) -> None:
        while chunk := await source.read(1 << 16):
            sink.write(chunk)
            await sink.drain()

    tasks = [asyncio.ensure_future(copy(reader, up_writer)), asyncio.ensure_future(copy(up_reader, writer))]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    return getattr(exc, "strerror", None) or type(exc).__name__


def _refusal(message: str) -> web.Response:
    from aiohttp import web

    return web.Response(status=403, text=message, headers={"X-Trajkit-Refused": "1"})
