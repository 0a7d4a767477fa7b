"""Pacing for sandbox creation.

Modal rate-limits sandbox creation per workspace (a few per second). A run that starts hundreds of
sessions at once would otherwise hit that limit in a burst and turn most of its first prompts into
errors. Every creation therefore takes a token from one bucket shared by the whole backend, and a
creation the service still refuses is retried after an exponentially growing, jittered delay that
also holds back every other creator.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable


class TokenBucket:
    """Lets ``rate`` acquisitions per second through on average, and up to ``burst`` at once.

    Waiters are served in arrival order (the lock is held while sleeping), so a steady stream of
    creators cannot starve an early one.
    """

    def __init__(
        self,
        rate: float,
        burst: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be positive, not {rate}")
        if burst < 1:
            raise ValueError(f"burst must be at least 1, not {burst}")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._sleep = sleep
        self._tokens = burst
        self._last = clock()
        self._paused_until = 0.0
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        """Wait until a token is available and take it."""
        async with self._lock:
            while True:
                now = self._clock()
                if now < self._paused_until:
                    await self._sleep(self._paused_until - now)
                    continue
                self._refill(now)
                if self._tokens >= 1:
                    self._tokens -= 1
                    return
                await self._sleep((1 - self._tokens) / self.rate)

    def pause(self, seconds: float) -> None:
        """Hold back every acquisition for ``seconds``: the service said we are going too fast.

        The bucket is empty when the pause ends and refills only from then on, so creation resumes
        at the steady rate instead of with a burst that would be refused again.
        """
        now = self._clock()
        self._refill(now)
        self._tokens = min(self._tokens, 0.0)
        self._paused_until = max(self._paused_until, now + seconds)
        self._last = max(self._last, self._paused_until)

    def _refill(self, now: float) -> None:
        if now > self._last:
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
            self._last = now


def backoff_delay(attempt: int, base: float, cap: float, rng: Callable[[], float] = random.random) -> float:
    """Delay before retry number ``attempt`` (0-based): exponential, with "equal jitter".

    Half of the exponential step is fixed and half is random, so delays keep growing from one
    attempt to the next while concurrent retries still spread out instead of colliding again.
    """
    step = min(cap, base * 2**attempt)
    return step / 2 + rng() * step / 2
