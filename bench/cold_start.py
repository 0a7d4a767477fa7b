"""Figure 8: cold start, from spawning ``trajkit run`` to the model server receiving its first request.

A real ``trajkit run`` subprocess (one prompt, one worker, the local sandbox) against the load
server in its own process, which answers at once. The clock starts just before the process is
spawned and stops when the server's policy sees the first chat request (``time.monotonic()`` in
both processes: Linux's CLOCK_MONOTONIC is one clock for the whole machine); the process's CPU and
how long its main thread waited for a CPU are read at that moment. Each repetition is a fresh
interpreter; one warm-up run first fills the page cache and writes the bytecode (``--bytecode``).
Floors, interleaved with the runs: interpreters that import only what every run needs (the
interpreter alone, then asyncio, click and aiohttp, then pydantic), timed to the end of their
imports.

Then one more run under ``python -X importtime`` says what the imports cost and which trajkit module
pulls in which library (the importtime run is slower than the timed ones: the tracing costs time).

    python -m bench.cold_start                     # 10 repetitions
    python -m bench.cold_start --repeat 30 --top 25
    python -m bench.cold_start --bytecode environment   # modules compiled at every start, if so set
"""

from __future__ import annotations

import argparse
import os
import selectors
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from bench import common

STAMP = "REQUEST "
POLICY = "bench.cold_start:stamp_policy"
TRACED_MAIN = """
import importlib, importlib.metadata, importlib.util, runpy, sys

def import_module(name, package=None):
    name = importlib.util.resolve_name(name, package) if name.startswith(".") else name
    __import__(name)
    return sys.modules[name]

importlib.import_module = importlib.metadata.import_module = import_module
runpy.run_module("trajkit", run_name="__main__", alter_sys=True)
"""
"""``python -m trajkit`` for the importtime run. ``-X importtime`` sees only the ``import`` statement:
the plugins (``importlib.import_module``, entry points) would go unseen, so their imports are
routed through ``__import__`` here."""


FLOORS = {
    "python -c pass": "",
    "+ asyncio, click, aiohttp": "import asyncio, click, aiohttp",
    "+ pydantic": "import asyncio, click, aiohttp, pydantic; from pydantic import BaseModel",
}
"""Interpreters that import only what any ``trajkit run`` needs, timed from spawn to the end of their
imports, as the run is timed to its first request: the interpreter (with this machine's ``site``),
the event loop, the command line and the model transport, then pydantic, which the configuration
is made of."""
FLOOR_TAIL = "import time; print(time.monotonic(), time.process_time())"


def stamp_policy(body: dict[str, Any]) -> dict[str, Any]:
    """The load server's policy here: say when each request arrived, then answer at once."""
    from trajkit.testing.openai_server import echo_policy

    print(f"{STAMP}{time.monotonic():.6f}", flush=True)
    return echo_policy(body)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.cold_start", description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=10, help="timed runs (default 10)")
    parser.add_argument("--top", type=int, default=15, help="rows of each import table (default 15)")
    parser.add_argument(
        "--min-ms",
        type=float,
        default=3.0,
        help="smallest import a trajkit module is blamed for (default 3 ms)",
    )
    parser.add_argument(
        "--bytecode",
        choices=["cached", "environment"],
        default="cached",
        help="cached (default): compiled modules are written by the warm-up run and read by the others "
        "(to a cache of the benchmark's own, PYTHONPYCACHEPREFIX), as an installed package has them; "
        "environment: as this environment says (PYTHONDONTWRITEBYTECODE=1 here, so the modules of an "
        "editable install are compiled from source at every start)",
    )
    common.add_run_args(parser, keep_help="keep the run directories and the importtime log here")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    return args


# -- one timed start ------------------------------------------------------------------------------


@dataclass
class Start:
    """One spawned process: seconds from spawn to the first request (None: none came) and to exit."""

    first_request_s: float | None
    exit_s: float
    cpu_s: float
    returncode: int
    stderr_tail: str = ""
    cpu_at_request_s: float | None = None
    """The process's CPU (all threads) when the server reported the request."""
    waited_at_request_s: float | None = None
    """How long its main thread had been runnable but waiting for a CPU by then (other load)."""
    import_lines: list[tuple[float, str]] = field(default_factory=list)
    """``-X importtime`` lines with the seconds since spawn at which each was read."""


