"""The ``local`` executor: a run's sessions on this machine, on as many cores as they need.

Up to ``SESSIONS_PER_PROCESS`` sessions in flight run on the runner's own event loop
(:mod:`.loop`); more are spread over worker processes (:mod:`.pool`), one per core at most, so a
run of a thousand sessions in flight is not held to the one core a Python event loop can use.
``--processes N`` chooses (0: the runner's loop, whatever the number).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic import Field

from trajkit import hookimpl
from trajkit.config.settings import StrictSettings
from trajkit.run.executor import Driver, Executor, SessionPlan, WorkOrder

if TYPE_CHECKING:
    from trajkit.manager import PluginHost

log = logging.getLogger("trajkit")

SESSIONS_PER_PROCESS = 128
"""Sessions in flight a worker process is started for (at about 1 ms of CPU per model turn, 128
sessions waiting 1 s per answer keep an eighth of a core busy; faster models, more)."""


@hookimpl
def trajkit_executors() -> list[type[Executor]]:
    return [LocalExecutor]


class LocalSettings(StrictSettings):
    processes: int | None = Field(None, ge=0, json_schema_extra={"flag": "processes"})
    """worker processes running the sessions; 0: all on the runner's own event loop; unset: one
    for every 128 sessions in flight (--num_workers), at most one per CPU, and none below two or
    when a plugin was registered by hand rather than installed (workers load the installed ones)."""


class LocalExecutor(Executor):
    name = "local"
    description = "sessions on this machine: the runner's event loop, or worker processes on its cores"
    Settings = LocalSettings
    settings: LocalSettings

    def __init__(self, settings: Any = None) -> None:
        super().__init__(settings)
        self.inner: Executor | None = None

    async def start(self, plan: SessionPlan, host: PluginHost) -> None:
        from trajkit.plugins.local_executor.loop import OnThisLoop
        from trajkit.plugins.local_executor.pool import WorkerPool

        count = self.settings.processes
        if count is None:
            count = auto_processes(plan.config.num_workers, host)
        self.inner = WorkerPool(count) if count else OnThisLoop()
        await self.inner.start(plan, host)

    async def execute(self, work: Sequence[WorkOrder], driver: Driver) -> None:
        assert self.inner is not None, "start() first"
        await self.inner.execute(work, driver)

    def statistics(self) -> dict[str, Any]:
        return self.inner.statistics() if self.inner is not None else {}

    def spent(self) -> float:
        return self.inner.spent() if self.inner is not None else 0.0

    async def aclose(self) -> None:
        if self.inner is not None:
            await self.inner.aclose()


def auto_processes(in_flight: int, host: PluginHost) -> int:
    """The worker processes for ``in_flight`` sessions when ``--processes`` is not given."""
    from trajkit.manager import BY_CALLER
    from trajkit.plugins.local_executor.pool import plugin_names

    count = min(len(os.sched_getaffinity(0)), math.ceil(in_flight / SESSIONS_PER_PROCESS))
    if count < 2:
        return 0
    by_hand = {name for name, source in host.sources.items() if source == BY_CALLER}
    if by_hand or plugin_names(host) - set(host.sources):
        log.info("the sessions run on this process alone: plugins registered by hand are not the workers'")
        return 0
    return count
