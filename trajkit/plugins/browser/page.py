"""One session's browser: its context and current page, what happened on them since the last call
(console messages, dialogs, windows closed, requests refused), and the page as text.

The context is leased from the run's :class:`~trajkit.plugins.browser.pool.BrowserPool` on the
session's first browser call and closed when the session ends, however it ends. Every call has a
hard time limit: a page or browser that stops answering, a tab that crashes (out of memory), a
browser process that dies: each is a tool error the model sees, and the session's next call gets
a fresh page (or context) while the run goes on. Imported when a run starts the toolset.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import os
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any, TypeVar

from trajkit.tools import ToolError

if TYPE_CHECKING:
    from playwright.async_api import ConsoleMessage, Dialog, Page

    from trajkit.plugins.browser.pool import BrowserPool, Lease
    from trajkit.plugins.browser.toolset import BrowserSettings

OPEN_TIMEOUT = 60.0
"""Seconds starting a browser (when one is needed), opening a context or a page may take."""

T = TypeVar("T")

REF = re.compile(r"(?:f\d+)?e\d+")
BOX = re.compile(r" \[box=(-?[\d.]+),(-?[\d.]+),(-?[\d.]+),(-?[\d.]+)\]")
LABELLED = re.compile(
    r"^\s*- (\w+).*\[ref=((?:f\d+)?e\d+)\].*?\[box=(-?[\d.]+),(-?[\d.]+),(-?[\d.]+),(-?[\d.]+)\]"
)
INTERACTIVE = frozenset(
    {
        "button", "checkbox", "combobox", "link", "listbox", "menuitem", "option", "radio",
        "searchbox", "slider", "spinbutton", "switch", "tab", "textbox",
    }
)  # fmt: skip
"""Roles whose refs ``browser_vision`` draws on the screenshot when asked to annotate."""
KEPT_CONSOLE = 200
"""Console messages a session keeps until ``browser_console`` reads them (the latest ones)."""
KEPT_DIALOGS = 20
"""Dialogs a session keeps until its next result reports them (the latest ones)."""
MESSAGE_CHARS = 2000
"""Characters of one console message or dialog text kept."""


@functools.cache
def script(name: str) -> str:
    """A page script of this package (``scripts/NAME``)."""
    return resources.files("trajkit.plugins.browser").joinpath("scripts", name).read_text()


@dataclass
class BrowserSession:
    pool: BrowserPool
    settings: BrowserSettings
    launcher: Callable[[], Awaitable[str | None]] | None = None
    """Finds where this session's browser runs: a program that starts it inside the session's
    sandbox (:mod:`trajkit.plugins.browser.inside`), or None for the run's shared browsers."""
    lease: Lease | None = None
    page: Page | None = None
    console: collections.deque[dict[str, str]] = field(
        default_factory=lambda: collections.deque(maxlen=KEPT_CONSOLE)
    )
    dialogs: list[dict[str, str]] = field(default_factory=list)
    windows_closed: int = 0
    crashed: bool = False

    async def close(self) -> None:
        lease, self.lease, self.page = self.lease, None, None
        if lease is not None:
            await self.pool.release(lease)

    async def run(self, action: Callable[[Page], Awaitable[T]]) -> T:
        """``action`` on the current page under the call's time limit; browser failures become
        :class:`ToolError` with what the model can do next."""
        from playwright.async_api import Error
        from playwright.async_api import TimeoutError as PlaywrightTimeout

        limit = self.settings.navigation_timeout + self.settings.action_timeout
        try:
            page = await self._page()  # waiting for a context is not the call's time
            async with asyncio.timeout(limit):
                return await action(page)
        except PlaywrightTimeout as exc:
            raise ToolError(_first_line(exc.message)) from None
        except TimeoutError:
            await self._abandon()
            raise ToolError(
                f"the browser did not answer within {limit:g}s; it was closed, and the next browser"
                " call starts a fresh one"
            ) from None
        except Error as exc:
            if self.crashed:
                await self._drop_page()
                raise ToolError(
                    "the page crashed (it may have run out of memory); the next browser call opens a"
                    " blank page"
                ) from None
            if self.lease is not None and not self.lease.chromium.browser.is_connected():
                await self._abandon()
                raise ToolError(
                    "the browser stopped; the next browser call starts a fresh one (pages and"
                    " cookies of this session are gone)"
                ) from None
            raise ToolError(_first_line(exc.message)) from None

    async def _page(self) -> Page:
        if self.lease is None:
            self.lease = await self._lease()
            self.lease.context.on("page", self._opened)
        if self.page is None or self.page.is_closed():
            self.crashed = False
            try:
                async with asyncio.timeout(OPEN_TIMEOUT):
                    self.page = await self.lease.context.new_page()
            except TimeoutError:
                await self._abandon()
                raise ToolError(f"the browser did not open a page within {OPEN_TIMEOUT:g}s") from None
        return self.page

    async def _lease(self) -> Lease:
        launcher = await self.launcher() if self.launcher is not None else None
        if launcher is None:
            return await self.pool.lease()
        try:
            return await self.pool.lease(launcher)
        finally:
            os.unlink(launcher)  # Playwright has started it (or failed to): it is needed no more

    def _opened(self, page: Page) -> None:
        assert self.lease is not None
        if len(self.lease.context.pages) > self.settings.max_pages:
            self.windows_closed += 1
            asyncio.get_running_loop().create_task(page.close())
            return
        page.on("console", self._console)
        page.on("pageerror", lambda error: self._log("error", str(error)))
        page.on("dialog", self._dialog)
        page.on("crash", self._crash)

    def _crash(self, page: Page) -> None:
        if page is self.page:
            self.crashed = True

    def _console(self, message: ConsoleMessage) -> None:
        self._log(message.type, message.text)

    def _log(self, kind: str, text: str) -> None:
        self.console.append({"type": kind, "text": text[:MESSAGE_CHARS]})

    async def _dialog(self, dialog: Dialog) -> None:
        """Dialogs are answered at once (accepted; a prompt with its default) and reported with
        the next result, so no page waits on one."""
        self.dialogs.append({"type": dialog.type, "message": dialog.message[:MESSAGE_CHARS]})
        del self.dialogs[:-KEPT_DIALOGS]
        with contextlib.suppress(Exception):  # the page went away first
            await dialog.accept()

    async def _drop_page(self) -> None:
        page, self.page = self.page, None
        if page is not None:
            try:
                async with asyncio.timeout(5):
                    await page.close()
            except Exception:
                pass

    async def _abandon(self) -> None:
        """Give up on this session's context (a hung or dead browser); no new context goes to that
        process."""
        if self.lease is not None:
            self.pool.crashed(self.lease.chromium)
        await self.close()

    def events(self) -> dict[str, Any]:
        """What happened beside the call's result since the last call, for its answer."""
        found: dict[str, Any] = {}
        if self.dialogs:
            found["dialogs"], self.dialogs = self.dialogs, []
        if self.windows_closed:
            found["windows_closed"], self.windows_closed = self.windows_closed, 0
            found["windows_note"] = f"a session may have {self.settings.max_pages} windows open"
        if self.lease is not None and self.lease.gate is not None:
            refused = self.lease.gate.take_refusals()
            if refused:
                found["refused"] = refused
        return found


