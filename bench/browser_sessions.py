"""Browser sessions in flight: tool-call latency, memory per open context, sessions per minute.

``python -m bench.browser_sessions --sessions 50,200`` starts that many browsing sessions at once
against loopback pages (served by ``http.server`` in a process of its own), each calling the
browser tools the way a model does (navigate, snapshot, click, type, back, scroll) with a pause
between calls standing for the model's latency. The toolset runs as in a run: its proxy, its
shared Chromium processes and its run-wide cap on open contexts (sessions beyond it wait). The
memory of the browser processes (PSS, so shared pages are counted once) is sampled while they run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench import common

PAGES = {
    "links.html": "<title>Links</title><h1>Links</h1><p>{filler}</p><a href='/form.html'>The form</a>"
    "<div style='height:3000px'></div><p>End</p>",
    "form.html": "<title>Form</title><form action='/links.html'><label>Name <input name=n></label>"
    "<button>Send</button></form><p>{filler}</p>",
}
FILLER = "Lorem ipsum dolor sit amet. " * 40
CLK_TCK = os.sysconf("SC_CLK_TCK")


def serve(directory: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The pages on a loopback port by ``python -m http.server`` (stopped by the caller)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "http.server",
            str(port),
            "--bind",
            "127.0.0.1",
            "--directory",
            str(directory),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as attempt:
            if attempt.connect_ex(("127.0.0.1", port)) == 0:
                return process, f"127.0.0.1:{port}"
        time.sleep(0.05)
    process.kill()
    raise RuntimeError("the page server did not start")


def descendants() -> list[int]:
    """The processes this one started, and theirs (the browsers and Playwright's driver)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, stack = [], list(children.get(os.getpid(), []))
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found


def browser_usage(cpu: dict[int, float]) -> int:
    """Bytes of PSS of this process's descendants; their CPU seconds so far recorded in ``cpu``."""
    total = 0
    for pid in descendants():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            cpu[pid] = (int(fields[11]) + int(fields[12])) / CLK_TCK
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
        except (OSError, IndexError, ValueError):
            continue
    return total


async def one_session(
    run: Any,
    url: str,
    think: float,
    timings: dict[str, list[float]],
    errors: list[str],
    *,
    sandbox: Any = None,
    session: Any = None,
    on_open: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """One session's browsing; its ``session`` is closed here unless the caller gives one, and
    ``on_open`` is awaited once its first page is open."""
    import re

    from trajkit.plugins.browser.toolset import TOOLS
    from trajkit.tools import ToolContext, ToolError, ToolSession

    tools = {tool.name: tool.run for tool in TOOLS}
    own = session is None
    session = session or ToolSession(run)
    ctx = ToolContext(sandbox=sandbox, output_cap=32 * 1024, session=session)

    async def call(name: str, key: str | None = None, **args: Any) -> dict[str, Any]:
        started = time.perf_counter()
        try:
            result = json.loads(await tools[name](args, ctx))
        except ToolError as exc:
            errors.append(f"{name}: {exc}")
            return {}
        finally:
            timings.setdefault(key or name, []).append(time.perf_counter() - started)
        await asyncio.sleep(think)
        return result

    try:
        opened = await call(
            "browser_navigate", "first browser_navigate (waits for a context)", url=f"{url}/links.html"
        )
        if on_open is not None:
            await on_open()
        link = re.search(r'link "The form" \[ref=(\w+)\]', opened.get("snapshot", ""))
        if link:
            form = await call("browser_click", ref=link.group(1))
            snapshot = (await call("browser_snapshot")).get("snapshot", "") if form else ""
            box = re.search(r'textbox "Name" \[ref=(\w+)\]', snapshot)
            if box:
                await call("browser_type", ref=box.group(1), text="bench")
            await call("browser_back")
        await call("browser_scroll", direction="down")
        await call("browser_navigate", url=f"{url}/form.html")
    finally:
        if own:
            await session.aclose()


async def measure(sessions: int, args: argparse.Namespace, url: str) -> dict[str, Any]:
    from trajkit.config.resolve import resolve
    from trajkit.manager import load_plugins
    from trajkit.tools import open_toolsets

    host = load_plugins(entry_points=False)
    options = {"max_contexts": args.max_contexts, "browsers": args.browsers}
    config = resolve(host, {"toolset_options": {"web": {"allow_hosts": [url]}, "browser": options}})
    run = await open_toolsets([host.toolsets["browser"]], config, host)
    pool = run.resources["browser"].pool
    timings: dict[str, list[float]] = {}
    errors: list[str] = []
    samples: list[tuple[int, int]] = []
    cpu: dict[int, float] = {}
    done = asyncio.Event()

    async def sample() -> None:
        while not done.is_set():
            pss = await asyncio.to_thread(browser_usage, cpu)
            samples.append((pool.usage()["contexts"], pss))
            await asyncio.sleep(0.5)

    sampler = asyncio.ensure_future(sample())
    started, own = time.perf_counter(), time.process_time()
    try:
        await asyncio.gather(
            *(one_session(run, f"http://{url}", args.think, timings, errors) for _ in range(sessions))
        )
    finally:
        wall, own = time.perf_counter() - started, time.process_time() - own
        done.set()
        await sampler
        launched = pool.launched
        await run.aclose()
    return {
        "sessions": sessions,
        "max_contexts": args.max_contexts,
        "browsers": args.browsers,
        "think_s": args.think,
        "wall_s": round(wall, 1),
        "sessions_per_min": round(sessions / wall * 60, 1),
        "browsers_launched": launched,
        "cpu_s": {"runner": round(own, 1), "browsers_and_driver": round(sum(cpu.values()), 1)},
        "load_average": os.getloadavg(),
        "errors": len(errors),
        "first_errors": errors[:5],
        "latency_s": {
            name: {
                "calls": len(values),
                "p50": round(statistics.median(values), 3),
                "p95": round(sorted(values)[int(len(values) * 0.95) - 1 if len(values) > 1 else 0], 3),
                "max": round(max(values), 3),
            }
            for name, values in sorted(timings.items())
        },
        "memory": memory(samples),
    }


def memory(samples: list[tuple[int, int]]) -> dict[str, Any]:
    """Peak PSS of the browsers, and the PSS each open context adds (least squares over samples)."""
    if not samples:
        return {}
    xs, ys = [float(c) for c, _ in samples], [float(p) for _, p in samples]
    slope = statistics.linear_regression(xs, ys).slope if len(set(xs)) > 1 else float("nan")
    return {
        "peak_pss_mib": round(max(ys) / 2**20, 1),
        "peak_contexts_open": int(max(xs)),
        "pss_per_open_context_mib": round(slope / 2**20, 1),
        "samples": len(samples),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.browser_sessions", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--sessions", default="50", help="comma-separated counts of sessions started at once")
    parser.add_argument("--max-contexts", type=int, default=16, help="--browser.max_contexts (default 16)")
    parser.add_argument("--browsers", type=int, default=2, help="--browser.browsers (default 2)")
    parser.add_argument("--think", type=float, default=1.0, help="seconds between a session's calls")
    parser.add_argument("--json", type=Path, help="write the results to this file")
    parser.add_argument("--source", type=Path, help="import trajkit from this directory (another checkout)")
    args = parser.parse_args(argv)
    common.use_source(args.source)
    results = []
    with tempfile.TemporaryDirectory(prefix="trajkit-bench-pages-") as pages:
        for name, text in PAGES.items():
            (Path(pages) / name).write_text(text.format(filler=FILLER))
        server, url = serve(Path(pages))
        try:
            for count in (int(n) for n in args.sessions.split(",")):
                result = asyncio.run(measure(count, args, url))
                print(json.dumps(result, indent=2), flush=True)
                results.append(result)
        finally:
            server.terminate()
            server.wait(10)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
