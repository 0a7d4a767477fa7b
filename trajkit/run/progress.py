"""Progress of a run: a live bar on a terminal, periodic plain log lines otherwise.

The display only reads counters that the runner updates; rendering happens on its own timer
(rich's refresh thread, or a log line every few seconds), never once per event.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import deque
from dataclasses import dataclass, field

log = logging.getLogger("trajkit")


@dataclass
class Counters:
    total: int = 0
    succeeded: int = 0
    rejected: int = 0
    failed: int = 0
    in_flight: int = 0
    tokens: int = 0
    cost: float = 0.0
    errors: deque[str] = field(default_factory=lambda: deque(maxlen=3))
    """The latest errors, one line each."""
    started: float = field(default_factory=time.monotonic)

    def line(self) -> str:
        finished = self.succeeded + self.failed
        elapsed = time.monotonic() - self.started
        rate = self.succeeded / elapsed if elapsed > 0 else 0.0
        remaining = self.total - finished
        eta = f"{remaining / rate:.0f}s" if rate > 0 else "?"
        text = (
            f"done {self.succeeded}/{self.total} (rejected {self.rejected}) failed {self.failed} "
            f"in flight {self.in_flight} | {rate:.2f}/s eta {eta} | tokens {self.tokens}"
        )
        if self.cost:
            text += f" cost ${self.cost:.4f}"
        return text


class Reporter:
    """Shows :class:`Counters` while a run goes on."""

    def __init__(self, counters: Counters, *, quiet: bool = False, interval: float = 10.0) -> None:
        self.counters = counters
        self.quiet = quiet
        self.interval = interval
        self.live: object | None = None
        self.last_log = time.monotonic()

    def __enter__(self) -> Reporter:
        if not self.quiet and sys.stderr.isatty():
            from rich.console import Console
            from rich.live import Live
            from rich.text import Text

            counters = self.counters

            class _View:
                def __rich__(self) -> Text:
                    return Text("\n".join([counters.line(), *(f"  ! {e}" for e in counters.errors)]))

            live = Live(_View(), console=Console(stderr=True), refresh_per_second=4, transient=False)
            live.start()
            self.live = live
        return self

    def tick(self) -> None:
        """Called by the runner as work finishes; logs at most once per interval."""
        if self.live is None and not self.quiet and time.monotonic() - self.last_log >= self.interval:
            self.last_log = time.monotonic()
            log.info("%s", self.counters.line())

    def __exit__(self, *_: object) -> None:
        if self.live is not None:
            self.live.stop()  # type: ignore[attr-defined]
        elif not self.quiet:
            log.info("%s", self.counters.line())
