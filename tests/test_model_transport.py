"""The model transports against real sockets serving hand-framed answers: what is sent, what is
read, and what happens when a connection closes, an answer is too long or redirects."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from trajkit.model import ModelEndpointError, ModelError
from trajkit.plugins.openai.transport import AiohttpTransport, Retry, SDKTransport, Transport

# request headers, body, index of the request on its connection -> the answer's bytes, or None to
# close the connection without answering
Answer = Callable[[dict[str, str], bytes, int], Awaitable[bytes | None]]
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
PAYLOAD = json.dumps({"choices": [{"message": {"content": "é" * 5000}}]}).encode()


class Server:
    """Reads each request fully, then writes the answer (or hangs up)."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.open = 0
        self.most_open = 0
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.writers: list[asyncio.StreamWriter] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        self.writers.append(writer)
        index = 0
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                request_line, *lines = head.decode("latin-1").split("\r\n")[:-2]
                headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.requests.append((request_line, headers, body))
                answer = await self.answer(headers, body, index)
                index += 1
                if answer is None:
                    return
                writer.write(answer)
                await writer.drain()
        finally:
            self.open -= 1
            writer.close()


@asynccontextmanager
async def serve(answer: Answer) -> AsyncIterator[tuple[Server, str]]:
    server = Server(answer)
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        yield server, f"http://127.0.0.1:{port}/v1"
    finally:
        listener.close()
        for writer in server.writers:
            writer.close()


def ok(body: bytes = PAYLOAD, extra: str = "") -> bytes:
    return f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


def transport(url: str, kind: type[Transport] = AiohttpTransport, **kwargs: float) -> Transport:
    return kind(
        "sk-key", url, timeout=kwargs.get("timeout", 10.0), connections=int(kwargs.get("connections", 10))
    )


async def test_requests_go_as_given_over_one_kept_connection() -> None:
    async def answer(headers: dict[str, str], body: bytes, index: int) -> bytes:
        return ok(body)

    async with serve(answer) as (server, url):
        client = transport(url)
        for _ in range(5):
            assert json.loads(await client.post(BODY)) == BODY
        await client.aclose()
    assert server.connections == 1
    request_line, headers, _ = server.requests[0]
    assert request_line == "POST /v1/chat/completions HTTP/1.1"
    assert headers["authorization"] == "Bearer sk-key"
    assert headers["content-type"] == "application/json"
    assert headers["user-agent"].startswith("trajkit/")


async def test_a_post_is_never_sent_again_on_its_own_when_a_reused_connection_closes() -> None:
    """The second request reaches the server, which hangs up: that is said, not silently resent."""

    async def answer(headers: dict[str, str], body: bytes, index: int) -> bytes | None:
        return ok() if index == 0 else None

    async with serve(answer) as (server, url):
        client = transport(url)
        await client.post(BODY)
        with pytest.raises(Retry) as caught:
            await client.post(BODY)
        await client.aclose()
    assert len(server.requests) == 2, "sent once, not replayed on a new connection"
    assert caught.value.kind == "disconnected"
    assert "may have received the request" in str(caught.value)


async def test_a_connection_the_server_closed_while_idle_is_replaced_without_an_error() -> None:
    async def answer(headers: dict[str, str], body: bytes, index: int) -> bytes | None:
        return ok()

    async with serve(answer) as (server, url):
        client = transport(url)
        await client.post(BODY)
        for writer in server.writers:
            writer.close()  # the server's idle timeout
        await asyncio.sleep(0.1)
        assert json.loads(await client.post(BODY)) == json.loads(PAYLOAD)
        await client.aclose()
    assert server.connections == 2


@pytest.mark.parametrize("framing", ["length", "gzip", "chunked"])
async def test_an_answer_longer_than_the_limit_is_refused(framing: str) -> None:
    big = b"0" * (3 << 20)

    async def answer(headers: dict[str, str], body: bytes, index: int) -> bytes:
        if framing == "gzip":  # small on the wire, large once decompressed
            return ok(gzip.compress(big), "Content-Encoding: gzip\r\n")
        if framing == "chunked":
            return (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                + b"".join(
                    f"{len(big[i : i + 65536]):x}\r\n".encode() + big[i : i + 65536] + b"\r\n"
                    for i in range(0, len(big), 65536)
                )
                + b"0\r\n\r\n"
            )
        return ok(big)

    async with serve(answer) as (_, url):
        client = transport(url)
        client.max_answer = 1 << 20
        with pytest.raises(ModelError, match="longer than 1 MiB"):
            await client.post(BODY)
        client.max_answer = 4 << 20
        assert await client.post(BODY) == big  # under the limit, every framing arrives whole
        await client.aclose()


@pytest.mark.parametrize("kind", [AiohttpTransport, SDKTransport])
async def test_a_redirect_is_an_error_naming_its_target_and_is_not_followed(kind: type[Transport]) -> None:
    async def answer(headers: dict[str, str], body: bytes, index: int) -> bytes:
        return (
            b"HTTP/1.1 307 Temporary Redirect\r\nLocation: /v2/chat/completions\r\nContent-Length: 0\r\n\r\n"
        )

    async with serve(answer) as (server, url):
        client = transport(url, kind)
        with pytest.raises(ModelEndpointError) as caught:
            await client.post(BODY)
        await client.aclose()
    target = url.replace("/v1", "/v2")
    assert f"a redirect to {target}/chat/completions" in str(caught.value)
    assert f"--base_url to {target}" in str(caught.value)
    assert len(server.requests) == 1 and caught.value.stops_run


@pytest.mark.parametrize("kind", [AiohttpTransport, SDKTransport])
async def test_a_refused_connection_says_so_and_a_silent_endpoint_times_out(kind: type[Transport]) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    client = transport(f"http://127.0.0.1:{closed_port}/v1", kind)
    with pytest.raises(Retry) as refused:
        await client.post(BODY)
    await client.aclose()
    assert refused.value.kind == "connection_error"
    assert str(refused.value) == f"cannot connect to 127.0.0.1:{closed_port}: Connection refused"

    async def never(headers: dict[str, str], body: bytes, index: int) -> bytes:
        await asyncio.sleep(30)
        return ok()

    async with serve(never) as (_, url):
        client = transport(url, kind, timeout=0.3)
        with pytest.raises(Retry) as late:
            await client.post(BODY)
        await client.aclose()
    assert late.value.kind == "timeout"


async def test_no_more_connections_than_the_limit() -> None:
    async def answer(headers: dict[str, str], body: bytes, index: int) -> bytes:
        await asyncio.sleep(0.05)
        return ok()

    async with serve(answer) as (server, url):
        client = transport(url, connections=2)
        await asyncio.gather(*(client.post(BODY) for _ in range(8)))
        await client.aclose()
    assert server.most_open == 2 and len(server.requests) == 8
