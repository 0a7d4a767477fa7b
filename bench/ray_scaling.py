"""BENCHMARKS section 9: the ``local`` and ``ray`` executors side by side on this machine.

The same load as figure 2 (:mod:`bench.scaling`: a load server in its own process answering
after ``--latency`` seconds, three tool calls per trajectory, ``terminal`` or ``file`` tools on
the local sandbox), run once with each executor. Measured for each run: trajectories/s in the
records' window against ideal; the driver's own CPU (the ``trajkit run`` process: for ``ray``
the ledger, the progress and Ray's client threads, no session); the CPU of the session actors
(their tool processes apart) and of Ray's own processes (GCS, raylet, ...), sampled from /proc;
the peak resident memory of the driver and of the actors together, and per session in flight.

    python -m bench.ray_scaling                                  # 1,000 in flight, both modes
    python -m bench.ray_scaling --inflight 100 --modes file      # quick

Ray must be installed (``pip install -e ./trajkit_ray``); the run starts a Ray of this machine
alone (no ``--ray_address``), as ``trajkit run --executor ray`` does.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench import common, scaling

EXECUTORS = ("local", "ray")
ACTOR_TITLE = "ray::SessionWorker"
RAY_PROCESSES = (
    "gcs_server",
    "raylet",
    "ray::",
    "default_worker.py",
    "dashboard",
    "log_monitor",
    "monitor.py",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.ray_scaling", description=__doc__.split("\n")[0])
    parser.add_argument("--inflight", default="1000", help="comma-separated --num_workers values")
    parser.add_argument("--modes", default=",".join(scaling.MODES), help="terminal, file or both")
    parser.add_argument("--executors", default=",".join(EXECUTORS), help="local, ray or both")
    parser.add_argument("--latency", type=float, default=1.0, help="model latency in seconds (default 1.0)")
    parser.add_argument("--waves", type=float, default=3.0, help="prompts = waves x in-flight (default 3)")
    parser.add_argument("--max-prompts", type=int, default=10000, help="at most this many prompts per run")
    common.add_run_args(parser, keep_help="keep the run directories here")
    args = parser.parse_args(argv)
    args.inflight = [int(x) for x in args.inflight.split(",") if x.strip()]
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    args.executors = [e.strip() for e in args.executors.split(",") if e.strip()]
    if set(args.modes) - set(scaling.MODES) or set(args.executors) - set(EXECUTORS):
        parser.error("unknown mode or executor")
    return args


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


class RaySampler:
    """Samples the Ray processes that start after it: CPU (own; reaped children = tool processes)
    as last seen alive, and the actors' summed resident memory."""

    def __init__(self, interval: float = 0.2) -> None:
        self.interval = interval
        self.before = {int(p) for p in os.listdir("/proc") if p.isdigit()}
        self.cpu: dict[int, tuple[str, float, float]] = {}
        self.actor_rss: list[int] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> RaySampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=5)

    def _loop(self) -> None:
        while not self.stop.is_set():
            actors = 0
            for name in os.listdir("/proc"):
                if not name.isdigit() or int(name) in self.before:
                    continue
                pid = int(name)
                line = _cmdline(pid)
                if not any(marker in line for marker in RAY_PROCESSES):
                    continue
                kind = "actor" if line.startswith(ACTOR_TITLE) else "ray"
                with contextlib.suppress(OSError, ValueError, IndexError):
                    own, children = common.proc_cpu(pid)
                    self.cpu[pid] = (kind, own, children)
                    if kind == "actor":
                        actors += common.proc_status(pid).get("VmRSS", 0)
            if actors:
                self.actor_rss.append(actors)
            self.stop.wait(self.interval)

    def totals(self) -> dict[str, Any]:
        actor_own = sum(own for kind, own, _ in self.cpu.values() if kind == "actor")
        actor_children = sum(children for kind, _, children in self.cpu.values() if kind == "actor")
        ray_own = sum(own for kind, own, _ in self.cpu.values() if kind == "ray")
        return {
            "actors": sum(1 for kind, _, _ in self.cpu.values() if kind == "actor"),
            "actor_cpu_s": round(actor_own, 2),
            "actor_tool_processes_cpu_s": round(actor_children, 2),
            "ray_system_cpu_s": round(ray_own, 2),
            "actor_rss_first_mib": common.mib(self.actor_rss[0]) if self.actor_rss else 0.0,
            "actor_rss_peak_mib": common.mib(max(self.actor_rss)) if self.actor_rss else 0.0,
        }


