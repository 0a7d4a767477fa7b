"""Loopback web servers for the web, vision and image tests (aiohttp.web, real HTTP).

One application serves pages (an article inside boilerplate, a PDF, redirects, a body of a
gigabyte, a body that trickles, an image), a SearXNG-compatible ``/searxng/search`` and the
hosted search APIs (Brave, Exa, Tavily, Firecrawl) under prefixes of their own, and an
OpenAI-compatible ``/v1/images/generations``. Every API request is recorded with its headers and
body, so a test can see what was sent where.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import struct
import threading
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

GIGABYTE = 1 << 30

ARTICLE = """<!doctype html>
<html><head><meta charset="utf-8"><title>Lighthouses of the North Sea</title></head>
<body>
<nav><a href="/">Home</a> | <a href="/shop">Shop</a> | <a href="/login">Log in</a> NAVIGATION-BOILERPLATE</nav>
<aside class="sidebar"><ul><li>Trending: SIDEBAR-BOILERPLATE celebrity news</li>
<li>Subscribe to our newsletter</li></ul></aside>
<main><article>
<h1>Lighthouses of the North Sea</h1>
<p>The keepers of the Longstone lighthouse logged every passing ship for ninety years. Their
ledgers, kept in the county archive, record storms, wrecks and rescues in a careful hand.</p>
<p>In 1838 Grace Darling and her father rowed out to the wreck of the <b>Forfarshire</b> and
brought nine survivors back; see <a href="https://example.org/grace">her biography</a>.</p>
<ul><li>Longstone, lit 1826</li><li>Bell Rock, lit 1811</li></ul>
</article></main>
<footer>Copyright 2026 FOOTER-BOILERPLATE. Privacy policy. Cookie settings.</footer>
</body></html>
"""


def png(width: int = 3, height: int = 2) -> bytes:
    """A real PNG image of ``width`` x ``height`` red pixels."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    query: dict[str, str]
    body: Any


