"""The network rules of the tools that reach the network, against real loopback servers: which
addresses are refused (after resolution, on every redirect), what the allow-list lets through,
and the limits on redirects, size, time and connections per host."""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
import time
from typing import Any

import pytest
from aiohttp import web

from tests.web_servers import WebSite
from trajkit.tools.fetch import USER_AGENT, Fetcher, FetchError, Limits
from trajkit.tools.network import NetworkPolicy, Refused, address_problem, parse_host_port


@pytest.mark.parametrize(
    ("address", "problem"),
    [
        ("127.0.0.1", "a loopback address"),
        ("127.8.9.10", "a loopback address"),
        ("::1", "a loopback address"),
        ("10.0.0.7", "a private address"),
        ("172.16.4.4", "a private address"),
        ("192.168.1.1", "a private address"),
        ("fd12:3456::1", "a private address"),
        ("169.254.169.254", "a cloud metadata address"),
        ("fd00:ec2::254", "a cloud metadata address"),
        ("100.100.100.200", "a cloud metadata address"),
        ("169.254.1.1", "a link-local address"),
        ("fe80::1", "a link-local address"),
        ("100.64.0.1", "a carrier-grade NAT address"),
        ("224.0.0.251", "a multicast address"),
        ("ff02::1", "a multicast address"),
        ("0.0.0.0", "an unspecified address"),
        ("::", "an unspecified address"),
        ("240.0.0.1", "a reserved address"),
        ("::ffff:127.0.0.1", "a loopback address"),  # IPv4-mapped
        ("::ffff:169.254.169.254", "a cloud metadata address"),
        ("2002:a9fe:a9fe::", "a cloud metadata address"),  # 6to4 of 169.254.169.254
        ("64:ff9b::a00:1", "a private address"),  # NAT64 of 10.0.0.1
        ("93.184.215.14", None),
        ("2606:4700::6810:84e5", None),
    ],
)
def test_every_kind_of_non_public_address_is_refused(address: str, problem: str | None) -> None:
    assert address_problem(ipaddress.ip_address(address)) == problem


def test_allow_list_entries_are_host_and_port() -> None:
    assert parse_host_port("Intranet.Example.:8080") == ("intranet.example", 8080)
    assert parse_host_port("[::1]:8000") == ("::1", 8000)
    assert parse_host_port("127.0.0.1:80") == ("127.0.0.1", 80)
    for bad in ("intranet.example", "host:0", "host:http", "::1:80", "[zz]:80", ":80"):
        with pytest.raises(ValueError, match=r"HOST:PORT|brackets"):
            parse_host_port(bad)
    policy = NetworkPolicy.allowing(["127.0.0.1:8080", "svc.internal:443"])
    policy.check_host("127.0.0.1", 8080)
    with pytest.raises(Refused, match=re.escape("127.0.0.1 is a loopback address")):
        policy.check_host("127.0.0.1", 8081)  # the same address on another port is not allowed
    found = [
        {"hostname": "svc.internal", "host": "10.9.9.9", "port": 443, "family": 2, "proto": 0, "flags": 0}
    ]
    assert policy.check_resolved("svc.internal", 443, found) == found  # type: ignore[arg-type]


class FakeDNS:
    """A resolver at aiohttp's resolver interface: names in ``table`` resolve to the given
    addresses, anything else to 127.0.0.1 (where the test server listens)."""

    def __init__(self, table: dict[str, str]) -> None:
        self.table = table
        self.asked: list[str] = []

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list[dict[str, Any]]:
        self.asked.append(host)
        return self.answer(host, self.address(host), port)

    def address(self, host: str) -> str:
        return self.table.get(host, "127.0.0.1")

    @staticmethod
    def answer(host: str, address: str, port: int) -> list[dict[str, Any]]:
        """What aiohttp's resolvers answer (``aiohttp.abc.ResolveResult``)."""
        return [
            {
                "hostname": host,
                "host": address,
                "port": port,
                "family": socket.AF_INET,
                "proto": 0,
                "flags": 0,
            }
        ]

    async def close(self) -> None:
        pass


def fetcher(site: WebSite, *, allow: bool = True, dns: FakeDNS | None = None, **limits: Any) -> Fetcher:
    policy = NetworkPolicy.allowing([site.host_port] if allow else [])
    return Fetcher(policy, Limits(**limits), resolver=dns)  # type: ignore[arg-type]


async def test_loopback_needs_the_allow_list_and_redirects_are_followed_and_capped() -> None:
    async with WebSite().serving() as site:
        async with fetcher(site, allow=False) as closed:
            with pytest.raises(FetchError, match=re.escape("127.0.0.1 is a loopback address")):
                await closed.fetch(f"{site.url}/article")
        async with fetcher(site, max_redirects=3) as http:
            followed = await http.fetch(f"{site.url}/redirect?hops=3")
            assert followed.status == 200 and followed.url == f"{site.url}/article"
            assert b"Lighthouses of the North Sea" in followed.body
            with pytest.raises(FetchError, match="more than 3 redirects"):
                await http.fetch(f"{site.url}/redirect?hops=4")
            with pytest.raises(FetchError, match="more than 3 redirects"):
                await http.fetch(f"{site.url}/loop")
            with pytest.raises(FetchError, match="only http and https"):
                await http.fetch("file:///etc/passwd")
        async with fetcher(site, max_redirects=0) as api:
            with pytest.raises(FetchError, match="a redirect; it is not followed"):
                await api.fetch(f"{site.url}/redirect?hops=1")


