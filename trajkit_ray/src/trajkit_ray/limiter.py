"""Run-wide request limits: one :class:`RequestLimiter` in a Ray actor, permits taken from there.

Every session actor's model client holds a :class:`RemoteLimiter` (made through
:func:`trajkit.model.ratelimit.shared_limits`) that asks the one :class:`LimiterActor` of the run for
each request's permit, so ``--max_concurrent_requests``, ``--max_rpm`` and ``--max_tpm`` hold
for the whole run, not once per actor, and persisting 429s slow every actor down. Permits are
counted per holder (a session actor): when the driver finds an actor lost, :meth:`forget` refuses
it further permits and gives back what it held, so a lost node neither shrinks the run's
concurrency for good nor, if its process lives on for a while, exceeds it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from typing import Any

from trajkit.model.ratelimit import RequestLimiter, own_wait


class LostHolder(RuntimeError):
    """A request of a session actor that the driver has declared lost: it is not sent."""

    def __init__(self, holder: str) -> None:
        super().__init__(f"session actor {holder} was declared lost: its sessions send no more requests")


class LimiterActor:
    """The run's one limiter (a Ray async actor; every method runs on its event loop)."""

    def __init__(self) -> None:
        self.limiter = RequestLimiter()
        self.configured = False
        self.held: Counter[str] = Counter()
        self.gone: set[str] = set()
        self.reclaiming: set[asyncio.Task[None]] = set()

    def configure(self, max_concurrent: int | None, max_rpm: float | None, max_tpm: float | None) -> None:
        """The limits, from the first session actor whose model client has some (all have the same)."""
        if not self.configured:
            self.limiter = RequestLimiter(max_concurrent, max_rpm, max_tpm)
            self.configured = True

    async def acquire(self, holder: str, estimated_tokens: int) -> tuple[float, int, int]:
        """A permit for ``holder``: (seconds waited, times throttled, times recovered).

        A holder the driver has declared lost gets none: its process may live on for a while
        (its node cut off, not yet dead), and must not send requests beyond the run's limits.
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


class RemoteLimiter(RequestLimiter):
    """A model client's limiter whose permits come from the run's :class:`LimiterActor`.

    A request waits for its permit as long as the shared limiter makes it (counted as the run's
    own wait: the session's deadline is paused). A cancelled wait gives its permit back once the
    actor has granted it.
    """

    def __init__(
        self,
        actor: Any,
        holder: str,
        max_concurrent: int | None,
        max_rpm: float | None,
        max_tpm: float | None,
    ) -> None:
        super().__init__(max_concurrent, max_rpm, max_tpm)
        self.actor = actor
        self.holder = holder
        self.pending: set[asyncio.Task[None]] = set()

    async def acquire(self, estimated_tokens: int = 0) -> float:
        ref = self.actor.acquire.remote(self.holder, estimated_tokens)
        try:
            with own_wait():
                waited, throttled, recovered = await ref
        except asyncio.CancelledError:
            task = asyncio.ensure_future(self._give_back(ref))
            self.pending.add(task)
            task.add_done_callback(self.pending.discard)
            raise
        self.active += 1
        self.stats.waited_s += waited
        self.stats.throttled, self.stats.recovered = throttled, recovered
        return float(waited)

    async def _give_back(self, ref: Any) -> None:
        with contextlib.suppress(Exception):
            await ref
            await self.actor.release.remote(self.holder, False)

    async def release(self, *, success: bool = True) -> None:
        self.active -= 1
        self.actor.release.remote(self.holder, success)  # not awaited: nothing waits on it here

    async def throttled(self, retry_after: float | None) -> None:
        await self.actor.throttled.remote(retry_after)

    def record_tokens(self, count: int) -> None:
        self.actor.record_tokens.remote(count)
