"""Request limits held for a whole run whose sessions run in several processes.

An executor that runs sessions elsewhere keeps one :class:`SharedLimiter` where its driver is;
each process's model clients ask it for their permits (made through
:func:`trajkit.model.ratelimit.shared_limits`), so ``--max_concurrent_requests``, ``--max_rpm`` and
``--max_tpm`` hold for the whole run, not once per process, and persisting 429s slow every process
down. Permits are counted per holder (a worker process, a session actor): when the driver finds
one lost, :meth:`SharedLimiter.forget` refuses it further permits and gives back what it held, so
a lost holder neither shrinks the run's concurrency for good nor, if it lives on for a while,
exceeds it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from trajkit.model.ratelimit import RequestLimiter


class LostHolder(RuntimeError):
    """A request of a holder (a worker process, a session actor) that the driver has declared lost: it is not sent."""

    def __init__(self, holder: str) -> None:
        super().__init__(f"{holder} was declared lost: its sessions send no more requests")


class SharedLimiter:
    """The run's one limiter, where the executor's driver keeps it (a Ray actor, the runner)."""

    def __init__(self) -> None:
        self.limiter = RequestLimiter()
        self.configured = False
        self.held: Counter[str] = Counter()
        self.gone: set[str] = set()
        self.reclaiming: set[asyncio.Task[None]] = set()

    def configure(self, max_concurrent: int | None, max_rpm: float | None, max_tpm: float | None) -> None:
        """The limits, from the first holder whose model client has some (all have the same)."""
        if not self.configured:
            self.limiter = RequestLimiter(max_concurrent, max_rpm, max_tpm)
            self.configured = True

    async def acquire(self, holder: str, estimated_tokens: int) -> tuple[float, int, int]:
        """A permit for ``holder``: (seconds waited, times throttled, times recovered).

        A holder the driver has declared lost gets none: its process may live on for a while
        (a node cut off, not yet dead), and must not send requests beyond the run's limits.
        """
        if holder in self.gone:
            raise LostHolder(holder)
        waited = await self.limiter.acquire(estimated_tokens)
        if holder in self.gone:  # declared lost while it waited
            await self.limiter.release(success=False)
            raise LostHolder(holder)
        self.held[holder] += 1
        return waited, self.limiter.stats.throttled, self.limiter.stats.recovered

    async def release(self, holder: str, success: bool) -> None:
        if self.held[holder] > 0:
            self.held[holder] -= 1
            await self.limiter.release(success=success)

    async def throttled(self, retry_after: float | None) -> None:
        await self.limiter.throttled(retry_after)

    def record_tokens(self, count: int) -> None:
        self.limiter.record_tokens(count)

    async def forget(self, holder: str, grace: float) -> int:
        """``holder`` is lost: it gets no more permits, and those it holds come back as it releases
        them or, at the latest, after ``grace`` seconds. Returns how many it held."""
        self.gone.add(holder)
        count = self.held[holder]
        if count:
            task = asyncio.ensure_future(self._reclaim(holder, grace))
            self.reclaiming.add(task)
            task.add_done_callback(self.reclaiming.discard)
        return count

    async def _reclaim(self, holder: str, grace: float) -> None:
        await asyncio.sleep(grace)
        for _ in range(self.held.pop(holder, 0)):
            await self.limiter.release(success=False)

    def state(self) -> dict[str, Any]:
        return {
            "active": self.limiter.active,
            "held": {holder: count for holder, count in self.held.items() if count},
            "throttled": self.limiter.stats.throttled,
            "recovered": self.limiter.stats.recovered,
        }
