"""A tri-state switch for tests that need a container engine, and what such tests look at.

On a machine without the engine such tests skip; with ``TRAJKIT_REQUIRE_ENGINES`` naming the engine
(comma-separated names, or ``all``), as CI sets it, a missing engine is a failure instead, so a CI run
can never pass by skipping.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from trajkit.sandbox import ExecResult, Sandbox


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


FILLING_COMMAND = "i=0; while [ $i -lt 10 ]; do sleep 1000 & i=$((i+1)); done; sleep 2; exit 7"
"""Leaves ten processes behind and ends with status 7 two seconds after it started them."""


async def exec_leaving_the_limit_full(sandbox: Sandbox, cgroup: Path) -> tuple[ExecResult, int, int]:
    """Run :data:`FILLING_COMMAND` in ``sandbox``, whose processes ``cgroup`` (see :func:`pids_cgroup`)
    counts, with ``pids.max`` lowered once its processes are running so that, when its shell and its
    last ``sleep`` have ended, no process can start: what runs after the command (the backend's
    cleanup) must do without. ``pids.max`` is restored. Returns the exec's result and the cgroup's
    count before the command and after the exec."""
    counted, limit = cgroup / "pids.current", cgroup / "pids.max"
    before, previous = int(counted.read_text()), limit.read_text()
    running = asyncio.ensure_future(sandbox.exec(FILLING_COMMAND, timeout=60))
    try:
        while int(counted.read_text()) < before + 12:  # its shell, ten sleeps and `sleep 2`
            await asyncio.sleep(0.05)
        limit.write_text(str(int(counted.read_text()) - 2))
        result = await asyncio.wait_for(running, 30)
        return result, before, int(counted.read_text())
    finally:
        limit.write_text(previous)