class Stamps:
    """The ``REQUEST <monotonic>`` lines the load server prints, one per request."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.selector = selectors.DefaultSelector()
        self.selector.register(stream, selectors.EVENT_READ)

    def next(self, wait: float) -> float | None:
        """The next stamp, waiting up to ``wait`` seconds for it."""
        while self.selector.select(wait):
            line = self.stream.readline()
            if not line:
                return None
            if line.startswith(STAMP):
                return float(line[len(STAMP) :])
        return None

    def drain(self) -> None:
        while self.next(0.0) is not None:
            pass


def spawn(argv: list[str], stamps: Stamps | None, env: dict[str, str], timeout: float) -> Start:
    """Run ``argv`` to its end, noting when the server sees its first request and what the process
    had used by then; with ``-X importtime`` in it, its stderr lines are timed as they are read."""
    if stamps is not None:
        stamps.drain()  # nothing left over from an earlier run
    traced = "importtime" in argv
    lines: list[tuple[float, str]] = []
    with tempfile.TemporaryFile() as errfile:
        started = time.monotonic()
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE if traced else errfile,
            cwd=common.NEUTRAL_CWD,
            env=env,
            text=traced,
        )
        reader = _read_lines(proc.stderr, started, lines) if traced else None
        first, at_request = _first_request(proc, stamps, started, timeout)
        status, usage = _wait4(proc, started + timeout)
        exited = time.monotonic() - started
        if reader is not None:
            reader.join(10)
        errfile.seek(0)
        tail = errfile.read().decode("utf-8", "replace")[-3000:]
    if first is None and stamps is not None:
        stamp = stamps.next(1.0)  # the process ended before its request was reported
        first = None if stamp is None else stamp - started
    return Start(
        first,
        exited,
        usage.ru_utime + usage.ru_stime,
        os.waitstatus_to_exitcode(status),
        tail or "".join(line for _, line in lines if not line.startswith("import time:"))[-3000:],
        *at_request,
        lines,
    )


def floor(code: str, env: dict[str, str], timeout: float) -> Start:
    """``python -c CODE``: seconds from spawn to the end of CODE, and the CPU used by then."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\n{FLOOR_TAIL}"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        cwd=common.NEUTRAL_CWD,
        env=env,
        timeout=timeout,
        check=False,
    )
    exited = time.monotonic() - started
    try:
        ready, cpu = (float(x) for x in done.stdout.split())
    except ValueError:
        sys.exit(
            f"python -c {code!r}: exit {done.returncode}: {done.stderr.decode(errors='replace')[-2000:]}"
        )
    return Start(ready - started, exited, cpu, done.returncode)


def _first_request(
    proc: subprocess.Popen[Any], stamps: Stamps | None, started: float, timeout: float
) -> tuple[float | None, tuple[float | None, float | None]]:
    """Seconds to the first request, and (CPU, wait for a CPU) of the process read right then."""
    if stamps is None:
        return None, (None, None)
    deadline = started + timeout
    while _running(proc.pid) and time.monotonic() < deadline:
        stamp = stamps.next(0.05)
        if stamp is None:
            continue
        try:
            cpu = common.proc_cpu(proc.pid)[0]
        except (OSError, ValueError):
            return stamp - started, (None, None)
        return stamp - started, (cpu, common.schedstat(proc.pid)[1])
    return None, (None, None)


def _running(pid: int) -> bool:
    """Not exited yet (the process is left unreaped, so that its usage can be read)."""
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    return info is None or info.si_pid != pid


def _read_lines(stream: IO[str] | None, started: float, into: list[tuple[float, str]]) -> threading.Thread:
    assert stream is not None

    def read() -> None:
        for line in stream:
            into.append((time.monotonic() - started, line))
        stream.close()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def _wait4(proc: subprocess.Popen[Any], deadline: float) -> tuple[int, Any]:
    """Reap the process (killed at ``deadline``): its exit status and resource usage."""
    while time.monotonic() < deadline:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return status, usage
        time.sleep(0.002)
    proc.kill()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return status, usage


# -- -X importtime ----------------------------------------------------------------------------------


@dataclass
class Node:
    """One import as ``-X importtime`` reports it: microseconds of its own and with its imports."""

    name: str
    self_us: int
    cumulative_us: int
    depth: int
    read_at: float
    children: list[Node] = field(default_factory=list)


def import_tree(lines: list[tuple[float, str]]) -> list[Node]:
    """The top-level imports (depth 0) in order, each with its children.

    importtime prints an import after everything it imported, one level deeper and indented by
    two spaces per level, so a line at depth d adopts the pending lines at depth d + 1.
    """
    pending: dict[int, list[Node]] = {}
    roots: list[Node] = []
    for read_at, line in lines:
        if not line.startswith("import time:") or "|" not in line or "self [us]" in line:
            continue
        own, cumulative, name = line[len("import time:") :].split("|", 2)
        depth = (len(name) - len(name.lstrip(" ")) - 1) // 2
        node = Node(name.strip(), int(own), int(cumulative), depth, read_at, pending.pop(depth + 1, []))
        if depth == 0:
            roots.append(node)
        else:
            pending.setdefault(depth, []).append(node)
    return roots


