"""Browsers inside the sessions' containers (``--browser.where sandbox``): what they cost.

``python -m bench.browser_inside --sessions 1,4`` starts that many sessions at once, each in a
container of ``trajkit-test/chromium`` (Docker, the backend's defaults: no network, 4 GiB, 1024
processes) whose own ``python3 -m http.server`` serves the pages of :mod:`bench.browser_sessions`
on the container's loopback. Each session calls the browser tools as there (navigate, click,
snapshot, type, back, scroll, navigate, 1 s apart), its first call starting the image's Chromium
in the container through the backend's bridge. Measured: each call's latency, the container's
memory (the engine's cgroup figure, page cache excluded) once the browser is open, and how long
the session's close (context and browser) takes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from bench import common
from bench.browser_sessions import FILLER, PAGES

IMAGE = "trajkit-test/chromium:latest"
SERVE = "exec python3 -m http.server 8000 --bind 127.0.0.1 --directory pages"
READY = (
    'for i in $(seq 100); do python3 -c "import urllib.request; urllib.request.urlopen('
    "'http://127.0.0.1:8000/links.html')\" 2>/dev/null && exit 0; sleep 0.1; done; exit 1"
)


async def memory_mib(container_id: str) -> float:
    """MiB the container's cgroup holds, less its inactive file cache (as ``docker stats``)."""
    return await asyncio.to_thread(_memory, container_id) / 2**20


def _memory(container_id: str) -> int:
    import docker

    client = docker.from_env()
    try:
        stats = client.api.stats(container_id, stream=False)["memory_stats"]
    finally:
        client.close()
    cache = stats.get("stats", {}).get("inactive_file", 0)
    return int(stats.get("usage", 0)) - int(cache)


async def one_session(
    run: Any, backend: Any, think: float, timings: dict[str, list[float]], found: dict[str, list[float]]
) -> None:
    from bench.browser_sessions import one_session as browse
    from trajkit.sandbox import SandboxSpec
    from trajkit.tools import ToolSession, close_session

    sandbox = await backend.create(
        SandboxSpec(run_id=f"bench-{uuid.uuid4().hex[:8]}", work_id="w0", image=IMAGE)
    )
    session = ToolSession(run)
    try:
        for name, text in PAGES.items():
            await sandbox.write_file(f"pages/{name}", text.format(filler=FILLER).encode())
        await sandbox.start_process(SERVE)
        if (await sandbox.exec(READY, timeout=30)).exit_code != 0:
            raise RuntimeError("the container's page server did not start")
        found.setdefault("memory_before_mib", []).append(await memory_mib(sandbox.container_id))

        async def opened() -> None:
            found.setdefault("memory_open_mib", []).append(await memory_mib(sandbox.container_id))

        errors: list[str] = []
        url = "http://127.0.0.1:8000"
        await browse(run, url, think, timings, errors, sandbox=sandbox, session=session, on_open=opened)
        found.setdefault("errors", []).extend([1.0] * len(errors))
    finally:
        started = time.perf_counter()
        await close_session(session, sandbox)
        found.setdefault("close_s", []).append(time.perf_counter() - started)


async def measure(sessions: int, args: argparse.Namespace) -> dict[str, Any]:
    from trajkit.config.resolve import resolve
    from trajkit.manager import load_plugins
    from trajkit.tools import open_toolsets
    from trajkit_docker import DockerBackend

    host = load_plugins(entry_points=False)
    options = {"where": "sandbox", "max_contexts": max(sessions, 16)}
    run = await open_toolsets(
        [host.toolsets["browser"]], resolve(host, {"toolset_options": {"browser": options}}), host
    )
    backend = DockerBackend({"pull": "never"})
    timings: dict[str, list[float]] = {}
    found: dict[str, list[float]] = {}
    started = time.perf_counter()
    try:
        await asyncio.gather(
            *(one_session(run, backend, args.think, timings, found) for _ in range(sessions))
        )
    finally:
        wall = time.perf_counter() - started
        await run.aclose()
        await backend.aclose()
    return {
        "sessions": sessions,
        "wall_s": round(wall, 1),
        "load_average": os.getloadavg(),
        "errors": len(found.get("errors", [])),
        "latency_s": {name: summary(values) for name, values in sorted(timings.items())},
        "container_memory_mib": {
            "before_browser": summary(found.get("memory_before_mib", [])),
            "browser_open": summary(found.get("memory_open_mib", [])),
        },
        "session_close_s": summary(found.get("close_s", [])),
    }


def summary(values: list[float]) -> dict[str, Any]:
    if not values:
        return {}
    ordered = sorted(values)
    return {
        "n": len(values),
        "p50": round(statistics.median(values), 3),
        "p95": round(ordered[max(int(len(values) * 0.95) - 1, 0)], 3),
        "max": round(max(values), 3),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.browser_inside", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--sessions", default="1,4", help="comma-separated counts of sessions started at once"
    )
    parser.add_argument("--think", type=float, default=1.0, help="seconds between a session's calls")
    parser.add_argument("--json", type=Path, help="write the results to this file")
    parser.add_argument("--source", type=Path, help="import trajkit from this directory (another checkout)")
    args = parser.parse_args(argv)
    common.use_source(args.source)
    if reason := common.docker_available(IMAGE):
        print(f"browser_inside: skipped: {reason}")
        return
    results = []
    for count in (int(n) for n in args.sessions.split(",")):
        result = asyncio.run(measure(count, args))
        print(json.dumps(result, indent=2), flush=True)
        results.append(result)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