def run_one(
    args: argparse.Namespace,
    work: Path,
    server: common.LoadServer,
    mode: str,
    executor: str,
    inflight: int,
    tool_s: float,
) -> dict[str, Any]:
    prompts = min(int(args.waves * inflight), args.max_prompts)
    dataset = common.write_prompts(work / f"prompts-{prompts}.jsonl", prompts)
    run_name = f"ray-bench-{executor}-{mode}-{inflight}"
    extra = [
        "--sandbox_option",
        f"local.root={work / 'sandboxes'}",
        "--executor",
        executor,
        *args.trajkit_arg,
    ]
    argv = common.trajkit_argv(
        dataset, run_name, work / "runs", server.base_url, workers=inflight, extra=extra
    )
    env = common.child_env()
    env.setdefault("RAY_AUTH_MODE", "disabled")
    server.mark()
    with RaySampler() as sampler:
        measured = common.run_measured(argv, env=env, timeout=args.timeout)
    server_cpu = server.cpu_since_mark()
    run_dir = work / "runs" / run_name
    stats_path = run_dir / "statistics.json"
    stats = json.loads(stats_path.read_text()) if stats_path.exists() else {}
    if measured.returncode != 0 or stats.get("kept") != prompts:
        sys.exit(f"{run_name}: expected {prompts} kept (exit {measured.returncode}):\n{measured.stderr_tail}")
    window = common.session_window(run_dir, wave=inflight)
    ideal = inflight / (4 * args.latency + tool_s)
    ray = sampler.totals() if executor == "ray" else {}
    return {
        "executor": executor,
        "mode": mode,
        "inflight": inflight,
        "prompts": prompts,
        "ideal_per_s": round(ideal, 2),
        "measured_per_s": round(window.per_second, 2),
        "ratio": round(window.per_second / ideal, 4),
        "session_mean_s": round(window.mean_session_s, 3),
        "wall_s": round(measured.wall_s, 2),
        "driver_cpu_s": round(measured.cpu_s, 2),
        "driver_cpu_ms_per_trajectory": round(1e3 * measured.cpu_s / prompts, 3),
        "driver_children_cpu_s": round(measured.children_cpu_s, 2),
        "server_cpu_s": round(server_cpu, 2),
        "driver_peak_rss_mib": common.mib(measured.max_rss),
        "driver_loop_waited_s": round(measured.main_thread_wait_s, 2),
        "machine_cpu_pressure": None if measured.cpu_pressure is None else round(measured.cpu_pressure, 3),
        **ray,
        "total_peak_rss_mib": round(common.mib(measured.max_rss) + ray.get("actor_rss_peak_mib", 0.0), 1),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    common.use_source(args.source, getattr(args, "server_source", None))
    common.raise_fd_limit()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="trajkit-bench-") as tmp:
        work = args.keep or Path(tmp)
        common.sandboxes_dir(work)
        for mode in args.modes:
            tool_s = scaling.unloaded_tool_time(mode, work / "sandboxes")
            with common.LoadServer(*scaling.server_args(mode, args.latency)) as server:
                for inflight in args.inflight:
                    for executor in args.executors:
                        started = time.monotonic()
                        row = run_one(args, work, server, mode, executor, inflight, tool_s)
                        rows.append(row)
                        print(
                            f"{executor:5} {mode:8} {inflight:5} in flight: {row['measured_per_s']:7.1f}/s "
                            f"= {100 * row['ratio']:5.1f}% of ideal; driver CPU "
                            f"{row['driver_cpu_ms_per_trajectory']:.2f} ms/trajectory "
                            f"({time.monotonic() - started:.0f}s)",
                            flush=True,
                        )
    common.marginal_memory(rows, ("executor", "mode"), "total_peak_rss_mib", "kib_per_session")
    results = {
        "figure": "local and ray executors side by side",
        "machine": common.machine(),
        "settings": {"latency_s": args.latency, "waves": args.waves, "trajkit_args": args.trajkit_arg},
        "rows": rows,
    }
    print()
    print(render(rows))
    common.save_json(args.json, results)
    return results


def render(rows: list[dict[str, Any]]) -> str:
    def opt(row: dict[str, Any], key: str) -> Any:
        value = row.get(key)
        return "-" if value is None else value

    return common.table(
        [
            (
                r["executor"],
                r["mode"],
                r["inflight"],
                r["prompts"],
                r["ideal_per_s"],
                r["measured_per_s"],
                f"{100 * r['ratio']:.1f}%",
                r["session_mean_s"],
                f"{r['driver_cpu_s']} ({r['driver_cpu_ms_per_trajectory']} ms/traj)",
                r["driver_children_cpu_s"]
                if r["executor"] == "local"
                else r.get("actor_tool_processes_cpu_s"),
                opt(r, "actor_cpu_s"),
                opt(r, "ray_system_cpu_s"),
                r["server_cpu_s"],
                r["driver_peak_rss_mib"],
                opt(r, "actor_rss_peak_mib"),
                opt(r, "kib_per_session"),
                "-" if r["machine_cpu_pressure"] is None else f"{100 * r['machine_cpu_pressure']:.0f}%",
            )
            for r in rows
        ],
        (
            "executor",
            "tools",
            "in flight",
            "prompts",
            "ideal/s",
            "measured/s",
            "of ideal",
            "session mean s",
            "driver CPU s",
            "tool processes CPU s",
            "actors CPU s",
            "Ray processes CPU s",
            "server CPU s",
            "driver peak RSS MiB",
            "actors peak RSS MiB",
            "KiB/session (marginal, driver + actors)",
            "CPU pressure",
        ),
    )


if __name__ == "__main__":
    main()
