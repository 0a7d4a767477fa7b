"""The built-in ``browser`` toolset: sessions browse real pages in their own confined browser.

Playwright drives Chromium (Debian's ``chromium`` by default, or ``--browser.executable_path``).
Each session has its own browser context (cookies, storage and permissions apart, downloads
refused), leased on its first browser call from processes the run shares
(:mod:`trajkit.plugins.browser.pool`) and closed when the session ends. Every request the browser
makes, redirects, sub-resources, WebSockets and page scripts' ``fetch()`` included, goes through
a filtering proxy the runner owns (:mod:`trajkit.plugins.browser.proxy`) under the web toolset's
network rules: public addresses only unless ``--web.allow_hosts`` lets a host through; only
``http`` and ``https`` pages open. Pages are read as their accessibility tree, each element with
a short ref (``e12``) that the click and type tools take.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from pydantic import Field

from trajkit import hookimpl
from trajkit.config.settings import StrictSettings
from trajkit.plugins.toolsets import object_schema, string_arg
from trajkit.sandbox import cap_text
from trajkit.tools import Tool, ToolContext, ToolError, ToolRun, Toolset, ToolsetError
from trajkit.tools.network import public

if TYPE_CHECKING:
    from playwright.async_api import Page

    from trajkit.model import ModelClient
    from trajkit.plugins.browser.inside import SandboxBrowsers
    from trajkit.plugins.browser.page import BrowserSession
    from trajkit.plugins.browser.pool import BrowserPool

DEBIAN_CHROMIUM = "/usr/lib/chromium/chromium"
KEY = re.compile(r"[A-Za-z0-9+_ -]{1,40}")
MAX_TYPED = 10_000
"""Characters one browser_type call may enter."""
MAX_EXPRESSION = 10_000
"""Characters of one browser_console expression."""


@hookimpl
def trajkit_toolsets() -> list[Toolset]:
    return [BROWSER]


class BrowserSettings(StrictSettings):
    where: Literal["runner", "sandbox", "auto"] = "runner"
    """Where a session's browser runs: runner (the run's shared browsers, behind its filtering
    proxy); sandbox (for a row with an image, that image's Chromium inside the session's container,
    so a web app of the task is at localhost; the container's network policy applies, not the
    proxy); auto (inside when the image has a Chromium, else the runner)."""
    executable_path: str | None = None
    """The Chromium (or Chrome) program Playwright drives; default: Debian's
    /usr/lib/chromium/chromium, else `chromium` on PATH."""
    browsers: int = Field(2, ge=1)
    """Browser processes the run's sessions share at most."""
    contexts_per_browser: int = Field(50, ge=1)
    """Sessions one browser process serves before it is replaced (closed once its last ends)."""
    max_contexts: int = Field(16, ge=1)
    """Sessions with a browser open at once across the run; others wait for one to end."""
    max_pages: int = Field(4, ge=1)
    """Windows one session may have open; windows a page opens past this are closed."""
    navigation_timeout: float = Field(20.0, gt=0)
    """Seconds a page may take to load (browser_navigate, browser_back)."""
    action_timeout: float = Field(10.0, gt=0)
    """Seconds a click, a key press or typing may wait for its element."""
    max_script_memory_mb: int = Field(512, ge=16)
    """Megabytes of JavaScript heap one page may use before its tab is stopped."""
    viewport_width: int = Field(1280, ge=200, le=4096)
    """Width of each session's window in CSS pixels."""
    viewport_height: int = Field(720, ge=200, le=4096)
    """Height of each session's window in CSS pixels."""
    snapshot_bytes: int = Field(12_000, ge=500)
    """Bytes (UTF-8) of a page's text tree one result holds at most; the middle is cut first."""
    max_images: int = Field(50, ge=1)
    """Images browser_get_images lists at most."""
    connections_per_host: int = Field(16, ge=1)
    """Plain-http connections the proxy keeps open to one host at once, across the run's sessions
    (further requests wait their turn)."""


def chromium_path(settings: BrowserSettings) -> str | None:
    """The browser program to launch, or None when none is found."""
    if settings.executable_path:
        return settings.executable_path
    if os.access(DEBIAN_CHROMIUM, os.X_OK):
        return DEBIAN_CHROMIUM
    return shutil.which("chromium")