def walk(nodes: list[Node]) -> list[Node]:
    found: list[Node] = []
    for node in nodes:
        found.append(node)
        found += walk(node.children)
    return found


def package(name: str) -> str:
    return name.split(".", 1)[0]


def by_package(nodes: list[Node]) -> list[tuple[str, float]]:
    """Milliseconds of imports by top-level package (own time of each module, so nothing twice)."""
    totals: dict[str, int] = {}
    for node in walk(nodes):
        key = node.name if node.name.startswith("trajkit.") else package(node.name)
        key = "trajkit (its own modules)" if key.startswith("trajkit") else key
        totals[key] = totals.get(key, 0) + node.self_us
    return sorted(((k, v / 1e3) for k, v in totals.items()), key=lambda kv: -kv[1])


def blame(nodes: list[Node], min_ms: float) -> list[tuple[str, str, float]]:
    """(trajkit module, what it imported first, ms with everything that pulled in) for every import
    of something outside trajkit made directly by a trajkit module, the costly ones first."""
    found = []
    for node in walk(nodes):
        if not node.name.startswith("trajkit"):
            continue
        for child in node.children:
            if not child.name.startswith("trajkit") and child.cumulative_us >= min_ms * 1e3:
                found.append((node.name, child.name, child.cumulative_us / 1e3))
    return sorted(found, key=lambda row: -row[2])


def trajkit_modules(nodes: list[Node]) -> list[tuple[str, float, float]]:
    """(trajkit module, ms with its imports, ms of its own) for every trajkit module imported."""
    rows = [
        (n.name, n.cumulative_us / 1e3, n.self_us / 1e3) for n in walk(nodes) if n.name.startswith("trajkit")
    ]
    return sorted(rows, key=lambda row: -row[1])


def import_summary(start: Start, top: int, min_ms: float) -> dict[str, Any]:
    """What the imports before the first request cost, by package and by the trajkit module to blame."""
    roots = import_tree(start.import_lines)
    cut = start.first_request_s if start.first_request_s is not None else float("inf")
    before = [node for node in roots if node.read_at <= cut]
    after = [node for node in roots if node.read_at > cut]
    return {
        "first_request_s": start.first_request_s,
        "imports_before_first_request_ms": round(sum(n.cumulative_us for n in before) / 1e3, 1),
        "imports_after_first_request_ms": round(sum(n.cumulative_us for n in after) / 1e3, 1),
        "by_package_ms": [(name, round(ms, 1)) for name, ms in by_package(before)[:top]],
        "top_level_ms": [
            (n.name, round(n.cumulative_us / 1e3, 1))
            for n in sorted(before, key=lambda n: -n.cumulative_us)[:top]
        ],
        "trajkit_modules_ms": [
            (name, round(c, 1), round(s, 1)) for name, c, s in trajkit_modules(before)[:top]
        ],
        "blame_ms": [(mod, lib, round(ms, 1)) for mod, lib, ms in blame(before, min_ms)],
    }


# -- the benchmark --------------------------------------------------------------------------------


def spread(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median": round(statistics.median(ordered), 4),
        "min": round(ordered[0], 4),
        "max": round(ordered[-1], 4),
        "p90": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 4),
        "stdev": round(statistics.stdev(ordered), 4) if len(ordered) > 1 else 0.0,
    }


