"""The garbage collector while a process runs sessions.

A thousand sessions in flight allocate hundreds of thousands of objects a second, nearly all freed
by their reference counts; with the interpreter's defaults (a collection of the youngest generation
every 700 allocations, each promoting what is alive at that moment towards the full collections)
the collector took 11-13 % of a worker process's CPU at 1,000 sessions in flight, and 30 % of the
load server's (BENCHMARKS.md, section 2, "Fewer inodes, a quieter collector").
"""

from __future__ import annotations

import gc

YOUNG_COLLECTION_EVERY = 50_000
"""Allocations between two collections of the youngest generation (the interpreter's default: 700)."""


def settle_for_sessions() -> tuple[int, int, int]:
    """Call once what lives through the sessions exists (modules, plugins, the plan): it is frozen,
    so no collection scans it again, and young collections become rarer. Returns the thresholds
    before, for :func:`unsettle`."""
    before = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION_EVERY, before[1], before[2])
    return before


def unsettle(before: tuple[int, int, int]) -> None:
    """Undo :func:`settle_for_sessions` (a process that goes on with other work after the sessions)."""
    gc.set_threshold(*before)
    gc.unfreeze()
