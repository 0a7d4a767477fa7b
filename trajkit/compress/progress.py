"""The progress of ``trajkit compress``: a bar on a terminal, a log line now and then otherwise,
and the table at the end. Progress is measured in bytes of input read, so no first pass over the
input is needed to know its length."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any

from trajkit.compress.metrics import Metrics

log = logging.getLogger("trajkit")

LOG_INTERVAL = 10.0


class Display:
    def __init__(self, source: Path, *, quiet: bool) -> None:
        self.total = source.stat().st_size
        self.quiet = quiet
        self.progress: Any = None
        self.task: Any = None
        self.last = time.monotonic()

    def __enter__(self) -> Display:
        if not self.quiet and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(
                TextColumn("compressing"),
                BarColumn(),
                TextColumn("{task.percentage:>3.0f}%"),
                TextColumn("{task.fields[status]}"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                refresh_per_second=4,
            )
            self.progress.start()
            self.task = self.progress.add_task("compress", total=self.total or 1, status="")
        return self

    def update(self, position: int, metrics: Metrics) -> None:
        if self.progress is not None:
            status = (
                f"{metrics.records} records, {metrics.under_budget} under budget, {metrics.flagged} failed"
            )
            self.progress.update(self.task, completed=position, status=status)
        elif not self.quiet and time.monotonic() - self.last >= LOG_INTERVAL:
            self.last = time.monotonic()
            share = f"{100 * position / self.total:.0f}%" if self.total else "?"
            log.info("compress: %s of the input, %d records written", share, metrics.records)

    def __exit__(self, *_: object) -> None:
        if self.progress is not None:
            self.progress.stop()


def print_table(metrics: Metrics, output: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"trajkit compress: {output}", show_header=False)
    table.add_column("what")
    table.add_column("figure", justify="right")
    for what, figure in metrics.rows():
        table.add_row(what, figure)
    Console(stderr=True).print(table)