class BrowserToolset(Toolset):
    Settings = BrowserSettings
    optional = True

    def problem(self, settings: Any) -> str | None:
        if importlib.util.find_spec("playwright") is None:
            return "the browser needs Playwright: pip install 'trajkit[browser]'"
        path = chromium_path(settings)
        if path is None or not os.access(path, os.X_OK):
            return (
                f"no Chromium at {path}" if path else "no Chromium found"
            ) + ": install it (apt-get install chromium) or pass --browser.executable_path PATH"
        return None

    async def start(self, run: ToolRun) -> None:
        settings: BrowserSettings = run.settings_of(self)
        if problem := self.problem(settings):
            raise ToolsetError(f"browser: {problem}")
        from trajkit.plugins.browser.inside import SandboxBrowsers
        from trajkit.plugins.browser.pool import BrowserPool
        from trajkit.plugins.web.pages import ALLOW_HINT
        from trajkit.plugins.web.toolset import web_settings
        from trajkit.tools.network import NetworkPolicy

        settings = settings.model_copy(update={"executable_path": chromium_path(settings)})
        policy = NetworkPolicy.allowing(web_settings(run.config).allow_hosts, hint=ALLOW_HINT)
        pool = BrowserPool(settings, policy)
        await pool.start()
        browsing = BrowserRun(run, settings, pool, SandboxBrowsers(settings.where))
        run.resources[self.name] = browsing
        run.on_close(browsing.aclose)


@dataclass
class BrowserRun:
    """What the browser tools of one run share."""

    run: ToolRun
    settings: BrowserSettings
    pool: BrowserPool
    inside: SandboxBrowsers
    _vision: ModelClient | None = None
    _vision_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def vision(self) -> tuple[ModelClient, int]:
        """The vision model's client (opened on first use) and its answer's token limit."""
        from trajkit.plugins.web.vision import vision_client, vision_settings

        settings = vision_settings(self.run.config)
        async with self._vision_lock:
            if self._vision is None:
                try:
                    self._vision = await vision_client(self.run, settings)
                except ToolsetError as exc:
                    raise ToolError(str(exc)) from None
        return self._vision, settings.max_tokens

    async def aclose(self) -> None:
        try:
            await self.pool.aclose()
        finally:
            self.inside.close()
            if self._vision is not None:
                await self._vision.aclose()


def _session(ctx: ToolContext) -> BrowserSession:
    found = ctx.session.state.get("browser")
    if found is None:
        browsing = ctx.session.run.resources.get("browser")
        if not isinstance(browsing, BrowserRun):
            raise ToolError("the browser tools were not started for this run")
        from trajkit.plugins.browser.page import BrowserSession

        found = BrowserSession(
            browsing.pool, browsing.settings, functools.partial(browsing.inside.launcher, ctx.sandbox)
        )
        ctx.session.state["browser"] = found
        ctx.session.on_close(found.close)
    return found


def _answer(session: BrowserSession, ctx: ToolContext, **fields: Any) -> str:
    text = fields.get("snapshot")
    if isinstance(text, str):
        fields["snapshot"] = cap_text(
            text, min(session.settings.snapshot_bytes, max(ctx.output_cap - 2048, 500))
        )
    return cap_text(json.dumps({**fields, **session.events()}, ensure_ascii=False), ctx.output_cap)


async def _where(page: Page) -> dict[str, Any]:
    return {"url": public(page.url) if page.url.startswith("http") else page.url, "title": await page.title()}


async def _settle(page: Page, seconds: float) -> None:
    """Let a click or key press's navigation, if any, reach its first content."""
    from playwright.async_api import Error

    with contextlib.suppress(Error):
        await page.wait_for_load_state("domcontentloaded", timeout=seconds * 1000)


async def browser_navigate(args: dict[str, Any], ctx: ToolContext) -> str:
    from playwright.async_api import Error
    from playwright.async_api import TimeoutError as PlaywrightTimeout

    from trajkit.plugins.browser.page import snapshot

    url = string_arg(args, "url").strip()
    if urlsplit(url).scheme.lower() not in ("http", "https"):
        raise ToolError(f"{url[:100]}: only http and https pages can be opened")
    session = _session(ctx)
    settings = session.settings

    async def load(page: Page) -> Any:
        try:
            return await page.goto(url, wait_until="load")
        except Error as exc:
            # A navigation that timed out earlier may commit late and cut this one short: once.
            if "interrupted by another navigation" not in exc.message:
                raise
        return await page.goto(url, wait_until="load")

    async def go(page: Page) -> str:
        try:
            response = await load(page)
        except PlaywrightTimeout:
            raise ToolError(
                f"{public(url)} did not finish loading within {settings.navigation_timeout:g}s"
            ) from None
        except Error as exc:
            refused = _refusals(session)
            if refused:
                raise ToolError("; ".join(refused)) from None
            raise ToolError(f"{public(url)}: {exc.message.splitlines()[0]}") from None
        if response is not None and response.headers.get("x-trajkit-refused"):
            raise ToolError("; ".join(_refusals(session)) or f"{public(url)} was refused")
        status = response.status if response is not None else None
        text = await snapshot(page, False, settings)
        return _answer(session, ctx, **await _where(page), status=status, snapshot=text)

    return await session.run(go)


