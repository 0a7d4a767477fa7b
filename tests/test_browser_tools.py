"""The ``browser`` toolset as a model uses it: headless Chromium (Debian's, through Playwright)
against loopback pages served by an aiohttp server of the test, which the test lets through with
``--web.allow_hosts``; every other private address stays refused, by the runner's proxy."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from trajkit.config.resolve import resolve
from trajkit.manager import load_plugins
from trajkit.plugins.browser import toolset as browser
from trajkit.plugins.browser.page import in_viewport
from trajkit.plugins.local.sandbox import LocalBackend
from trajkit.sandbox import SandboxSpec
from trajkit.testing.engines import need_engine
from trajkit.tools import ToolContext, ToolError, ToolSession, close_session, open_toolsets, schemas_markdown

PAGES = Path(__file__).parent / "data" / "browser_pages"
PIXEL = bytes.fromhex(
    "89504e470d0a1a0a0000000d49484452000000010000000108020000009077"
    "53de0000000c4944415408d763f8cfc000000301010018dd8db00000000049454e44ae426082"
)


def chromium_missing() -> str | None:
    problem = browser.BROWSER.problem(browser.BrowserSettings())
    return f"{problem} (bash scripts/install-chromium.sh installs it)" if problem else None


@contextlib.asynccontextmanager
async def site() -> AsyncIterator[str]:
    """The test pages on a loopback port: ``http://127.0.0.1:PORT``."""
    from aiohttp import web

    async def page(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"] or "form"
        path = PAGES / f"{name}.html"
        if not path.is_file():
            raise web.HTTPNotFound()
        return web.Response(text=path.read_text(), content_type="text/html")

    async def signed(request: web.Request) -> web.Response:
        form = await request.post()
        body = f"<title>Signed</title><h1>Thanks, {form.get('name')}</h1>"
        return web.Response(text=body, content_type="text/html")

    async def never_finishes(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/html"})
        await response.prepare(request)
        await response.write(b"<title>Slow</title><p>Still loading")
        await asyncio.sleep(3600)
        return response

    async def fetches_metadata(request: web.Request) -> web.Response:
        script = (
            "<title>Curious</title><p id=out>waiting</p><script>"
            "fetch('http://169.254.169.254/latest/meta-data/').then(r => r.text())"
            ".then(t => out.textContent = 'got ' + t, e => out.textContent = 'blocked')</script>"
        )
        return web.Response(text=script, content_type="text/html")

    async def echo(request: web.Request) -> web.WebSocketResponse:
        socket = web.WebSocketResponse()
        await socket.prepare(request)
        async for message in socket:
            await socket.send_str(f"echo {message.data}")
        return socket

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPFound("http://10.0.0.1/secret")

    async def pixel(request: web.Request) -> web.Response:
        return web.Response(body=PIXEL, content_type="image/png")

    app = web.Application()
    app.router.add_get("/redirect", redirect)
    app.router.add_get("/ws", echo)
    app.router.add_get("/slow", never_finishes)
    app.router.add_get("/curious", fetches_metadata)
    app.router.add_get("/pixel.png", pixel)
    app.router.add_post("/signed", signed)
    app.router.add_get("/{name:[a-z]*}", page)
    async with loopback(app) as host:
        yield f"http://{host}"


@contextlib.asynccontextmanager
async def loopback(app: Any) -> AsyncIterator[str]:
    """``app`` (an aiohttp application) served on a loopback port: ``127.0.0.1:PORT``."""
    from aiohttp import web

    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    server = web.TCPSite(runner, "127.0.0.1", 0)
    await server.start()
    port = server._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def browsing(tmp_path: Path, **settings: Any) -> AsyncIterator[tuple[str, ToolContext]]:
    """The test site, and a tool context of a run whose browser may reach it."""
    need_engine("chromium", chromium_missing())
    async with site() as url:
        host = load_plugins(entry_points=False)
        given = {
            "toolset_options": {"web": {"allow_hosts": [url.removeprefix("http://")]}, "browser": settings}
        }
        config = resolve(host, given)
        run = await open_toolsets([host.toolsets["browser"]], config, host)
        backend = LocalBackend({"root": str(tmp_path), "isolation": "none"})
        sandbox = await backend.create(SandboxSpec(run_id="browser", work_id="w0"))
        session = ToolSession(run)
        try:
            yield url, ToolContext(sandbox, timeout=30, output_cap=32 * 1024, session=session)
        finally:
            await close_session(session, sandbox)
            await run.aclose()
            await backend.aclose()


async def call(ctx: ToolContext, tool: str, **args: Any) -> Any:
    function = {t.name: t.run for t in browser.TOOLS}[tool]
    return json.loads(await function(args, ctx))


def ref_of(snapshot: str, role: str, name: str) -> str:
    match = re.search(rf'- {role} "{re.escape(name)}"[^\n]*\[ref=((?:f\d+)?e\d+)\]', snapshot)
    assert match, snapshot
    return match.group(1)


async def test_a_form_is_filled_and_submitted_and_links_lead_back_and_forth(tmp_path: Path) -> None:
    async with browsing(tmp_path) as (url, ctx):
        opened = await call(ctx, "browser_navigate", url=f"{url}/form")
        assert opened["title"] == "Sign the guest book" and opened["status"] == 200
        box = ref_of(opened["snapshot"], "textbox", "Your name")
        await call(ctx, "browser_type", ref=box, text="Ada Lovelace")
        signed = await call(ctx, "browser_click", ref=ref_of(opened["snapshot"], "button", "Sign"))
        assert signed["title"] == "Signed" and signed["url"] == f"{url}/signed"
        assert "Thanks, Ada Lovelace" in (await call(ctx, "browser_snapshot"))["snapshot"]
        back = await call(ctx, "browser_back")
        assert back["title"] == "Sign the guest book"
        again = (await call(ctx, "browser_snapshot"))["snapshot"]
        links = await call(ctx, "browser_click", ref=ref_of(again, "link", "More pages"))
        assert links["title"] == "Links"
        images = await call(ctx, "browser_get_images")
        assert images["images"] == [
            {"src": f"{url}/pixel.png", "alt": "a red pixel", "width": 10, "height": 10}
        ]
        with pytest.raises(ToolError, match="no element e999 on this page"):
            await call(ctx, "browser_click", ref="e999")


async def test_the_window_snapshot_leaves_out_what_is_below_and_scrolling_brings_it(tmp_path: Path) -> None:
    async with browsing(tmp_path) as (url, ctx):
        window = (await call(ctx, "browser_navigate", url=f"{url}/links"))["snapshot"]
        assert "Far below the window" not in window and "[box=" not in window
        full = (await call(ctx, "browser_snapshot", full=True))["snapshot"]
        assert "Far below the window" in full
        for _ in range(6):
            scrolled = await call(ctx, "browser_scroll", direction="down")
        assert scrolled["scroll_y"] > 3000 and "Far below the window" in scrolled["snapshot"]
        assert "Rendered by script" not in scrolled["snapshot"]
        # the same page in a fresh session gives the same refs: nothing random in the data
        assert re.findall(r"ref=e\d+", full) == sorted(
            set(re.findall(r"ref=e\d+", full)), key=lambda r: int(r[5:])
        )


def test_the_viewport_filter_drops_elements_outside_with_their_children() -> None:
    text = (
        "- generic [ref=e1] [box=0,0,100,3000]:\n"
        '  - link "near" [ref=e2] [box=0,10,50,20]:\n'
        "    - /url: /near\n"
        '  - link "far" [ref=e3] [box=0,2000,50,20]:\n'
        "    - /url: /far\n"
        "  - text: plain"
    )
    assert in_viewport(text, 1280, 720) == (
        '- generic [ref=e1]:\n  - link "near" [ref=e2]:\n    - /url: /near\n  - text: plain'
    )


async def test_script_rendered_content_dialogs_and_the_console(tmp_path: Path) -> None:
    async with browsing(tmp_path) as (url, ctx):
        await call(ctx, "browser_navigate", url=f"{url}/rendered")
        await asyncio.sleep(0.3)
        snapshot = (await call(ctx, "browser_snapshot"))["snapshot"]
        assert "Made by JavaScript" in snapshot
        asked = await call(ctx, "browser_click", ref=ref_of(snapshot, "button", "Ask"))
        assert asked["dialogs"] == [{"type": "confirm", "message": "Really ask?"}]
        console = await call(ctx, "browser_console", expression="window.answer", clear=True)
        assert console["result"] is True
        assert {"type": "log", "text": "rendering the list"} in console["messages"]
        assert {"type": "warning", "text": "rendered"} in console["messages"]
        assert (await call(ctx, "browser_console"))["messages"] == []
        failed = await call(ctx, "browser_console", expression="no_such_name.x")
        assert "no_such_name is not defined" in failed["error"]
        await call(ctx, "browser_navigate", url=f"{url}/socket")  # a WebSocket, through the proxy too
        for _ in range(50):
            if "echo hello" in (await call(ctx, "browser_snapshot"))["snapshot"]:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the page's WebSocket got no answer")
        pressed = await call(ctx, "browser_press", key="Tab")
        assert pressed["pressed"] == "Tab"
        with pytest.raises(ToolError, match="must be a key name"):
            await call(ctx, "browser_press", key="<script>")
        with pytest.raises(ToolError, match='Unknown key: "NoSuchKey"'):
            await call(ctx, "browser_press", key="NoSuchKey")


async def test_a_redirect_to_a_private_address_and_a_fetch_of_the_metadata_service_are_refused(
    tmp_path: Path,
) -> None:
    async with browsing(tmp_path) as (url, ctx):
        with pytest.raises(
            ToolError, match=r"http://10\.0\.0\.1/secret refused: 10\.0\.0\.1 is a private address"
        ):
            await call(ctx, "browser_navigate", url=f"{url}/redirect")
        refused = (await call(ctx, "browser_navigate", url=f"{url}/curious")).get("refused", [])
        for _ in range(20):
            snapshot = await call(ctx, "browser_snapshot")
            refused += snapshot.get("refused", [])
            if "blocked" in snapshot["snapshot"]:
                break
            await asyncio.sleep(0.1)
        assert "blocked" in snapshot["snapshot"] and "got" not in snapshot["snapshot"]
        metadata = (
            "http://169.254.169.254/latest/meta-data/ refused: 169.254.169.254 is a cloud metadata address"
        )
        assert any(refusal.startswith(metadata) for refusal in refused), refused
        with pytest.raises(ToolError, match=r"10\.0\.0\.2 is a private address"):
            await call(ctx, "browser_navigate", url="http://10.0.0.2:8080/")
        for other in ("file:///etc/passwd", "chrome://settings", "javascript:alert(1)", "data:text/html,hi"):
            with pytest.raises(ToolError, match="only http and https pages can be opened"):
                await call(ctx, "browser_navigate", url=other)
        # the page still works after the refusals
        assert (await call(ctx, "browser_navigate", url=f"{url}/form"))["status"] == 200


async def test_a_page_that_never_finishes_is_a_tool_error_and_the_session_goes_on(tmp_path: Path) -> None:
    async with browsing(tmp_path, navigation_timeout=1.5) as (url, ctx):
        with pytest.raises(ToolError, match=r"/slow did not finish loading within 1.5s"):
            await call(ctx, "browser_navigate", url=f"{url}/slow")
        assert (await call(ctx, "browser_navigate", url=f"{url}/form"))["title"] == "Sign the guest book"


async def test_a_page_opening_many_windows_keeps_to_the_cap(tmp_path: Path) -> None:
    async with browsing(tmp_path, max_pages=3) as (url, ctx):
        opened = await call(ctx, "browser_navigate", url=f"{url}/windows")
        await asyncio.sleep(0.5)
        found = await call(ctx, "browser_snapshot")
        closed = opened.get("windows_closed", 0) + found.get("windows_closed", 0)
        assert closed >= 17, (opened, found)
        session = ctx.session.state["browser"]
        assert len(session.lease.context.pages) <= 3


async def test_a_tab_that_allocates_until_it_dies_is_a_tool_error_and_the_next_call_works(
    tmp_path: Path,
) -> None:
    async with browsing(tmp_path, max_script_memory_mb=64) as (url, ctx):
        with pytest.raises(ToolError, match="the page crashed"):  # while it loads, or just after
            await call(ctx, "browser_navigate", url=f"{url}/memory")
            for _ in range(100):
                await call(ctx, "browser_snapshot")
                await asyncio.sleep(0.1)
        assert (await call(ctx, "browser_navigate", url=f"{url}/form"))["status"] == 200


async def test_sessions_get_contexts_of_their_own_and_wait_for_a_free_one(tmp_path: Path) -> None:
    async with browsing(tmp_path, max_contexts=1, contexts_per_browser=2) as (url, ctx):
        await call(ctx, "browser_navigate", url=f"{url}/form")
        await call(ctx, "browser_console", expression="document.cookie = 'who=first'")
        other = ToolContext(ctx.sandbox, session=ToolSession(ctx.session.run))
        waiting = asyncio.ensure_future(call(other, "browser_navigate", url=f"{url}/form"))
        await asyncio.sleep(0.5)
        assert not waiting.done()  # one context at a time in this run
        await ctx.session.aclose()  # the first session ends: its context closes, the slot frees
        await asyncio.wait_for(waiting, 30)
        assert (await call(other, "browser_console", expression="document.cookie"))["result"] == ""
        pool = ctx.session.run.resources["browser"].pool
        await other.session.aclose()
        third = ToolContext(ctx.sandbox, session=ToolSession(ctx.session.run))
        await call(third, "browser_navigate", url=f"{url}/form")
        assert pool.usage() == {"browsers": 1, "contexts": 1, "launched": 2}  # recycled after 2
        await third.session.aclose()


async def test_the_window_size_the_text_cap_the_image_list_and_the_wait_for_an_element(
    tmp_path: Path,
) -> None:
    settings = {"viewport_width": 400, "viewport_height": 300, "snapshot_bytes": 600, "max_images": 1}
    async with browsing(tmp_path, action_timeout=1, connections_per_host=1, **settings) as (url, ctx):
        opened = await call(ctx, "browser_navigate", url=f"{url}/long")
        size = await call(ctx, "browser_console", expression="[innerWidth, innerHeight]")
        assert size["result"] == [400, 300]
        full = (await call(ctx, "browser_snapshot", full=True))["snapshot"]
        assert len(full.encode()) <= 700 and "Item number 1 " in full and "Item number 100 " in full
        assert "Item number 50 " not in full and "bytes truncated ...]" in full  # head and tail kept
        assert [image["alt"] for image in (await call(ctx, "browser_get_images"))["images"]] == ["first"]
        with pytest.raises(ToolError, match="Timeout 1000ms exceeded"):
            await call(ctx, "browser_click", ref=ref_of(opened["snapshot"], "button", "Not yet"))


def test_a_missing_browser_is_said_with_what_to_do() -> None:
    problem = browser.BROWSER.problem(browser.BrowserSettings(executable_path="/nonexistent/chrome"))
    assert problem == (
        "no Chromium at /nonexistent/chrome: install it (apt-get install chromium) or pass"
        " --browser.executable_path PATH"
    )


def test_the_documented_schemas_are_the_tools_schemas() -> None:
    page = (Path(__file__).resolve().parent.parent / "docs" / "browser.md").read_text()
    generated = page[page.index("## Schemas\n") :].split("\n\n", 2)[2]
    assert generated == schemas_markdown(browser.TOOLS), (
        "stale: regenerate docs/browser.md's last section from trajkit.tools.schemas_markdown(browser.TOOLS)"
    )


def browser_processes() -> list[int]:
    """The main Chromium processes this test process started (through Playwright's driver)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])

    def ours(pid: int) -> bool:
        while pid > 1:
            pid = parents.get(pid, 0)
            if pid == os.getpid():
                return True
        return False

    found = []
    for pid in parents:
        with contextlib.suppress(OSError):
            command = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
            if (
                ours(pid)
                and b"--remote-debugging-pipe" in command
                and not any(a.startswith(b"--type=") for a in command)
            ):
                found.append(pid)
    return found


async def test_a_browser_that_dies_or_hangs_is_a_tool_error_and_the_next_call_gets_a_fresh_one(
    tmp_path: Path,
) -> None:
    async with browsing(tmp_path, navigation_timeout=2, action_timeout=1) as (url, ctx):
        await call(ctx, "browser_navigate", url=f"{url}/form")
        [first] = browser_processes()
        os.kill(first, signal.SIGKILL)
        with pytest.raises(ToolError, match="the browser stopped; the next browser call starts a fresh one"):
            for _ in range(50):
                await call(ctx, "browser_snapshot")
                await asyncio.sleep(0.1)
        assert (await call(ctx, "browser_navigate", url=f"{url}/form"))["status"] == 200
        [second] = browser_processes()
        assert second != first
        os.kill(second, signal.SIGSTOP)  # the browser stops answering
        try:
            with pytest.raises(ToolError, match=r"did not finish loading within 2s|did not answer within 3s"):
                await call(ctx, "browser_navigate", url=f"{url}/links")
        finally:
            os.kill(second, signal.SIGCONT)
        await asyncio.sleep(1)  # the navigation that timed out finishes
        assert (await call(ctx, "browser_navigate", url=f"{url}/links"))["title"] == "Links"
        # a script that never returns: nothing in the browser times it out but the call's limit
        with pytest.raises(ToolError, match=r"the browser did not answer within 3s; it was closed"):
            await call(ctx, "browser_console", expression="while (true) {}")
        assert (await call(ctx, "browser_navigate", url=f"{url}/links"))["title"] == "Links"
        assert ctx.session.run.resources["browser"].pool.launched == 3  # the hung one takes no more
