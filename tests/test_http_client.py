"""The built-in HTTP/1.1 client against real sockets serving hand-framed answers."""

from __future__ import annotations

import asyncio
import gzip
import json
import ssl
import subprocess
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from trajkit.plugins.http_client import ConnectionPool, HTTPError

# request headers, body, index of the request on its connection -> the answer's pieces, or None to
# close the connection without answering; CLOSE as the last piece closes it after the answer
CLOSE = b""
Answer = Callable[[dict[str, str], bytes, int], Awaitable[list[bytes] | None]]


class Server:
    """Reads each request fully, then writes the answer's pieces one at a time."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.writers: list[asyncio.StreamWriter] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        index = 0
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                request_line, *lines = head.decode("latin-1").split("\r\n")[:-2]
                headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.requests.append((request_line, headers, body))
                pieces = await self.answer(headers, body, index)
                index += 1
                if pieces is None:
                    return
                for piece in pieces:
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0)
                if pieces[-1:] == [CLOSE]:
                    return
        finally:
            writer.close()


@asynccontextmanager
async def serve(
    answer: Answer, ssl_context: ssl.SSLContext | None = None
) -> AsyncIterator[tuple[Server, str]]:
    server = Server(answer)
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0, ssl=ssl_context)
    port = listener.sockets[0].getsockname()[1]
    try:
        yield server, f"{'https' if ssl_context else 'http'}://localhost:{port}/v1"
    finally:
        listener.close()
        for writer in server.writers:
            writer.close()


def ok(body: bytes, extra: str = "") -> list[bytes]:
    return [f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body]


def chunked(body: bytes, size: int) -> bytes:
    parts = [
        f"{len(body[i : i + size]):x};ext=1\r\n".encode() + body[i : i + size] + b"\r\n"
        for i in range(0, len(body), size)
    ]
    return b"".join(parts) + b"0\r\nX-Trailer: yes\r\n\r\n"


def pool_for(url: str, limit: int = 10) -> ConnectionPool:
    return ConnectionPool(url, {"Authorization": "Bearer k"}, limit=limit)


PAYLOAD = json.dumps({"choices": [{"message": {"content": "é" * 5000}}]}).encode()


async def test_keep_alive_reuses_one_connection_and_sends_the_request_as_given() -> None:
    async def answer(headers: dict[str, str], body: bytes, index: int) -> list[bytes]:
        return ok(body[::-1])

    async with serve(answer) as (server, url):
        pool = pool_for(url)
        for i in range(20):
            response = await pool.post("/chat/completions", f"body {i}".encode(), timeout=10)
            assert (response.status, response.body) == (200, f"body {i}".encode()[::-1])
        await pool.close()
    assert server.connections == 1
    request_line, headers, _ = server.requests[0]
    assert request_line == "POST /v1/chat/completions HTTP/1.1"
    assert headers["host"] == f"localhost:{url.rsplit(':', 1)[1].split('/')[0]}"
    assert headers["authorization"] == "Bearer k"
    assert headers["content-type"] == "application/json"


@pytest.mark.parametrize(
    "framing", ["length", "chunked", "close", "length-then-close", "gzip", "deflate", "interim"]
)
async def test_every_framing_arrives_whole_even_one_byte_at_a_time(framing: str) -> None:
    async def answer(headers: dict[str, str], body: bytes, index: int) -> list[bytes]:
        if framing == "length":
            raw = ok(PAYLOAD)[0]
        elif framing == "chunked":
            raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(PAYLOAD, 777)
        elif framing == "close":
            raw = b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + PAYLOAD
        elif framing == "length-then-close":
            raw = ok(PAYLOAD, "Connection: close\r\n")[0]
        elif framing == "gzip":
            raw = ok(gzip.compress(PAYLOAD), "Content-Encoding: gzip\r\n")[0]
        elif framing == "deflate":
            raw = ok(zlib.compress(PAYLOAD), "Content-Encoding: deflate\r\n")[0]
        else:
            raw = b"HTTP/1.1 100 Continue\r\n\r\n" + ok(PAYLOAD)[0]
        # whole, then byte by byte on the next request
        pieces = [raw] if index % 2 == 0 else [raw[i : i + 1] for i in range(len(raw))]
        return [*pieces, CLOSE] if framing.endswith("close") else pieces

    async with serve(answer) as (server, url):
        pool = pool_for(url)
        for _ in range(2):
            response = await pool.post("/chat/completions", b"{}", timeout=10)
            assert response.status == 200
            assert response.body == PAYLOAD
        await pool.close()
    # framed answers keep the connection; an answer ending with a close needs a new one
    assert server.connections == (2 if framing.endswith("close") else 1)


async def test_a_connection_closed_while_idle_is_replaced_without_an_error() -> None:
    async def answer(headers: dict[str, str], body: bytes, index: int) -> list[bytes]:
        return ok(b"fine")

    async with serve(answer) as (server, url):
        pool = pool_for(url)
        assert (await pool.post("/x", b"1", timeout=10)).body == b"fine"
        for writer in server.writers:  # the server drops its idle keep-alive connections
            writer.close()
        await asyncio.sleep(0.05)
        assert (await pool.post("/x", b"2", timeout=10)).body == b"fine"
        await pool.close()
    assert server.connections == 2


async def test_a_close_racing_the_request_is_retried_once_on_a_new_connection() -> None:
    async def answer(headers: dict[str, str], body: bytes, index: int) -> list[bytes] | None:
        if body == b"second" and index == 1:
            return None  # read the request, then close without a byte of answer
        return ok(b"answered " + body)

    async with serve(answer) as (server, url):
        pool = pool_for(url)
        await pool.post("/x", b"first", timeout=10)
        assert (await pool.post("/x", b"second", timeout=10)).body == b"answered second"
        await pool.close()
    assert server.connections == 2


async def test_a_fresh_connection_closed_without_an_answer_is_an_error() -> None:
    async def answer(headers: dict[str, str], body: bytes, index: int) -> list[bytes] | None:
        return None

    async with serve(answer) as (_, url):
        pool = pool_for(url)
        with pytest.raises(HTTPError, match="without answering"):
            await pool.post("/x", b"{}", timeout=10)
        await pool.close()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial", "mid-answer"),
        (b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP/1.x answer"),
        (b"HTTP/1.1 2xx OK\r\n\r\n", "bad status line"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
        (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 3\r\n\r\nabc", "cannot decompress"),
    ],
)
async def test_a_broken_answer_is_an_error_and_the_connection_is_dropped(raw: bytes, message: str) -> None:
    async def answer(headers: dict[str, str], body: bytes, index: int) -> list[bytes] | None:
        return [raw, CLOSE] if body == b"bad" else ok(b"good")

    async with serve(answer) as (server, url):
        pool = pool_for(url)
        with pytest.raises(HTTPError, match=message):
            await pool.post("/x", b"bad", timeout=10)
        assert (await pool.post("/x", b"next", timeout=10)).body == b"good"
        await pool.close()
    assert server.connections == 2


async def test_error_statuses_and_headers_come_back_as_they_are() -> None:
    async def answer(headers: dict[str, str], body: bytes, index: int) -> list[bytes]:
        return [b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\nContent-Length: 2\r\n\r\n{}"]

    async with serve(answer) as (_, url):
        pool = pool_for(url)
        response = await pool.post("/x", b"{}", timeout=10)
        await pool.close()
    assert (response.status, response.headers["retry-after"], response.body) == (429, "7", b"{}")


async def test_no_more_connections_than_the_limit() -> None:
    in_flight = peak = 0

    async def answer(headers: dict[str, str], body: bytes, index: int) -> list[bytes]:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.02)
        in_flight -= 1
        return ok(body)

    async with serve(answer) as (server, url):
        pool = pool_for(url, limit=4)
        bodies = [f"{i}".encode() for i in range(40)]
        responses = await asyncio.gather(*(pool.post("/x", b, timeout=10) for b in bodies))
        await pool.close()
    assert [r.body for r in responses] == bodies
    assert peak == 4
    assert server.connections == 4


async def test_tls_with_the_trust_store_from_ssl_cert_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)

    async def answer(headers: dict[str, str], body: bytes, index: int) -> list[bytes]:
        return ok(b"secure " + body)

    async with serve(answer, server_context) as (_, url):
        untrusting = pool_for(url)
        with pytest.raises(HTTPError, match="CERTIFICATE_VERIFY_FAILED"):
            await untrusting.post("/x", b"{}", timeout=10)
        await untrusting.close()
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        pool = pool_for(url)
        assert (await pool.post("/x", b"hello", timeout=10)).body == b"secure hello"
        await pool.close()


def test_only_http_urls() -> None:
    with pytest.raises(ValueError, match="not an http"):
        ConnectionPool("ftp://example.com", {}, limit=1)


async def test_a_late_answer_times_out_and_its_connection_is_not_reused() -> None:
    async def answer(headers: dict[str, str], body: bytes, index: int) -> list[bytes]:
        if body == b"slow":
            await asyncio.sleep(5)
        return ok(b"quick")

    async with serve(answer) as (server, url):
        pool = pool_for(url)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(TimeoutError):
            await pool.post("/x", b"slow", timeout=0.3)
        assert 0.3 <= loop.time() - started < 2
        assert (await pool.post("/x", b"next", timeout=10)).body == b"quick"
        await pool.close()
    assert server.connections == 2
