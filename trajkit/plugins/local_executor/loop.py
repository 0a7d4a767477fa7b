"""Sessions on the runner's own event loop, ``--num_workers`` at once (``--processes 0``).

The work is I/O-bound (model latency, sandbox start), so one loop holds hundreds of sessions;
blocking SDKs run in worker threads. It takes one core at most: :mod:`.pool` spreads many more
over worker processes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from trajkit.run.executor import Driver, Executor, SessionPlan, WorkOrder

if TYPE_CHECKING:
    from trajkit.manager import PluginHost
    from trajkit.run.attempt import Sessions

log = logging.getLogger("trajkit")


class OnThisLoop(Executor):
    """The sessions on this process's event loop."""

    name = "local"

    sessions: Sessions | None = None

    async def start(self, plan: SessionPlan, host: PluginHost) -> None:
        from trajkit.run.attempt import Sessions  # the agent and the record models: only when a run starts

        self.sessions = Sessions(plan, host)
        self.workers = plan.config.num_workers
        await self.sessions.open()

    async def execute(self, work: Sequence[WorkOrder], driver: Driver) -> None:
        assert self.sessions is not None
        self.sessions.listen(driver.paid)  # each answer's spend saved as it arrives
        queue: asyncio.Queue[WorkOrder] = asyncio.Queue()
        for order in work:
            queue.put_nowait(order)
        workers = [
            asyncio.create_task(self._worker(queue, driver)) for _ in range(min(self.workers, len(work)))
        ]
        try:
            for result in await asyncio.gather(*workers, return_exceptions=True):
                if isinstance(result, Exception):
                    log.error("a worker stopped: %s: %s", type(result).__name__, result)
        finally:  # cancelled (the run was interrupted): so are the sessions, their sandboxes closed
            for worker in workers:
                worker.cancel()
            await asyncio.gather(*workers, return_exceptions=True)

    async def _worker(self, queue: asyncio.Queue[WorkOrder], driver: Driver) -> None:
        assert self.sessions is not None
        while not queue.empty() and await driver.admit():
            await self.sessions.run(queue.get_nowait(), driver)

    def statistics(self) -> dict[str, Any]:
        return self.sessions.statistics() if self.sessions is not None else {}

    def spent(self) -> float:
        return self.sessions.spent() if self.sessions is not None else 0.0

    async def aclose(self) -> None:
        if self.sessions is not None:
            await self.sessions.close()