@dataclass
class WebSite:
    """The application, served on 127.0.0.1 (a thread of its own, or the running loop)."""

    private_target: str = "http://10.1.2.3/secret"
    """Where /to-private redirects."""
    requests: list[Recorded] = field(default_factory=list)
    sent_bytes: dict[str, int] = field(default_factory=dict)
    """Path -> bytes a streaming handler managed to write before the client hung up."""
    port: int = 0
    waiting: int = 0
    most_waiting: int = 0
    _runner: web.AppRunner | None = None
    _thread: threading.Thread | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    _stop: asyncio.Event | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def host_port(self) -> str:
        return f"127.0.0.1:{self.port}"

    def app(self) -> web.Application:
        app = web.Application()
        get, post = app.router.add_get, app.router.add_post
        get("/article", answer(lambda: web.Response(text=ARTICLE, content_type="text/html")))
        get("/report.pdf", answer(lambda: web.Response(body=report_pdf(), content_type="application/pdf")))
        get("/notes.txt", answer(lambda: web.Response(text="plain notes, line one\nline two")))
        get("/image.png", answer(lambda: web.Response(body=png(), content_type="image/png")))
        get("/video", answer(lambda: web.Response(body=b"\x00" * 64, content_type="video/mp4")))
        get("/missing", answer(lambda: web.Response(status=404, text="not here")))
        get("/redirect", self._redirect)
        get("/loop", answer(lambda: _found("/loop")))
        get("/to-private", answer(lambda: _found(self.private_target)))
        get("/huge", self._huge)
        get("/wait/{name}", self._wait)
        get("/slow", self._slow)
        get("/searxng/search", self._searxng)
        get("/brave/res/v1/web/search", self._brave)
        post("/exa/search", self._exa)
        post("/tavily/search", self._tavily_search)
        post("/tavily/extract", self._tavily_extract)
        for version in ("v1", "v2"):
            post(f"/firecrawl/{version}/search", self._firecrawl_search)
            post(f"/firecrawl/{version}/scrape", self._firecrawl_scrape)
        post("/v1/images/generations", self._images)
        return app

    # -- pages --------------------------------------------------------------------------------

    async def _redirect(self, request: web.Request) -> web.Response:
        hops = int(request.query.get("hops", "2"))
        return _found(f"/redirect?hops={hops - 1}" if hops > 1 else "/article")

    async def _wait(self, request: web.Request) -> web.Response:
        """A page answered after 0.2 s; ``most_waiting`` counts how many were asked at once."""
        self.waiting += 1
        self.most_waiting = max(self.most_waiting, self.waiting)
        await asyncio.sleep(0.2)
        self.waiting -= 1
        return web.Response(text=f"page {request.match_info['name']}")

    async def _huge(self, request: web.Request) -> web.StreamResponse:
        """A gigabyte of text, written in chunks as the client reads: never a length, never in memory."""
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        chunk = b"x" * (1 << 20)
        self.sent_bytes["/huge"] = 0
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            for _ in range(GIGABYTE // len(chunk)):
                await response.write(chunk)
                self.sent_bytes["/huge"] += len(chunk)
        return response

    async def _slow(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/html"})
        await response.prepare(request)
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            for _ in range(600):
                await response.write(b"<p>drip</p>")
                await asyncio.sleep(0.1)
        return response

    # -- search APIs ----------------------------------------------------------------------------

    async def _record(self, request: web.Request) -> Any:
        body = await request.json() if request.can_read_body else None
        self.requests.append(Recorded(request.path, dict(request.headers), dict(request.query), body))
        return body

    def _hits(self, query: str, count: int) -> list[dict[str, str]]:
        return [
            {
                "title": f"Result {n} for {query}",
                "url": f"{self.url}/article?n={n}",
                "text": f"snippet {n} about {query}",
            }
            for n in range(1, count + 1)
        ]

    async def _searxng(self, request: web.Request) -> web.Response:
        await self._record(request)
        if request.query.get("format") != "json":
            return web.Response(status=403, text="format not allowed")
        hits = self._hits(request.query["q"], 8)
        return web.json_response({"results": [{**h, "content": h["text"], "engine": "test"} for h in hits]})

    async def _brave(self, request: web.Request) -> web.Response:
        await self._record(request)
        if request.headers.get("X-Subscription-Token") != "brave-test-key-123":
            return web.json_response({"error": "bad token"}, status=401)
        hits = self._hits(request.query["q"], int(request.query["count"]))
        results = [{**h, "description": f"<strong>{h['text']}</strong> &amp; more"} for h in hits]
        return web.json_response({"type": "search", "web": {"results": results}})

    async def _exa(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        if request.headers.get("x-api-key") != "exa-test-key-123":
            return web.json_response({"error": "bad key"}, status=401)
        hits = self._hits(body["query"], body["numResults"])
        return web.json_response({"results": [{**h, "highlights": [h["text"], "second line"]} for h in hits]})

    async def _tavily_search(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        given = request.headers.get("Authorization")
        if given != "Bearer tavily-test-key-123":  # echoes what it got, as some services do
            return web.json_response({"detail": {"error": f"Unauthorized: {given} is invalid"}}, status=401)
        hits = self._hits(body["query"], body["max_results"])
        return web.json_response(
            {"query": body["query"], "results": [{**h, "content": h["text"], "score": 0.9} for h in hits]}
        )

    async def _tavily_extract(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        results = [
            {"url": u, "raw_content": f"# Extracted by tavily\n\ntext of {u}"}
            for u in body["urls"]
            if "fail" not in u
        ]
        failed = [{"url": u, "error": "could not fetch"} for u in body["urls"] if "fail" in u]
        return web.json_response({"results": results, "failed_results": failed})

    async def _firecrawl_search(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        hits = [
            {**h, "description": h["text"], "position": n}
            for n, h in enumerate(self._hits(body["query"], body["limit"]), 1)
        ]
        return web.json_response({"success": True, "data": {"web": hits} if "/v2/" in request.path else hits})

    async def _firecrawl_scrape(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        metadata = {
            "title": "Scraped",
            "sourceURL": body["url"],
            "url": body["url"] + "#final",
            "statusCode": 200,
        }
        return web.json_response(
            {
                "success": True,
                "data": {"markdown": f"# Scraped by firecrawl\n\n{body['url']}", "metadata": metadata},
            }
        )

    async def _images(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        width, height = (int(side) for side in body["size"].split("x"))
        image = png(width // 256, height // 256)
        if body.get("response_format") == "url":
            return web.json_response({"data": [{"url": f"{self.url}/image.png"}]})
        return web.json_response(
            {
                "created": 1,
                "data": [{"b64_json": base64.b64encode(image).decode(), "revised_prompt": "a red square"}],
            }
        )

    # -- serving --------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[WebSite]:
        await self._open()
        try:
            yield self
        finally:
            await self._close()

    async def _open(self) -> None:
        self._runner = web.AppRunner(self.app(), shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def _close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def start(self) -> WebSite:
        """Serve from a thread of its own until :meth:`stop` (for tests that run trajkit in a subprocess)."""
        ready = threading.Event()

        def main() -> None:
            async def serve() -> None:
                self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
                async with self.serving():
                    ready.set()
                    await self._stop.wait()

            asyncio.run(serve())

        self._thread = threading.Thread(target=main, daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the web test server did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)


def answer(make: Callable[[], web.Response]) -> Callable[[web.Request], Awaitable[web.Response]]:
    """A handler that answers every request with ``make()``."""

    async def handler(request: web.Request) -> web.Response:
        return make()

    return handler


def _found(location: str) -> web.Response:
    return web.Response(status=302, headers={"Location": location})


@functools.cache
def report_pdf() -> bytes:
    """A real two-page PDF (made with pypdf) titled "Lighthouse Report": its pages' text layers
    read "Quarterly report of the lighthouse keepers" and "Appendix: the keepers and their ledgers"."""
    return (Path(__file__).parent / "data" / "lighthouse.pdf").read_bytes()