@pytest.mark.parametrize(
    ("target", "refusal"),
    [
        ("http://10.1.2.3/secret", "10.1.2.3 is a private address"),
        ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 is a cloud metadata address"),
        ("http://127.0.0.1:{other}/", "127.0.0.1 is a loopback address"),
        ("http://localhost:{other}/article", "localhost resolves to 127.0.0.1, a loopback address"),
        ("http://[::ffff:127.0.0.1]:{port}/article", "is a loopback address"),
    ],
)
async def test_a_redirect_to_a_private_address_is_refused_though_the_server_is_allowed(
    target: str, refusal: str
) -> None:
    async with WebSite().serving() as site:
        site.private_target = target.format(port=site.port, other=site.port + 1)
        async with fetcher(site) as http:
            with pytest.raises(FetchError) as caught:
                await http.fetch(f"{site.url}/to-private")
        assert f"{site.url}/to-private redirected to" in str(caught.value)
        assert refusal in str(caught.value)


async def test_a_name_resolving_to_the_metadata_address_is_refused_after_resolution() -> None:
    dns = FakeDNS({"metadata.example.test": "169.254.169.254", "www.example.test": "127.0.0.1"})
    async with WebSite().serving() as site:
        # the test server's address is allowed, so a name that resolves to it is fetched...
        async with fetcher(site, dns=dns) as http:
            page = await http.fetch(f"http://www.example.test:{site.port}/notes.txt")
            assert page.body.startswith(b"plain notes")
            # ...and one that resolves to the metadata service is not, whatever port it names
            for port in (80, site.port):
                with pytest.raises(
                    FetchError,
                    match=re.escape("metadata.example.test resolves to 169.254.169.254, a cloud metadata"),
                ):
                    await http.fetch(f"http://metadata.example.test:{port}/latest/meta-data/iam")
        assert "metadata.example.test" in dns.asked


async def test_the_connection_goes_to_the_address_that_was_checked() -> None:
    """A name that resolves to a public address when checked and to a private one later cannot
    be fetched at the private one: the connector connects to the checked answer, never asks again."""

    class Rebinding(FakeDNS):
        def address(self, host: str) -> str:
            return "93.184.215.14" if len(self.asked) == 1 else "127.0.0.1"

    dns = Rebinding({})
    async with WebSite().serving() as site, fetcher(site, allow=False, dns=dns, timeout=2) as http:
        with pytest.raises(FetchError) as caught:
            await http.fetch(f"http://rebind.example.test:{site.port}/article")
    # the first answer (public) was the one used: the connection went there and failed; the
    # loopback answer a second lookup would have given was never connected to
    assert "loopback" not in str(caught.value)
    assert dns.asked == ["rebind.example.test"]


async def test_a_gigabyte_body_is_refused_while_streaming_and_never_held() -> None:
    async with WebSite().serving() as site:
        async with fetcher(site, max_bytes=4 << 20) as http:
            started = time.monotonic()
            with pytest.raises(FetchError, match="more than the 4194304 bytes allowed"):
                await http.fetch(f"{site.url}/huge")
            elapsed = time.monotonic() - started
        await asyncio.sleep(0.2)  # the server notices the client went away
    # the client stopped reading at the limit: the server could write only what fits in the
    # socket buffers beyond it, nowhere near the gigabyte it meant to send
    assert site.sent_bytes["/huge"] < 64 << 20, site.sent_bytes
    assert elapsed < 30


async def test_a_slow_body_is_cut_at_the_time_limit() -> None:
    async with WebSite().serving() as site, fetcher(site, timeout=1.0) as http:
        started = time.monotonic()
        with pytest.raises(FetchError, match="no complete answer within 1s"):
            await http.fetch(f"{site.url}/slow")
        assert time.monotonic() - started < 10


async def test_the_content_type_is_checked_before_the_body_is_read() -> None:
    async with WebSite().serving() as site, fetcher(site) as http:
        with pytest.raises(FetchError, match="its content type is video/mp4"):
            await http.fetch(f"{site.url}/video", accept=lambda kind: kind.startswith("text/"))
        missing = await http.fetch(f"{site.url}/missing", accept=lambda kind: kind == "image/png")
        assert missing.status == 404  # an error answer is the caller's to judge


async def test_connections_per_host_are_limited_and_requests_name_trajkit() -> None:
    active, most, agents = 0, 0, set()

    async def handler(request: web.Request) -> web.Response:
        nonlocal active, most
        agents.add(request.headers.get("User-Agent"))
        active += 1
        most = max(most, active)
        await asyncio.sleep(0.2)
        active -= 1
        return web.Response(text="ok", headers={"Set-Cookie": "session=abc; Path=/"})

    app = web.Application()
    app.router.add_get("/", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    try:
        async with Fetcher(
            NetworkPolicy.allowing([f"127.0.0.1:{port}"]), Limits(connections_per_host=2)
        ) as http:
            await asyncio.gather(*(http.fetch(f"http://127.0.0.1:{port}/") for _ in range(6)))
            assert http._client().cookie_jar.filter_cookies(f"http://127.0.0.1:{port}/") == {}  # type: ignore[comparison-overlap]
    finally:
        await runner.cleanup()
    assert most == 2
    assert agents == {USER_AGENT} and USER_AGENT.startswith("trajkit/")
