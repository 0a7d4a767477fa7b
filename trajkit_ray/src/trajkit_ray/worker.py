"""The session actor: many sessions at once on one Ray actor's event loop.

Built on its node from the run's :class:`~trajkit.run.executor.SessionPlan` and the plugins installed
there (:func:`trajkit.manager.load_plugins`), so the model client, the sandbox backends and the
images verified are this node's. The driver hands it work and collects what happened with one
call, :meth:`SessionWorker.exchange`, which returns every event since the last call in one batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Sequence
from typing import Any

from trajkit.manager import load_plugins
from trajkit.model.ratelimit import RequestLimiter, shared_limits
from trajkit.run.attempt import Sessions
from trajkit.run.executor import Failed, Outcome, SessionPlan, WorkOrder
from trajkit.run.heap import settle_for_sessions
from trajkit_ray.limiter import RemoteLimiter

log = logging.getLogger("trajkit")

Started = tuple[str, int]
"""(work id, attempt): an attempt has started."""
Event = Started | Outcome


class _Events:
    """The actor's side of the :class:`~trajkit.run.executor.Driver`: it queues what happens for the
    driver's next :meth:`SessionWorker.exchange`. The driver decided ``may_start`` before sending."""

    def __init__(self) -> None:
        self.queue: list[Event] = []
        self.ready = asyncio.Event()

    def started(self, work_id: str, attempt: int) -> None:
        self.queue.append((work_id, attempt))

    def report(self, outcome: Outcome) -> None:
        self.queue.append(outcome)
        self.ready.set()

    def take(self) -> list[Event]:
        events, self.queue = self.queue, []
        self.ready.clear()
        return events


class SessionWorker:
    """A Ray async actor running sessions; every method runs on the actor's one event loop."""

    def __init__(self, holder: str) -> None:
        self.holder = holder
        self.sessions: Sessions | None = None
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.events: _Events | None = None

    async def open(self, plan: SessionPlan, limiter: Any | None, environment: dict[str, str]) -> str:
        """Build the sessions from the plan with this node's plugins: check the model client,
        start the backends, reap what earlier runs left here, verify the images. Returns the host."""
        for name, value in environment.items():
            os.environ.setdefault(name, value)
        self.events = _Events()
        host = load_plugins()
        host.configure_toolsets(plan.config)  # the toolsets of the run's configuration ([mcp_servers])
        sessions = Sessions(plan, host)
        self.sessions = sessions
        limits: list[tuple[int | None, float | None, float | None]] = []

        def limiter_of_the_run(
            max_concurrent: int | None, max_rpm: float | None, max_tpm: float | None
        ) -> RequestLimiter:
            if limiter is None or (max_concurrent, max_rpm, max_tpm) == (None, None, None):
                return RequestLimiter()  # no limits to share (429s slow this actor down alone)
            limits.append((max_concurrent, max_rpm, max_tpm))
            return RemoteLimiter(limiter, self.holder, max_concurrent, max_rpm, max_tpm)

        with shared_limits(limiter_of_the_run):
            await sessions.open()
        if limits and limiter is not None:  # before any session, so the first request finds them
            await limiter.configure.remote(*limits[0])
        settle_for_sessions()  # this actor's process runs sessions until the run ends
        return socket.gethostname()

    async def exchange(
        self, orders: Sequence[WorkOrder], wait: float, linger: float
    ) -> tuple[list[Event], dict[str, Any], float]:
        """Start ``orders``; return the events since the last call (waiting up to ``wait`` seconds
        for one, then ``linger`` more for others), the model client's counters and its spending."""
        assert self.sessions is not None and self.events is not None, "open() first"
        for order in orders:
            task = asyncio.create_task(self._run(order))
            self.tasks[order.work_id] = task
        if not self.events.ready.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self.events.ready.wait()
        if self.events.ready.is_set() and linger:
            await asyncio.sleep(linger)
        return self.events.take(), self.sessions.statistics(), self.sessions.spent()

    async def _run(self, order: WorkOrder) -> None:
        assert self.sessions is not None and self.events is not None
        try:
            await self.sessions.run(order, self.events)
        except Exception as exc:  # Sessions.run reports every failure; this is a bug, said once
            log.exception("session %s stopped", order.work_id)
            message = f"{type(exc).__name__}: {exc}"
            self.events.report(Failed(order.work_id, 1, "internal_error", message, final=True))
        finally:
            self.tasks.pop(order.work_id, None)

    async def stop(self) -> int:
        """Cancel the sessions in flight (their sandboxes are closed); returns how many there were."""
        tasks = list(self.tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return len(tasks)

    async def close(self) -> None:
        """Stop what runs, close the model client, reap the run's sandboxes on this node."""
        await self.stop()
        if self.sessions is not None:
            await self.sessions.close()
