"""The browser's filtering proxy on its own, spoken to as a browser speaks to it (absolute-form
requests and ``CONNECT``), with a loopback server of the test as the one allowed host."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from tests.test_browser_tools import loopback
from trajkit.plugins.browser.proxy import FilteringProxy
from trajkit.tools.network import NetworkPolicy


@contextlib.asynccontextmanager
async def upstream() -> AsyncIterator[str]:
    """A loopback server: ``/`` answers, ``/away`` redirects to a private address."""

    async def hello(request: web.Request) -> web.Response:
        return web.Response(text=f"hello {request.headers.get('X-Who', '')}")

    async def away(request: web.Request) -> web.Response:
        raise web.HTTPFound("http://10.0.0.1/secret")

    app = web.Application()
    app.router.add_get("/", hello)
    app.router.add_get("/away", away)
    async with loopback(app) as host:
        yield host


@contextlib.asynccontextmanager
async def proxied() -> AsyncIterator[tuple[str, FilteringProxy, aiohttp.ClientSession]]:
    async with upstream() as host:
        proxy = FilteringProxy(NetworkPolicy.allowing([host]))
        await proxy.start()
        try:
            async with aiohttp.ClientSession() as client:
                yield host, proxy, client
        finally:
            await proxy.aclose()


async def test_plain_requests_pass_to_allowed_hosts_and_each_redirect_hop_comes_back_to_be_judged() -> None:
    async with proxied() as (host, proxy, client):
        gate = await proxy.open_gate()
        async with client.get(f"http://{host}/", proxy=gate.server, headers={"X-Who": "ada"}) as answer:
            assert answer.status == 200 and await answer.text() == "hello ada"
        async with client.get(f"http://{host}/away", proxy=gate.server, allow_redirects=False) as answer:
            assert answer.status == 302 and answer.headers["Location"] == "http://10.0.0.1/secret"
        async with client.get("http://10.0.0.1/secret", proxy=gate.server) as answer:
            assert answer.status == 403 and answer.headers["X-Trajkit-Refused"] == "1"
            assert await answer.text() == "http://10.0.0.1/secret refused: 10.0.0.1 is a private address"
        other = await proxy.open_gate()  # another session's port knows nothing of this refusal
        assert gate.take_refusals() == ["http://10.0.0.1/secret refused: 10.0.0.1 is a private address"]
        assert other.take_refusals() == [] and gate.take_refusals() == []


async def test_tunnels_reach_allowed_hosts_only_and_carry_bytes_both_ways() -> None:
    async with proxied() as (host, proxy, _):
        gate = await proxy.open_gate()
        reader, writer = await asyncio.open_connection("127.0.0.1", gate.port)
        writer.write(b"CONNECT 169.254.169.254:443 HTTP/1.1\r\nHost: 169.254.169.254:443\r\n\r\n")
        assert (await reader.readline()).startswith(b"HTTP/1.1 403")
        writer.close()
        assert gate.take_refusals() == [
            "169.254.169.254:443 refused: 169.254.169.254 is a cloud metadata address"
        ]
        # bytes both ways through a tunnel to the allowed host (Chromium's https and WebSockets)
        reader, writer = await asyncio.open_connection("127.0.0.1", gate.port)
        writer.write(f"CONNECT {host} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 200 Connection established\r\n\r\n"
        writer.write(f"GET / HTTP/1.1\r\nHost: {host}\r\nX-Who: tunnel\r\nConnection: close\r\n\r\n".encode())
        answer = await asyncio.wait_for(reader.read(), 10)
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"hello tunnel")
        writer.close()


async def test_the_launch_port_refuses_all_of_the_browsers_own_traffic() -> None:
    async with proxied() as (host, proxy, client):
        assert proxy.background is not None
        async with client.get(f"http://{host}/", proxy=proxy.background.server) as answer:
            assert answer.status == 403  # even an allowed host
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.background.port)
        writer.write(b"CONNECT update.googleapis.com:443 HTTP/1.1\r\n\r\n")
        assert (await reader.readline()).startswith(b"HTTP/1.1 403")
        writer.close()
        assert proxy.background.take_refusals() == [
            f"http://{host}/: the browser's own traffic is not let through",
            "update.googleapis.com:443: the browser's own traffic is not let through",
        ]
