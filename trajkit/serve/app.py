"""The aiohttp application and its life: start the agent's parts, listen, stop cleanly.

``handler_cancellation`` is on: when a client goes away, aiohttp cancels its handler, which cancels
the agent session; the sandbox is closed before the cancellation completes (``service._close``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator

from aiohttp import web

from trajkit.serve.routes import AGENT, GATE, SETTINGS, Gate, add_routes
from trajkit.serve.security import CORS_ORIGINS, auth_middleware, cors_headers, cors_middleware, errors
from trajkit.serve.service import ServedAgent
from trajkit.serve.settings import ServeSettings

log = logging.getLogger("trajkit")

SHUTDOWN_GRACE = 5.0
"""Seconds sessions in flight get to finish when the server stops; then they are cancelled."""


def build_app(agent: ServedAgent, settings: ServeSettings) -> web.Application:
    app = web.Application(
        client_max_size=settings.max_body_bytes,
        middlewares=[cors_middleware(settings.cors_origins), errors, auth_middleware(settings.key())],
    )
    app[AGENT] = agent
    app[SETTINGS] = settings
    app[GATE] = Gate()
    app[CORS_ORIGINS] = frozenset(settings.cors_origins)
    app.on_response_prepare.append(cors_headers)
    add_routes(app)
    return app


@contextlib.asynccontextmanager
async def serving(agent: ServedAgent, settings: ServeSettings) -> AsyncIterator[tuple[str, int]]:
    """Start the agent's parts, then listen; yields the bound (host, port)."""
    await agent.start()
    try:
        runner = web.AppRunner(
            build_app(agent, settings),
            handler_cancellation=True,
            access_log=None,
            handle_signals=False,
            shutdown_timeout=SHUTDOWN_GRACE,
        )
        await runner.setup()
        try:
            site = web.TCPSite(runner, settings.host, settings.port, backlog=1024)
            await site.start()
            address = runner.addresses[0]
            yield str(address[0]), int(address[1])
        finally:
            await runner.cleanup()
    finally:
        await agent.stop()


async def serve_until_stopped(agent: ServedAgent, settings: ServeSettings) -> None:
    """Serve until SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stop.set)
    async with serving(agent, settings) as (host, port):
        shown = f"[{host}]" if ":" in host else host
        log.info("trajkit serve: %s on http://%s:%d/v1", agent.config.model, shown, port)
        print(f"READY http://{shown}:{port}/v1", flush=True)
        await stop.wait()
        log.info("trajkit serve: stopping")