def checked(start: Start, what: str) -> Start:
    if start.returncode != 0 or start.first_request_s is None:
        sys.exit(
            f"{what}: exit {start.returncode}, first request {start.first_request_s}:\n{start.stderr_tail}"
        )
    return start


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    common.use_source(args.source, getattr(args, "server_source", None))
    with tempfile.TemporaryDirectory(prefix="trajkit-bench-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        dataset = common.write_prompts(work / "prompt.jsonl", 1)
        env = common.child_env()
        if args.bytecode == "cached":
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
        with common.LoadServer("--policy", POLICY) as server:
            assert server.proc is not None and server.proc.stdout is not None
            stamps = Stamps(server.proc.stdout)

            def run(tag: str, traced: bool = False) -> Start:
                argv = common.trajkit_argv(
                    dataset, f"cold-{tag}", work / "runs", server.base_url, workers=1, extra=args.trajkit_arg
                )
                if traced:
                    argv[1:3] = ["-X", "importtime", "-c", TRACED_MAIN]  # for "-m", "trajkit"
                return checked(spawn(argv, stamps, env, args.timeout), f"run {tag}")

            run("warmup")
            runs: list[Start] = []
            floors: dict[str, list[Start]] = {label: [] for label in FLOORS}
            for i in range(args.repeat):
                for label, code in FLOORS.items():
                    floors[label].append(floor(code, env, args.timeout))
                runs.append(run(str(i)))
                print(
                    f"[{i + 1}/{args.repeat}] first request after {_ms(runs[-1].first_request_s)} ms "
                    f"({_ms(runs[-1].cpu_at_request_s)} ms CPU, {_ms(runs[-1].waited_at_request_s)} ms waiting "
                    f"for a CPU), exit after {runs[-1].exit_s * 1e3:.0f} ms; "
                    f"python -c pass {_ms(floors['python -c pass'][-1].first_request_s)} ms",
                    flush=True,
                )
            traced = run("importtime", traced=True)
            if args.keep:
                (work / "importtime.txt").write_text("".join(line for _, line in traced.import_lines))
    results = summarise(args, runs, floors, traced)
    print_results(results)
    common.save_json(args.json, results)
    return results


def _ms(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds * 1e3:.0f}"


def summarise(
    args: argparse.Namespace, runs: list[Start], floors: dict[str, list[Start]], traced: Start
) -> dict[str, Any]:
    def of(values: list[float | None]) -> dict[str, float]:
        return spread([v for v in values if v is not None] or [0.0])

    return {
        "figure": "cold start: spawn of trajkit run to the first model request",
        "machine": common.machine(),
        "settings": {
            "repeat": args.repeat,
            "bytecode": args.bytecode,
            "trajkit_args": args.trajkit_arg,
            "prompts": 1,
            "workers": 1,
        },
        "first_request_s": of([r.first_request_s for r in runs]),
        "first_request_runs_s": [round(r.first_request_s or 0.0, 4) for r in runs],
        "cpu_at_first_request_s": of([r.cpu_at_request_s for r in runs]),
        "waited_for_cpu_at_first_request_s": of([r.waited_at_request_s for r in runs]),
        "exit_s": of([r.exit_s for r in runs]),
        "cpu_s": of([r.cpu_s for r in runs]),
        "floors_s": {label: of([f.first_request_s for f in starts]) for label, starts in floors.items()},
        "floors_cpu_s": {label: of([f.cpu_s for f in starts]) for label, starts in floors.items()},
        "imports": import_summary(traced, args.top, args.min_ms),
    }


def print_results(results: dict[str, Any]) -> None:
    first, imports = results["first_request_s"], results["imports"]
    cpu, waited = results["cpu_at_first_request_s"], results["waited_for_cpu_at_first_request_s"]
    print(
        f"\nspawn -> first model request: median {first['median'] * 1e3:.0f} ms "
        f"(min {first['min'] * 1e3:.0f}, p90 {first['p90'] * 1e3:.0f}, max {first['max'] * 1e3:.0f}); "
        f"CPU by then {cpu['median'] * 1e3:.0f} ms (min {cpu['min'] * 1e3:.0f}), waiting for a CPU "
        f"{waited['median'] * 1e3:.0f} ms; process exit {results['exit_s']['median'] * 1e3:.0f} ms, "
        f"CPU {results['cpu_s']['median'] * 1e3:.0f} ms"
    )
    print("\nfloors, spawn to the end of their imports (median, min; CPU by then, median):")
    for label, floor in results["floors_s"].items():
        floor_cpu = results["floors_cpu_s"][label]
        print(
            f"  {label}: {floor['median'] * 1e3:.0f} ms ({floor['min'] * 1e3:.0f}; CPU {floor_cpu['median'] * 1e3:.0f})"
        )
    print(
        f"\nunder -X importtime: first request after {imports['first_request_s'] * 1e3:.0f} ms, "
        f"{imports['imports_before_first_request_ms']:.0f} ms of it importing "
        f"(and {imports['imports_after_first_request_ms']:.0f} ms of imports after it)"
    )
    print("\nimports before the first request, by package (own time of each module):")
    print(common.table(imports["by_package_ms"], ["package", "ms"]))
    print("\ntop-level imports (with everything they imported):")
    print(common.table(imports["top_level_ms"], ["module", "ms"]))
    print("\ntrajkit modules (with their imports / own):")
    print(common.table(imports["trajkit_modules_ms"], ["module", "ms cumulative", "ms own"]))
    print("\nlibraries imported by trajkit modules (first import, with everything it pulled in):")
    print(common.table(imports["blame_ms"], ["trajkit module", "imports", "ms"]))


if __name__ == "__main__":
    main()