def _refusals(session: BrowserSession) -> list[str]:
    lease = session.lease
    return lease.gate.take_refusals() if lease is not None and lease.gate is not None else []


async def browser_snapshot(args: dict[str, Any], ctx: ToolContext) -> str:
    from trajkit.plugins.browser.page import snapshot

    full = bool(args.get("full", False))
    session = _session(ctx)

    async def read(page: Page) -> str:
        text = await snapshot(page, full, session.settings)
        return _answer(session, ctx, **await _where(page), full=full, snapshot=text)

    return await session.run(read)


async def browser_click(args: dict[str, Any], ctx: ToolContext) -> str:
    from trajkit.plugins.browser.page import check_ref

    ref = check_ref(args.get("ref"))
    session = _session(ctx)

    async def click(page: Page) -> str:
        await (await _element(page, ref)).click()
        await _settle(page, session.settings.navigation_timeout)
        return _answer(session, ctx, clicked=ref, **await _where(page))

    return await session.run(click)


async def browser_type(args: dict[str, Any], ctx: ToolContext) -> str:
    from trajkit.plugins.browser.page import check_ref

    ref = check_ref(args.get("ref"))
    text = string_arg(args, "text")
    if len(text) > MAX_TYPED:
        raise ToolError(f"argument 'text' is longer than {MAX_TYPED} characters")
    session = _session(ctx)

    async def type_in(page: Page) -> str:
        await (await _element(page, ref)).fill(text)
        return _answer(session, ctx, typed=ref, characters=len(text), **await _where(page))

    return await session.run(type_in)


async def _element(page: Page, ref: str) -> Any:
    element = page.get_by_ref(ref)
    if await element.count() == 0:
        raise ToolError(f"no element {ref} on this page: take a browser_snapshot for the current refs")
    return element


async def browser_scroll(args: dict[str, Any], ctx: ToolContext) -> str:
    from trajkit.plugins.browser.page import snapshot

    direction = args.get("direction")
    if direction not in ("up", "down"):
        raise ToolError("argument 'direction' must be 'up' or 'down'")
    session = _session(ctx)
    step = session.settings.viewport_height * 4 // 5 * (1 if direction == "down" else -1)

    async def scroll(page: Page) -> str:
        top, height = await page.evaluate(
            "(dy) => { window.scrollBy(0, dy); return [window.scrollY, document.documentElement.scrollHeight]; }",
            step,
        )
        text = await snapshot(page, False, session.settings)
        return _answer(session, ctx, scrolled=direction, scroll_y=top, page_height=height, snapshot=text)

    return await session.run(scroll)


async def browser_back(args: dict[str, Any], ctx: ToolContext) -> str:
    session = _session(ctx)

    async def back(page: Page) -> str:
        response = await page.go_back(wait_until="load")
        if response is None:
            raise ToolError("there is no earlier page in this window")
        return _answer(session, ctx, **await _where(page), status=response.status)

    return await session.run(back)


async def browser_press(args: dict[str, Any], ctx: ToolContext) -> str:
    key = string_arg(args, "key").strip()
    if not KEY.fullmatch(key):
        raise ToolError("argument 'key' must be a key name such as Enter, Tab, ArrowDown or Control+A")
    session = _session(ctx)

    async def press(page: Page) -> str:
        await page.keyboard.press(key)
        await _settle(page, session.settings.navigation_timeout)
        return _answer(session, ctx, pressed=key, **await _where(page))

    return await session.run(press)


async def browser_get_images(args: dict[str, Any], ctx: ToolContext) -> str:
    from trajkit.plugins.browser.page import script

    session = _session(ctx)

    async def images(page: Page) -> str:
        found = await page.evaluate(script("browser_images.js"), session.settings.max_images)
        return _answer(session, ctx, **await _where(page), images=found)

    return await session.run(images)


