"""An endpoint that cannot be reached mid-run: hold the requests, probe it, stop after a bound.

Without this, every session in flight would spend its own retries on a host that is down and
fail one by one, each prompt recorded as failed. Instead, after a few connection failures in a
row (with no answer of any kind between them), new requests wait while one request at a time
probes the endpoint, spaced by the project's backoff policy. The first answer lets everyone
through again; if none comes within ``bound`` seconds of the first failure, every waiting
request (and any later one) fails with :class:`~trajkit.model.ModelUnreachable`, which stops the
run with one message. Waiting here pauses the session's deadline like the rate limiter does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from trajkit.model import ModelUnreachable
from trajkit.model.ratelimit import own_wait
from trajkit.model.retry import backoff_delay

log = logging.getLogger("trajkit")

PROBE_BACKOFF = (1.0, 15.0)
"""Base and cap, in seconds, between two probes of an endpoint that did not answer."""


class ConnectionGuard:
    def __init__(
        self,
        host: str,
        *,
        bound: float,
        threshold: int = 3,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.host = host
        self.bound = bound
        self.threshold = threshold
        self.clock = clock
        self.failures = 0
        """Connection failures in a row, across every session, with no answer in between."""
        self.since = 0.0
        self.reason = ""
        self.probing = False
        self.probes = 0
        self.next_probe = 0.0
        self.fatal: ModelUnreachable | None = None
        self.outages = 0
        self._changed = asyncio.Event()

    @property
    def down(self) -> bool:
        return self.failures >= self.threshold

    async def admit(self) -> tuple[bool, float]:
        """Wait until a request may go out; returns (is it a probe, seconds waited)."""
        if self.fatal is not None:
            raise self.fatal
        if not self.down:
            return False, 0.0
        started = self.clock()
        with own_wait():
            while True:
                now = self.clock()
                if self.fatal is None and now - self.since >= self.bound:
                    self.fatal = ModelUnreachable(
                        f"cannot connect to {self.host}: {self.reason} (no answer for {now - self.since:.0f}s;"
                        " continue with --resume once the endpoint is back)"
                    )
                if self.fatal is not None:
                    raise self.fatal
                if not self.down:
                    return False, self.clock() - started
                if not self.probing and now >= self.next_probe:
                    self.probing = True
                    return True, self.clock() - started
                wake = self.next_probe if not self.probing else now + self.bound
                await self._wait(min(wake, self.since + self.bound) - now)

    async def _wait(self, seconds: float) -> None:
        changed = self._changed
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(seconds, 0.0)):
                await changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def answered(self) -> None:
        """Any HTTP answer (even an error status): the endpoint is reachable."""
        if not self.failures:
            return
        if self.down:
            log.warning(
                "%s answers again after %.0fs: model requests go on", self.host, self.clock() - self.since
            )
        self.failures = 0
        self.probes = 0
        self.probing = False
        self._notify()

    def failed(self, reason: str) -> None:
        """A connection to the endpoint could not be made."""
        now = self.clock()
        if not self.failures:
            self.since = now
        self.failures += 1
        self.reason = reason
        if self.failures == self.threshold:
            self.outages += 1
            log.warning(
                "cannot connect to %s: %s; holding model requests until it answers (the run stops"
                " if it does not within %.0fs)",
                self.host,
                reason,
                self.bound,
            )
        if self.down:
            self.probes += 1
            self.next_probe = now + backoff_delay(self.probes, *PROBE_BACKOFF)
        self.probing = False
        self._notify()

    def probe_over(self) -> None:
        """The probe ended without telling anything (a timeout, a cancellation): let another go."""
        if self.probing:
            self.probing = False
            self._notify()
