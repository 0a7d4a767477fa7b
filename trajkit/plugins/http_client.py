"""A small HTTP/1.1 client for one origin: keep-alive connections, one request each at a time.

A chat-completions request is a POST with a JSON body and a JSON answer. At a thousand sessions
in flight the HTTP client's CPU per request bounds what one event loop can drive, and a general
client (aiohttp) spends most of a turn's CPU on features a model endpoint does not need: cookies,
redirects, proxies, multipart, per-request header merging. This client writes one pre-built
request head, parses the status line, the headers and a body framed by ``Content-Length``,
``chunked`` or the end of the connection, and decompresses gzip/deflate. TLS comes from asyncio
with the system's trust store (``SSL_CERT_FILE`` is honoured).
"""

from __future__ import annotations

import asyncio
import zlib
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import ssl

MAX_HEAD = 64 * 1024


class HTTPError(Exception):
    """The connection failed or the server's answer was not HTTP/1.x."""


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: dict[str, str]  # names lower-cased
    body: bytes


class ConnectionPool:
    """Keep-alive connections to the origin of ``base_url``, at most ``limit`` open at once."""

    def __init__(self, base_url: str, headers: dict[str, str], *, limit: int) -> None:
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.tls = url.scheme == "https"
        self.path = url.path.rstrip("/")
        default_port = self.port == (443 if self.tls else 80)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.head_lines = "".join(
            f"{name}: {value}\r\n"
            for name, value in {
                "Host": host if default_port else f"{host}:{self.port}",
                "Accept-Encoding": "gzip, deflate",
                **headers,
            }.items()
        ).encode("latin-1")
        self.limit = limit
        self.busy = 0
        self.slot_waiters: deque[asyncio.Future[None]] = deque()
        self.idle: list[_Connection] = []
        self.open: set[_Connection] = set()
        self.ssl_context: ssl.SSLContext | None = None

    async def post(
        self, path: str, body: bytes, *, timeout: float, content_type: str = "application/json"
    ) -> Response:
        """POST ``body``; :class:`TimeoutError` when the answer is not whole within ``timeout`` s."""
        deadline = asyncio.get_running_loop().time() + timeout
        request = b"".join(
            (
                f"POST {self.path}{path} HTTP/1.1\r\n".encode(),
                self.head_lines,
                f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n".encode("latin-1"),
                body,
            )
        )
        while self.busy >= self.limit:  # counted by hand: an asyncio.Semaphore costs more per request
            waiter = asyncio.get_running_loop().create_future()
            self.slot_waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()  # woken, then cancelled: the slot goes to the next in line
                raise
        self.busy += 1
        try:
            while self.idle:
                connection = self.idle.pop()
                if not connection.usable:
                    self._discard(connection)  # closed by the server while idle
                    continue
                try:
                    return await self._exchange(connection, request, deadline)
                except _Stale:
                    continue  # closed by the server as the request went out: it was never read
            async with asyncio.timeout_at(deadline):
                connection = await self._connect()
            return await self._exchange(connection, request, deadline)
        finally:
            self.busy -= 1
            self._wake_one()

    def _wake_one(self) -> None:
        while self.slot_waiters:
            waiter = self.slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def _exchange(self, connection: _Connection, request: bytes, deadline: float) -> Response:
        try:
            response = await connection.request(request, deadline)
        except BaseException:
            self._discard(connection)
            raise
        if connection.usable:
            self.idle.append(connection)
        else:
            self._discard(connection)
        return response

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        if self.tls and self.ssl_context is None:
            import ssl  # only for https, and only once

            self.ssl_context = ssl.create_default_context()
        try:
            _, connection = await loop.create_connection(
                _Connection,
                self.host,
                self.port,
                ssl=self.ssl_context if self.tls else None,
                server_hostname=self.host if self.tls else None,
            )
        except OSError as exc:  # ssl.SSLError and socket.gaierror included
            raise HTTPError(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        self.open.add(connection)
        return connection

    def _discard(self, connection: _Connection) -> None:
        connection.close()
        self.open.discard(connection)

    async def close(self) -> None:
        for connection in list(self.open):
            self._discard(connection)
        self.idle.clear()


class _Stale(Exception):
    """A kept-alive connection was closed before any byte of the answer arrived."""


class _Connection(asyncio.Protocol):
    """One connection; parses a response incrementally as bytes arrive."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future[Response] | None = None
        self.lost = False
        self.used = self.reused = False
        self.keep_alive = True
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.framing = ""  # "length", "chunked" or "close", once the head is read
        self.remaining = 0
        self.position = 0  # parsed up to here within the buffer
        self.body = bytearray()
        self.received = False

    @property
    def usable(self) -> bool:
        return not self.lost and self.keep_alive

    async def request(self, request: bytes, deadline: float) -> Response:
        assert self.transport is not None
        self._reset()
        self.buffer.clear()
        self.reused, self.used = self.used, True
        loop = asyncio.get_running_loop()
        waiter = self.waiter = loop.create_future()
        # A timer of our own: cheaper per request than an asyncio.timeout() scope.
        timer = loop.call_at(deadline, _expire, waiter)
        self.transport.write(request)
        try:
            return await waiter
        finally:
            timer.cancel()
            self.waiter = None

    def close(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.close()

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.received = True
        if self.waiter is None or self.waiter.done():
            self.keep_alive = False  # bytes nobody asked for: never reuse this connection
            return
        self.buffer += data
        try:
            self._parse()
        except HTTPError as exc:
            self.keep_alive = False
            self.waiter.set_exception(exc)

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        if self.framing == "close":
            self._finish()
        elif not self.received and self.reused:
            waiter.set_exception(_Stale())
        else:
            what = "mid-answer" if self.received else "without answering"
            reason = f": {exc}" if exc else ""
            waiter.set_exception(HTTPError(f"the server closed the connection {what}{reason}"))

    # parsing

    def _parse(self) -> None:
        buffer = self.buffer
        while not self.framing:
            end = buffer.find(b"\r\n\r\n", self.position)
            if end < 0:
                if len(buffer) > MAX_HEAD:
                    raise HTTPError("response head larger than 64 KiB")
                return
            self._read_head(bytes(buffer[self.position : end]))
            self.position = end + 4
        if self.framing == "length":
            if len(buffer) - self.position >= self.remaining:
                self.body = buffer[self.position : self.position + self.remaining]
                self._finish()
        elif self.framing == "chunked":
            self._read_chunks()
        # "close": everything up to the end of the connection is the body

    def _read_head(self, head: bytes) -> None:
        status_line, *lines = head.decode("latin-1").split("\r\n")
        version, _, rest = status_line.partition(" ")
        if not version.startswith("HTTP/1."):
            raise HTTPError(f"not an HTTP/1.x answer: {status_line[:100]!r}")
        try:
            status = int(rest[:3])
        except ValueError:
            raise HTTPError(f"bad status line: {status_line[:100]!r}") from None
        if 100 <= status < 200:
            return  # an interim answer (100 Continue): the real one follows
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        self.status, self.headers = status, headers
        connection = headers.get("connection", "").lower()
        self.keep_alive = connection != "close" and (version == "HTTP/1.1" or connection == "keep-alive")
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self.framing = "chunked"
        elif "content-length" in headers:
            try:
                self.remaining = int(headers["content-length"])
            except ValueError:
                raise HTTPError(f"bad Content-Length: {headers['content-length']!r}") from None
            self.framing = "length"
        elif status in (204, 304):
            self.framing = "length"
        else:
            self.framing, self.keep_alive = "close", False

    def _read_chunks(self) -> None:
        buffer = self.buffer
        while True:
            line_end = buffer.find(b"\r\n", self.position)
            if line_end < 0:
                return
            size_text = bytes(buffer[self.position : line_end]).split(b";")[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise HTTPError(f"bad chunk size: {size_text[:20]!r}") from None
            if size == 0:  # the last chunk, then optional trailers and an empty line
                if buffer.find(b"\r\n\r\n", line_end) >= 0:
                    self._finish()
                return
            if len(buffer) < line_end + 2 + size + 2:
                return
            self.body += buffer[line_end + 2 : line_end + 2 + size]
            self.position = line_end + 2 + size + 2

    def _finish(self) -> None:
        assert self.waiter is not None
        if self.framing == "close":
            self.body = self.buffer[self.position :]
        body = bytes(self.body)
        encoding = self.headers.get("content-encoding", "").lower()
        try:
            if encoding in ("gzip", "x-gzip"):
                body = zlib.decompress(body, 16 + zlib.MAX_WBITS)
            elif encoding == "deflate":
                body = _inflate(body)
        except zlib.error as exc:
            self.waiter.set_exception(HTTPError(f"cannot decompress the {encoding} body: {exc}"))
            return
        self.waiter.set_result(Response(self.status, self.headers, body))


def _expire(waiter: asyncio.Future[Response]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


def _inflate(body: bytes) -> bytes:
    try:
        return zlib.decompress(body)
    except zlib.error:  # some servers send raw deflate without the zlib wrapper
        return zlib.decompress(body, -zlib.MAX_WBITS)
