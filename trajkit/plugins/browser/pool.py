"""The ``browser`` toolset's Chromium processes, shared by a run's sessions.

A run opens one :class:`BrowserPool`: Playwright, the filtering proxy every request goes through
(:mod:`trajkit.plugins.browser.proxy`), and up to ``browsers`` Chromium processes launched as
sessions need them. Each session gets its own browser context (cookies, storage, cache and
permissions apart; downloads refused) behind its own port of the proxy. A run-wide cap on open
contexts makes further sessions wait for one rather than exhaust memory. A process is retired
after ``contexts_per_browser`` contexts (closed once its last one is) and replaced when it
crashes; a session whose browser crashed gets a tool error and a fresh context on its next call.
Imported when a run starts the toolset, not when the plugins are loaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trajkit.plugins.browser.page import OPEN_TIMEOUT
from trajkit.plugins.browser.proxy import FilteringProxy, Gate
from trajkit.tools import ToolError

if TYPE_CHECKING:
    from playwright.async_api import Browser, BrowserContext, Playwright

    from trajkit.plugins.browser.toolset import BrowserSettings
    from trajkit.tools.network import NetworkPolicy

log = logging.getLogger("trajkit")

CHROMIUM_ARGS = (
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-sync",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-dev-shm-usage",
)
"""Chromium's own traffic kept to a minimum (what is left is refused by the proxy's launch port)."""
CLOSE_TIMEOUT = 5.0
"""Seconds a context or a browser gets to close before it is given up on."""


@dataclass(eq=False)
class Chromium:
    """One browser process and the contexts it holds."""

    browser: Browser
    opened: int = 0
    """Contexts created in it so far."""
    open: int = 0
    """Contexts open in it now."""
    retiring: bool = False
    """No new contexts: it has served its share, or it crashed."""


@dataclass(eq=False)
class Lease:
    """A session's browser context, its proxy port and the process it lives in."""

    context: BrowserContext
    gate: Gate | None
    """The context's port of the proxy; None for a browser inside a sandbox, which has none."""
    chromium: Chromium
    closed: bool = field(default=False)


class BrowserPool:
    def __init__(self, settings: BrowserSettings, policy: NetworkPolicy) -> None:
        self.settings = settings
        self.proxy = FilteringProxy(
            policy,
            connect_timeout=min(settings.navigation_timeout, 15.0),
            connections_per_host=settings.connections_per_host,
        )
        self._slots = asyncio.Semaphore(settings.max_contexts)
        self._launch = asyncio.Lock()
        self._chromiums: list[Chromium] = []
        self._playwright: Playwright | None = None
        self.launched = 0
        """Browser processes started so far (recycled and crashed ones included)."""

    async def start(self) -> None:
        await self.proxy.start()

    async def lease(self, launcher: str | None = None) -> Lease:
        """A new context for a session, once the run has a free slot (waiting for one is not
        limited); :class:`ToolError` when no browser can be started or opened in time.

        ``launcher``: a program that starts a browser of the session's own inside its sandbox
        (:mod:`trajkit.plugins.browser.inside`), closed with the context; its requests do not go
        through the proxy, which it cannot reach. None: a context in the run's shared processes.
        """
        await self._slots.acquire()
        try:
            async with asyncio.timeout(OPEN_TIMEOUT):
                if launcher is None:
                    chromium, gate = await self._chromium(), await self.proxy.open_gate()
                else:
                    chromium, gate = Chromium(await self._launch_browser(launcher), retiring=True), None
                    self._chromiums.append(chromium)
                try:
                    context = await chromium.browser.new_context(
                        proxy={"server": gate.server, "bypass": "<-loopback>"} if gate else None,
                        accept_downloads=False,
                        service_workers="block",
                        viewport={
                            "width": self.settings.viewport_width,
                            "height": self.settings.viewport_height,
                        },
                    )
                except BaseException:
                    if gate is not None:
                        await self.proxy.close_gate(gate)
                    if launcher is not None:
                        await self._close(chromium)
                    raise
        except TimeoutError:
            self._slots.release()
            raise ToolError(f"the browser did not open a window within {OPEN_TIMEOUT:g}s") from None
        except BaseException:
            self._slots.release()
            raise
        chromium.opened += 1
        chromium.open += 1
        if chromium.opened >= self.settings.contexts_per_browser:
            chromium.retiring = True
        context.set_default_timeout(self.settings.action_timeout * 1000)
        context.set_default_navigation_timeout(self.settings.navigation_timeout * 1000)
        return Lease(context, gate, chromium)

    async def release(self, lease: Lease) -> None:
        """Close a session's context (however its session ended) and give its slot back."""
        if lease.closed:
            return
        lease.closed = True
        try:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(CLOSE_TIMEOUT):
                    await lease.context.close()
            if lease.gate is not None:
                await self.proxy.close_gate(lease.gate)
        finally:
            lease.chromium.open -= 1
            self._slots.release()
            if lease.chromium.retiring and lease.chromium.open == 0:
                await self._close(lease.chromium)

    async def _chromium(self) -> Chromium:
        """The least busy live browser, or a new one while there are fewer than ``browsers``."""
        async with self._launch:
            self._chromiums = [c for c in self._chromiums if c.browser.is_connected() or c.open]
            live = [c for c in self._chromiums if not c.retiring and c.browser.is_connected()]
            if not live or (len(live) < self.settings.browsers and min(c.open for c in live) > 0):
                chromium = Chromium(await self._launch_browser(None))
                self._chromiums.append(chromium)
                return chromium
            return min(live, key=lambda c: c.open)

    async def _launch_browser(self, launcher: str | None) -> Browser:
        """A browser of the run's (its background traffic to the proxy's refusing port), or one
        started by ``launcher`` inside a sandbox."""
        from playwright.async_api import Error, async_playwright

        assert self.proxy.background is not None
        proxy = {"server": self.proxy.background.server, "bypass": "<-loopback>"}
        try:
            if self._playwright is None:
                self._playwright = await async_playwright().start()
            browser = await self._playwright.chromium.launch(
                executable_path=launcher or self.settings.executable_path or None,
                headless=True,
                proxy=None if launcher else proxy,  # type: ignore[arg-type]
                args=[
                    *CHROMIUM_ARGS,
                    f"--js-flags=--max-old-space-size={self.settings.max_script_memory_mb}",
                ],
                timeout=60_000,
            )
        except Error as exc:
            raise ToolError(f"the browser could not start: {exc.message.splitlines()[0]}") from None
        self.launched += 1
        return browser

    async def _close(self, chromium: Chromium) -> None:
        if chromium in self._chromiums:
            self._chromiums.remove(chromium)
        with contextlib.suppress(Exception):
            async with asyncio.timeout(CLOSE_TIMEOUT):
                await chromium.browser.close()

    def crashed(self, chromium: Chromium) -> None:
        """No new contexts in ``chromium``: it stopped or stopped answering."""
        chromium.retiring = True

    async def aclose(self) -> None:
        for chromium in list(self._chromiums):
            await self._close(chromium)
        if self._playwright is not None:
            with contextlib.suppress(Exception):
                await self._playwright.stop()
            self._playwright = None
        await self.proxy.aclose()

    def usage(self) -> dict[str, Any]:
        """What is open now: processes and contexts (for benchmarks and logs)."""
        return {
            "browsers": sum(1 for c in self._chromiums if c.browser.is_connected()),
            "contexts": sum(c.open for c in self._chromiums),
            "launched": self.launched,
        }