async def snapshot(page: Page, full: bool, settings: BrowserSettings) -> str:
    """The page's accessibility tree as text, each element with its ref; only what is in the
    viewport unless ``full``."""
    text = await page.aria_snapshot(mode="ai", boxes=not full)
    if not full:
        text = in_viewport(text, settings.viewport_width, settings.viewport_height)
    return text


def in_viewport(text: str, width: float, height: float) -> str:
    """A snapshot taken with boxes, without the elements (and their children) that lie wholly
    outside the viewport, and without the boxes."""
    kept: list[str] = []
    skip_below: int | None = None
    for line in text.splitlines():
        indent = len(line) - len(line.lstrip(" "))
        if skip_below is not None and indent > skip_below:
            continue
        skip_below = None
        box = BOX.search(line)
        if box is not None:
            x, y, w, h = (float(v) for v in box.groups())
            if x + w <= 0 or y + h <= 0 or x >= width or y >= height:
                skip_below = indent
                continue
        kept.append(BOX.sub("", line))
    return "\n".join(kept)


def labels(text: str) -> list[dict[str, Any]]:
    """The interactive elements of a snapshot taken with boxes, as browser_annotate.js draws them."""
    found = []
    for line in text.splitlines():
        match = LABELLED.match(line)
        if match and match.group(1) in INTERACTIVE:
            x, y, w, h = (float(v) for v in match.groups()[2:])
            found.append({"ref": match.group(2), "x": x, "y": y, "width": w, "height": h})
    return found


def check_ref(value: object) -> str:
    if not isinstance(value, str) or not REF.fullmatch(value.strip()):
        raise ToolError("argument 'ref' must be an element's ref from browser_snapshot, e.g. e12")
    return value.strip()


def _first_line(message: str) -> str:
    return (message or "the browser failed").strip().splitlines()[0][:500]
