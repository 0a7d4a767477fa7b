"""Run-wide request limits for Ray: the run's :class:`~trajkit.model.shared_limiter.SharedLimiter`
in a Ray actor, permits taken from there.

Every session actor's model client holds a :class:`RemoteLimiter` (made through
:func:`trajkit.model.ratelimit.shared_limits`) that asks the one limiter actor of the run for each
request's permit, counted per session actor (see :mod:`trajkit.model.shared_limiter`).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from trajkit.model.ratelimit import RequestLimiter, own_wait


class RemoteLimiter(RequestLimiter):
    """A model client's limiter whose permits come from the run's limiter actor (a :class:`~trajkit.model.shared_limiter.SharedLimiter`).

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
