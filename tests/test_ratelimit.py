"""The run's own limits: 429s that persist (not a passing few) slow the run, and it recovers;
the run's own waits leave the session's deadline alone; an unreachable endpoint holds requests."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from trajkit.model import ModelUnreachable
from trajkit.model.outage import ConnectionGuard
from trajkit.model.ratelimit import RequestLimiter, own_wait, session_deadline
from trajkit.model.retry import backoff_delay


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def answer(limiter: RequestLimiter, *, rate_limited: bool) -> None:
    await limiter.acquire()
    if rate_limited:
        await limiter.throttled(0.0)
    await limiter.release(success=not rate_limited)


async def test_a_passing_429_slows_nothing_down() -> None:
    limiter = RequestLimiter(max_concurrent=8)
    await answer(limiter, rate_limited=True)
    assert limiter.allowed == 8 and limiter.paused_until == 0.0
    assert await limiter.acquire() == 0.0  # no pause for the rest of the run


async def test_a_steady_fifth_of_429s_never_cuts_concurrency() -> None:
    limiter = RequestLimiter(max_concurrent=64, clock=Clock())
    for number in range(2000):
        await answer(limiter, rate_limited=number % 5 == 2)
    assert limiter.stats.throttled == 0 and limiter.allowed == 64


async def test_persisting_429s_cut_once_per_cooldown_then_recover_when_they_stop() -> None:
    clock = Clock()
    limiter = RequestLimiter(max_concurrent=16, recover_after=4, cooldown=5.0, clock=clock)
    for _ in range(40):
        await answer(limiter, rate_limited=True)
    assert (limiter.stats.throttled, limiter.allowed) == (1, 8), "one cut within the cool-down"
    clock.now += 6
    for _ in range(40):
        await answer(limiter, rate_limited=True)
    assert (limiter.stats.throttled, limiter.allowed) == (2, 4)
    clock.now += 6
    for _ in range(200):
        await answer(limiter, rate_limited=False)
    assert limiter.allowed == 16 and limiter.stats.recovered == 1


async def test_an_unlimited_run_is_unlimited_again_after_recovering() -> None:
    clock = Clock()
    limiter = RequestLimiter(recover_after=2, clock=clock)
    held = [await limiter.acquire() for _ in range(10)]
    for _ in range(20):
        await limiter.throttled(0.0)
    assert limiter.allowed == 5 and len(held) == 10
    for _ in range(10):
        await limiter.release(success=False)
    clock.now += 10
    for _ in range(100):
        await answer(limiter, rate_limited=False)
    assert limiter.allowed == 0  # no limit, as configured


async def test_waiting_for_the_limiter_does_not_use_up_the_session_deadline() -> None:
    """One slot, held for longer than the session's whole deadline: the session still finishes."""
    limiter = RequestLimiter(max_concurrent=1)
    await limiter.acquire()

    async def session(paused: bool) -> str:
        async with asyncio.timeout(0.3) as deadline:
            with session_deadline(deadline) if paused else contextlib.nullcontext():
                await limiter.acquire()
                await limiter.release()
                await asyncio.sleep(0.05)  # the session's own work, well within its deadline
        return "done"

    waiting = asyncio.gather(session(True), session(False), return_exceptions=True)
    await asyncio.sleep(0.6)
    await limiter.release()
    paused, counted = await waiting
    assert paused == "done"
    assert isinstance(counted, TimeoutError), "without the session's deadline registered, the wait counts"


async def test_own_wait_moves_the_deadline_back() -> None:
    async with asyncio.timeout(10) as deadline:
        with session_deadline(deadline):
            before = deadline.when()
            assert before is not None
            with own_wait():
                assert deadline.when() is None  # cannot fire during the wait
                await asyncio.sleep(0.01)
            after = deadline.when()
    assert after is not None and after > before


def test_one_backoff_policy_doubles_with_jitter_and_a_cap() -> None:
    for attempt, step in [(1, 2.0), (2, 4.0), (3, 8.0)]:
        delays = [backoff_delay(attempt, 2.0) for _ in range(200)]
        assert step / 2 <= min(delays) and max(delays) <= step
        assert len(set(delays)) > 100, "jittered"
    assert backoff_delay(30, 2.0, cap=60.0) <= 60.0


async def test_an_unreachable_endpoint_holds_requests_and_lets_one_probe() -> None:
    guard = ConnectionGuard("h:1", bound=60.0, threshold=3)
    assert await guard.admit() == (False, 0.0)
    for _ in range(3):
        guard.failed("Connection refused")
    guard.next_probe = 0.0  # due now
    probe, _ = await guard.admit()
    assert probe
    held = asyncio.ensure_future(guard.admit())
    await asyncio.sleep(0.05)
    assert not held.done(), "one probe at a time"
    guard.answered()
    assert (await held)[0] is False
    assert guard.outages == 1 and not guard.down


async def test_an_endpoint_unreachable_past_the_bound_stops_every_request() -> None:
    guard = ConnectionGuard("h:1", bound=0.2, threshold=1)
    guard.failed("Connection refused")
    results = await asyncio.gather(*(guard.admit() for _ in range(5)), return_exceptions=True)
    errors = [r for r in results if isinstance(r, ModelUnreachable)]
    assert len(errors) >= 4  # one may have been let through as the probe before the bound
    assert "cannot connect to h:1: Connection refused" in str(errors[0])
    assert errors[0].stops_run
    with pytest.raises(ModelUnreachable):
        await guard.admit()
