"""A tri-state switch for tests that need a container engine, and what such tests look at.

On a machine without the engine such tests skip; with ``TRAJKIT_REQUIRE_ENGINES`` naming the engine
(comma-separated names, or ``all``), as CI sets it, a missing engine is a failure instead, so a CI run
can never pass by skipping.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def engine_required(name: str) -> bool:
    wanted = {
        part.strip() for part in os.environ.get("TRAJKIT_REQUIRE_ENGINES", "").split(",") if part.strip()
    }
    return "all" in wanted or name in wanted


def need_engine(name: str, reason: str | None) -> None:
    """Skip (or, when required, fail) the calling test if ``reason`` says the engine is missing."""
    if reason is None:
        return
    message = f"{name} engine not available: {reason}"
    if engine_required(name):
        pytest.fail(f"{message} (TRAJKIT_REQUIRE_ENGINES requires it)", pytrace=False)
    pytest.skip(message)


def pids_cgroup(pid: int) -> Path:
    """The directory of the pids cgroup holding process ``pid`` (cgroup v1 or v2): its
    ``pids.current`` counts a container's processes and threads, its ``pids.max`` limits them."""
    lines = [line.split(":", 2) for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()]
    separate = [path for _, controllers, path in lines if "pids" in controllers.split(",")]
    if separate:
        return Path(f"/sys/fs/cgroup/pids{separate[0]}")
    unified = next(path for _, controllers, path in lines if controllers == "")
    return Path(f"/sys/fs/cgroup{unified}")
