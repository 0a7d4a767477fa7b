"""Request limits shared by every session of a run, adapting to an endpoint that rate-limits.

- at most ``max_concurrent`` requests at once;
- request starts spaced so that no more than ``max_rpm`` start in any minute;
- tokens (estimated before the call, corrected by the reported usage) below ``max_tpm`` a minute;
- 429s: a single one delays only its own request (its Retry-After, in the client's retry loop).
  When they persist (most of the recent answers are 429s), the run sends fewer requests at once:
  the allowed concurrency halves, at most once per cool-down, and new requests are held for the
  Retry-After. Once answers come back without 429s, the allowed concurrency grows back by a
  quarter at a time to where it was.

Time spent waiting here is trajkit's own doing, not the endpoint's: :func:`acquire` returns it, so
a request's retry budget leaves it out, and it pauses the session's deadline (see
:func:`session_deadline`), so it does not count against ``--prompt_timeout`` either.

A model client makes its limiter with :func:`new_limiter`. An executor whose sessions run in many
processes keeps the limits run-wide by making it there within :func:`shared_limits`, with a
factory whose limiters take their permits from one place (the ``ray`` executor's limiter actor).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field

_deadline: ContextVar[asyncio.Timeout | None] = ContextVar("trajkit_session_deadline", default=None)
LimiterFactory = Callable[[int | None, float | None, float | None], "RequestLimiter"]
"""(max_concurrent, max_rpm, max_tpm) -> the limiter a model client holds."""
_factory: ContextVar[LimiterFactory | None] = ContextVar("trajkit_limiter_factory", default=None)


@contextlib.contextmanager
def shared_limits(factory: LimiterFactory) -> Iterator[None]:
    """Within the block, :func:`new_limiter` makes its limiters with ``factory``."""
    token = _factory.set(factory)
    try:
        yield
    finally:
        _factory.reset(token)


def new_limiter(
    max_concurrent: int | None = None, max_rpm: float | None = None, max_tpm: float | None = None
) -> RequestLimiter:
    """The limiter of a model client: a :class:`RequestLimiter` of its own, or within
    :func:`shared_limits`, what the executor's factory makes (limits shared with other processes)."""
    factory = _factory.get()
    return (factory or RequestLimiter)(max_concurrent, max_rpm, max_tpm)


@contextlib.contextmanager
def session_deadline(timeout: asyncio.Timeout) -> Iterator[None]:
    """Within the block, waits on the run's own limits (:func:`own_wait`) stop ``timeout``'s clock."""
    token = _deadline.set(timeout)
    try:
        yield
    finally:
        _deadline.reset(token)


@contextlib.contextmanager
def own_wait() -> Iterator[None]:
    """A wait that trajkit imposes on itself: the current session's deadline moves back by its length.

    The deadline is switched off for the wait (so it cannot fire during it) and set again after,
    later by as long as the wait took. Outside a session, or nested in another such wait, a no-op.
    """
    timeout = _deadline.get()
    when = timeout.when() if timeout is not None else None
    if timeout is None or when is None or timeout.expired():
        yield
        return
    loop = asyncio.get_running_loop()
    started = loop.time()
    timeout.reschedule(None)
    try:
        yield
    finally:
        with contextlib.suppress(RuntimeError):  # the session's block has already ended
            timeout.reschedule(when + (loop.time() - started))


@dataclass
class LimiterStats:
    waited_s: float = 0.0
    throttled: int = 0
    """Times the allowed concurrency was cut because 429s persisted."""
    recovered: int = 0
    """Times it grew back all the way after a cut."""


