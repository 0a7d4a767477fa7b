"""Browsers that run inside a session's sandbox (``--browser.where sandbox`` or ``auto``).

For a row with an image, the session's browser may be the image's own Chromium, started in the
session's container, so that a web app the task runs there is at ``localhost``. Playwright launches
a small host program in place of a browser (``scripts/browser_launcher.sh``); that program hands
Playwright's DevTools pipe (file descriptors 3 and 4) to the sandbox backend's bridge
(:meth:`trajkit.sandbox.Sandbox.bridge`), which runs the browser inside the sandbox with the pipe
as its standard input and output (``scripts/browser_inside.sh``). No port is opened anywhere, so a
container without a network keeps none, and what reaches the runner from the container is the
DevTools pipe alone. The browser lives within the container's memory and process limits and under
its network policy: the runner's filtering proxy does not apply to it.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import tempfile
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trajkit.plugins.browser.page import script
from trajkit.sandbox import SandboxError
from trajkit.tools import ToolError

if TYPE_CHECKING:
    from trajkit.sandbox import Sandbox

FIND_TIMEOUT = 30.0
"""Seconds looking for the image's Chromium may take."""


@dataclass
class SandboxBrowsers:
    """Where each session's browser runs, and the launchers of those that run in their sandbox."""

    where: str
    """``runner``, ``sandbox`` or ``auto`` (the ``where`` setting)."""
    found: dict[str, str | None] = field(default_factory=dict)
    """Image (its digest where known) -> its Chromium, None when it has none."""
    directory: str | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def launcher(self, sandbox: Sandbox) -> str | None:
        """A program for Playwright to launch that starts the session's browser inside
        ``sandbox``, or None when the browser runs in the runner: ``where`` is ``runner``, the row
        has no image, or (``auto``) its sandbox cannot run the image's Chromium or has none.
        :class:`ToolError` when ``where`` is ``sandbox`` and the row's image cannot."""
        image = sandbox.info.image
        if self.where == "runner" or image is None:
            return None
        if sandbox.bridge(["true"]) is None:
            self._unless_auto(f"the {sandbox.info.backend} sandbox cannot run a browser inside it")
            return None
        chromium = await self._chromium(sandbox)
        if chromium is None:
            self._unless_auto(f"the image {image} has no Chromium (apt-get install chromium)")
            return None
        bridge = sandbox.bridge(["/bin/sh", "-c", script("browser_inside.sh"), "trajkit-browser", chromium])
        assert bridge is not None
        return self._write(bridge.argv, bridge.env)

    def _unless_auto(self, problem: str) -> None:
        """``where=sandbox`` insists on the sandbox: ``problem`` is the session's tool error."""
        if self.where == "sandbox":
            raise ToolError(f"{problem}; browse from the runner instead with --browser.where auto")

    async def _chromium(self, sandbox: Sandbox) -> str | None:
        key = sandbox.info.digest or sandbox.info.image or ""
        async with self._lock:
            if key not in self.found:
                try:
                    result = await sandbox.exec(script("browser_find.sh"), timeout=FIND_TIMEOUT)
                except SandboxError as exc:
                    raise ToolError(f"looking for the image's Chromium failed: {exc}") from None
                path = result.stdout.strip()
                self.found[key] = path if result.exit_code == 0 and path.startswith("/") else None
            return self.found[key]

    def _write(self, argv: tuple[str, ...], env: Mapping[str, str]) -> str:
        if self.directory is None:
            self.directory = tempfile.mkdtemp(prefix="trajkit-browsers-")
        variables = "\n".join(f"export {key}={shlex.quote(value)}" for key, value in env.items())
        text = script("browser_launcher.sh").replace("@ENV@", variables).replace("@BRIDGE@", shlex.join(argv))
        path = os.path.join(self.directory, f"browser-{uuid.uuid4().hex[:12]}.sh")
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o700)
        with os.fdopen(descriptor, "w") as file:
            file.write(text)
        return path

    def close(self) -> None:
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None