async def browser_console(args: dict[str, Any], ctx: ToolContext) -> str:
    from playwright.async_api import Error

    expression = args.get("expression")
    if expression is not None and (not isinstance(expression, str) or len(expression) > MAX_EXPRESSION):
        raise ToolError(f"argument 'expression' must be JavaScript of at most {MAX_EXPRESSION} characters")
    session = _session(ctx)

    async def console(page: Page) -> str:
        found: dict[str, Any] = {}
        if expression:
            try:
                value = await page.evaluate(expression)
                found["result"] = json.loads(json.dumps(value, default=str))
            except Error as exc:
                found["error"] = exc.message.splitlines()[0][:500]
        found["messages"] = list(session.console)
        if args.get("clear"):
            session.console.clear()
        return _answer(session, ctx, **found)

    return await session.run(console)


async def browser_vision(args: dict[str, Any], ctx: ToolContext) -> str:
    from trajkit.plugins.browser.page import labels, script
    from trajkit.plugins.web.vision import ask_about_image

    question = string_arg(args, "question")
    annotate = bool(args.get("annotate", False))
    session = _session(ctx)
    browsing = ctx.session.run.resources["browser"]

    async def screenshot(page: Page) -> tuple[bytes, int]:
        if not annotate:
            return await page.screenshot(type="png"), 0
        marks = labels(await page.aria_snapshot(mode="ai", boxes=True))
        await page.evaluate(script("browser_annotate.js"), marks)
        try:
            return await page.screenshot(type="png"), len(marks)
        finally:
            await page.evaluate(script("browser_annotate.js"), None)

    image, marked = await session.run(screenshot)
    client, max_tokens = await browsing.vision()
    analysis = await ask_about_image(client, image, "image/png", question, max_tokens)
    return _answer(session, ctx, question=question, analysis=analysis, annotated=marked)


REF_ARG = {"type": "string", "description": "the element's ref from browser_snapshot, e.g. e12"}

TOOLS = (
    Tool(
        "browser_navigate",
        "Open a web page (http or https) in the browser and return its title, status and the"
        " visible part of its accessibility tree, each element with a ref for the other tools.",
        object_schema(["url"], url={"type": "string", "description": "the page's URL"}),
        browser_navigate,
    ),
    Tool(
        "browser_snapshot",
        "Read the current page as an accessibility tree: roles, names and text, each element with"
        " a ref (e.g. e12) to click or type into. Only what is in the window unless `full`.",
        object_schema([], full={"type": "boolean", "description": "the whole page, not just the window"}),
        browser_snapshot,
    ),
    Tool(
        "browser_click",
        "Click an element of the current page, by its ref from browser_snapshot.",
        object_schema(["ref"], ref=REF_ARG),
        browser_click,
    ),
    Tool(
        "browser_type",
        "Type text into an input field of the current page (replacing what it held), by its ref.",
        object_schema(["ref", "text"], ref=REF_ARG, text={"type": "string", "description": "what to type"}),
        browser_type,
    ),
    Tool(
        "browser_scroll",
        "Scroll the current page up or down by most of a window, and return what is then visible.",
        object_schema(["direction"], direction={"type": "string", "enum": ["up", "down"]}),
        browser_scroll,
    ),
    Tool(
        "browser_back",
        "Go back to the previous page in the browser's history.",
        object_schema([]),
        browser_back,
    ),
    Tool(
        "browser_press",
        "Press a key on the current page (Enter, Tab, Escape, ArrowDown, Control+A, ...).",
        object_schema(["key"], key={"type": "string", "description": "the key's name"}),
        browser_press,
    ),
    Tool(
        "browser_get_images",
        "List the images of the current page: URL, alt text and size.",
        object_schema([]),
        browser_get_images,
    ),
    Tool(
        "browser_vision",
        "Take a screenshot of the current page and ask a vision model a question about it;"
        " with `annotate`, each interactive element's ref is drawn on the screenshot.",
        object_schema(
            ["question"],
            question={"type": "string", "description": "what to find out from the screenshot"},
            annotate={"type": "boolean", "description": "draw element refs on the screenshot"},
        ),
        browser_vision,
    ),
    Tool(
        "browser_console",
        "Read the page's console messages and errors since the last call; optionally run a"
        " JavaScript expression in the page and return its value.",
        object_schema(
            [],
            clear={"type": "boolean", "description": "forget the messages once returned"},
            expression={"type": "string", "description": "JavaScript to evaluate in the page"},
        ),
        browser_console,
    ),
)

BROWSER = BrowserToolset("browser", "browse web pages in a real browser", TOOLS)