@dataclass
class RequestLimiter:
    max_concurrent: int | None = None
    max_rpm: float | None = None
    max_tpm: float | None = None
    recover_after: int = 20
    """Answers without a 429 between two steps of growing the allowed concurrency back."""
    window: int = 32
    """How many recent answers are weighed to tell persisting 429s from a passing few."""
    cooldown: float = 5.0
    """Seconds after a cut before another cut (its effect must first show in the answers)."""
    clock: Callable[[], float] = time.monotonic
    stats: LimiterStats = field(default_factory=LimiterStats)

    def __post_init__(self) -> None:
        self.allowed = self.max_concurrent or 0  # 0: unlimited until persisting 429s teach otherwise
        self.ceiling = self.max_concurrent or 0
        """Where recovery stops: the configured limit, or (when unlimited) the level at the first cut."""
        self.active = 0
        self.waiting = 0
        self.successes = 0
        self.recent: deque[bool] = deque(maxlen=self.window)  # True: that answer was a 429
        self.recent_429 = 0
        self.cut_at = -float("inf")
        self.paused_until = 0.0
        self.next_start = 0.0
        self.tokens: deque[tuple[float, int]] = deque()
        self.token_sum = 0
        self.changed = asyncio.Condition()

    async def acquire(self, estimated_tokens: int = 0) -> float:
        """Wait for a slot; returns the seconds waited (0.0 on the common path)."""
        # One event loop, so the counters need no lock; the condition is only for waiting, and a
        # run without limits (the common case) never touches it.
        if not (self.allowed and self.active >= self.allowed) and not (
            self.max_rpm or self.max_tpm or self.paused_until
        ):
            self.active += 1
            return 0.0
        started = self.clock()
        with own_wait():
            if self.allowed and self.active >= self.allowed:
                self.waiting += 1
                try:
                    async with self.changed:
                        await self.changed.wait_for(lambda: not self.allowed or self.active < self.allowed)
                finally:
                    self.waiting -= 1
            self.active += 1
            try:
                await self._pace(estimated_tokens)
            except BaseException:
                await self.release()
                raise
        waited = self.clock() - started
        self.stats.waited_s += waited
        return waited

    async def _pace(self, estimated_tokens: int) -> None:
        while True:
            now = self.clock()
            wait = max(self.paused_until - now, 0.0)
            if wait == 0.0:
                self.paused_until = 0.0  # back on the fast path
            if self.max_rpm:
                wait = max(wait, self.next_start - now)
            if self.max_tpm:
                wait = max(wait, self._token_wait(now, estimated_tokens))
            if wait <= 0:
                break
            await asyncio.sleep(wait)
        if self.max_rpm:
            self.next_start = max(self.next_start, self.clock()) + 60.0 / self.max_rpm
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
        self.tokens.append((self.clock(), count))
        self.token_sum += count

    async def release(self, *, success: bool = True) -> None:
        """The request is over; ``success`` means the endpoint answered it (no 429 among them)."""
        self.active -= 1
        if success:
            self._note(rate_limited=False)
            if self.allowed and self.allowed < self.ceiling:
                self._grow()
        if self.waiting:
            async with self.changed:
                self.changed.notify_all()

    def _grow(self) -> None:
        self.successes += 1
        if self.successes < self.recover_after or self._persisting():
            return
        self.successes = 0
        self.allowed = min(self.ceiling, self.allowed + max(1, self.allowed // 4))
        if self.allowed >= self.ceiling:
            self.stats.recovered += 1
            if not self.max_concurrent:
                self.allowed = 0  # recovered: unlimited again

    def _note(self, *, rate_limited: bool) -> None:
        if len(self.recent) == self.recent.maxlen:
            self.recent_429 -= self.recent[0]
        self.recent.append(rate_limited)
        self.recent_429 += rate_limited

    def _persisting(self) -> bool:
        """Most of the recent answers (and enough of them to tell) were 429s."""
        # Half a window at least: a fifth of 429s, as a busy shared endpoint sends, would make a
        # majority of 8 answers one time in twenty; of 16, about one in four thousand.
        return 2 * len(self.recent) >= self.window and 2 * self.recent_429 > len(self.recent)

    async def throttled(self, retry_after: float | None) -> None:
        """The endpoint answered 429. Only when 429s persist does the whole run slow down."""
        self._note(rate_limited=True)
        now = self.clock()
        if not self._persisting() or now < self.cut_at + self.cooldown:
            return
        async with self.changed:
            self.stats.throttled += 1
            self.cut_at = now
            self.paused_until = max(
                self.paused_until, now + min(1.0 if retry_after is None else retry_after, self.cooldown)
            )
            current = self.allowed or max(self.active, 1)
            if not self.ceiling:
                self.ceiling = max(current, 2)
            self.allowed = max(1, current // 2)
            self.successes = 0
            # Weigh the answers to come with the cut in place, not those that caused it.
            self.recent.clear()
            self.recent_429 = 0
