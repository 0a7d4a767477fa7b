"""Request limits shared by every session of a run, with adaptive slow-down on rate limiting.

- at most ``max_concurrent`` requests at once;
- request starts spaced so that no more than ``max_rpm`` start in any minute;
- tokens (estimated before the call, corrected by the reported usage) below ``max_tpm`` a minute;
- when the endpoint answers 429, the whole run pauses for its Retry-After and halves the
  concurrency it allows itself, then grows it back by one per run of successes (AIMD).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field


@dataclass
class LimiterStats:
    waited_s: float = 0.0
    throttled: int = 0


@dataclass
class RequestLimiter:
    max_concurrent: int | None = None
    max_rpm: float | None = None
    max_tpm: float | None = None
    recover_after: int = 20
    """Successes in a row before the allowed concurrency grows by one again."""
    stats: LimiterStats = field(default_factory=LimiterStats)

    def __post_init__(self) -> None:
        self.allowed = self.max_concurrent or 0  # 0: unlimited until a 429 teaches otherwise
        self.ceiling = self.max_concurrent or 0
        """Where recovery stops: the configured limit, or (when unlimited) twice the level of the 429."""
        self.active = 0
        self.waiting = 0
        self.successes = 0
        self.paused_until = 0.0
        self.next_start = 0.0
        self.tokens: deque[tuple[float, int]] = deque()
        self.token_sum = 0
        self.changed = asyncio.Condition()

    async def acquire(self, estimated_tokens: int = 0) -> None:
        # One event loop, so the counters need no lock; the condition is only for waiting, and a
        # run without limits (the common case) never touches it.
        started = time.monotonic()
        if self.allowed and self.active >= self.allowed:
            self.waiting += 1
            try:
                async with self.changed:
                    await self.changed.wait_for(lambda: not self.allowed or self.active < self.allowed)
            finally:
                self.waiting -= 1
        self.active += 1
        if self.max_rpm or self.max_tpm or self.paused_until > started:
            try:
                await self._pace(estimated_tokens)
            except BaseException:
                await self.release()
                raise
        self.stats.waited_s += time.monotonic() - started

    async def _pace(self, estimated_tokens: int) -> None:
        while True:
            now = time.monotonic()
            wait = max(self.paused_until - now, 0.0)
            if self.max_rpm:
                wait = max(wait, self.next_start - now)
            if self.max_tpm:
                wait = max(wait, self._token_wait(now, estimated_tokens))
            if wait <= 0:
                break
            await asyncio.sleep(wait)
        if self.max_rpm:
            self.next_start = max(self.next_start, time.monotonic()) + 60.0 / self.max_rpm
        if self.max_tpm:
            self.record_tokens(estimated_tokens)

    def _token_wait(self, now: float, estimated: int) -> float:
        assert self.max_tpm is not None
        while self.tokens and self.tokens[0][0] <= now - 60:
            self.token_sum -= self.tokens.popleft()[1]
        if not self.tokens or self.token_sum + estimated <= self.max_tpm:
            return 0.0
        return self.tokens[0][0] + 60 - now

    def record_tokens(self, count: int) -> None:
        """Add tokens to the last minute's budget (negative corrects an over-estimate)."""
        self.tokens.append((time.monotonic(), count))
        self.token_sum += count

    async def release(self, *, success: bool = True) -> None:
        self.active -= 1
        if success and self.allowed and self.allowed < self.ceiling:
            self.successes += 1
            if self.successes >= self.recover_after:
                self.allowed += 1
                self.successes = 0
                if self.allowed >= self.ceiling and not self.max_concurrent:
                    self.allowed = 0  # recovered: unlimited again
        if self.waiting:
            async with self.changed:
                self.changed.notify_all()

    async def throttled(self, retry_after: float) -> None:
        """The endpoint said 429: everyone waits, and fewer requests go out at once for a while."""
        async with self.changed:
            self.stats.throttled += 1
            self.paused_until = max(self.paused_until, time.monotonic() + retry_after)
            current = self.allowed or max(self.active, 1)
            if not self.max_concurrent and not self.allowed:
                self.ceiling = 2 * current
            self.allowed = max(1, current // 2)
            self.successes = 0
