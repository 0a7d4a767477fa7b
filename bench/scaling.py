"""Figures 2 and 3: trajectories per second against sessions in flight, and memory per session.

The load server (its own process) answers after ``--latency`` seconds and asks for three tool
calls per trajectory; ``trajkit run`` uses the default toolsets on the local sandbox. Two tool
modes: ``terminal`` (the model runs ``true``: one process start per call) and ``file``
(write_file / read_file / write_file: no process), so harness and process-start costs are seen
apart. Ideal throughput is in-flight / (4 model calls x latency + unloaded tool time).

    python -m bench.scaling                                   # quick: 10 and 100 in flight
    python -m bench.scaling --inflight 1,10,100,1000,2000     # the full figure
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import common

MODES = ("terminal", "file")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.scaling", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--inflight", default="10,100", help="comma-separated --num_workers values (default 10,100)"
    )
    parser.add_argument("--modes", default=",".join(MODES), help="terminal, file or both (default both)")
    parser.add_argument("--latency", type=float, default=1.0, help="model latency in seconds (default 1.0)")
    parser.add_argument("--waves", type=float, default=3.0, help="prompts = waves x in-flight (default 3)")
    parser.add_argument("--min-prompts", type=int, default=3, help="at least this many prompts per run")
    parser.add_argument("--max-prompts", type=int, default=10000, help="at most this many prompts per run")
    common.add_run_args(parser, keep_help="keep the run directories here")
    args = parser.parse_args(argv)
    args.inflight = [int(x) for x in args.inflight.split(",") if x.strip()]
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not args.inflight or any(n < 1 for n in args.inflight):
        parser.error("--inflight needs positive integers")
    if set(args.modes) - set(MODES):
        parser.error(f"--modes: choose from {', '.join(MODES)}")
    return args


def server_args(mode: str, latency: float) -> list[str]:
    if mode == "terminal":
        return [
            "--latency",
            str(latency),
            "--tool-calls",
            "3",
            "--tool",
            "terminal",
            "--arguments",
            '{"command": "true"}',
        ]
    return ["--latency", str(latency), "--policy", "bench.policies:file_tools"]


async def _unloaded_tool_time(mode: str, root: Path, reps: int) -> float:
    """Median seconds of one trajectory's tool work alone: sandbox create, three calls, close."""
    from trajkit.plugins import toolsets
    from trajkit.plugins.files import tools as file_tools
    from trajkit.plugins.local.sandbox import LocalBackend
    from trajkit.sandbox import SandboxSpec
    from trajkit.tools import ToolContext

    backend = LocalBackend({"root": str(root)})
    times = []
    for i in range(reps):
        started = time.perf_counter()
        sandbox = await backend.create(SandboxSpec(run_id="bench-unloaded", work_id=f"w.{i}"))
        context = ToolContext(sandbox, 120.0, 16 * 1024)
        if mode == "terminal":
            for _ in range(3):
                await toolsets.terminal({"command": "true"}, context)
        else:
            await file_tools.write_file({"path": "notes/n0.txt", "content": "hello\n"}, context)
            await file_tools.read_file({"path": "notes/n0.txt"}, context)
            await file_tools.write_file({"path": "notes/n2.txt", "content": "hello\n"}, context)
        await sandbox.close()
        times.append(time.perf_counter() - started)
    await backend.reap("bench-unloaded")
    return statistics.median(times)


def unloaded_tool_time(mode: str, root: Path, reps: int = 30) -> float:
    return asyncio.run(_unloaded_tool_time(mode, root, reps))


def run_one(
    args: argparse.Namespace, work: Path, server: common.LoadServer, mode: str, inflight: int, tool_s: float
) -> dict[str, Any]:
    prompts = min(max(int(args.waves * inflight), args.min_prompts), args.max_prompts)
    dataset = common.write_prompts(work / f"prompts-{prompts}.jsonl", prompts)
    run_name = f"scale-{mode}-{inflight}"
    argv = common.trajkit_argv(
        dataset,
        run_name,
        work / "runs",
        server.base_url,
        workers=inflight,
        extra=["--sandbox_option", f"local.root={work / 'sandboxes'}", *args.trajkit_arg],
    )
    load_before = common.load_average()[0]
    server.mark()
    measured = common.run_measured(argv, env=common.child_env(), timeout=args.timeout)
    server_cpu = server.cpu_since_mark()
    run_dir = work / "runs" / run_name
    stats_path = run_dir / "statistics.json"
    stats = json.loads(stats_path.read_text()) if stats_path.exists() else {}
    if measured.returncode != 0 or stats.get("kept") != prompts:
        sys.exit(
            f"{run_name}: expected {prompts} kept trajectories (exit {measured.returncode}, kept "
            f"{stats.get('kept')}):\n{measured.stderr_tail}"
        )
    window = common.session_window(run_dir, wave=inflight)
    trajectory_ideal_s = 4 * args.latency + tool_s
    ideal = inflight / trajectory_ideal_s
    turns = stats["api_calls"]
    return {
        "mode": mode,
        "inflight": inflight,
        "prompts": prompts,
        "trajectory_ideal_s": round(trajectory_ideal_s, 4),
        "ideal_per_s": round(ideal, 2),
        "measured_per_s": round(window.per_second, 2),
        "ratio": round(window.per_second / ideal, 4),
        "window_s": round(window.seconds, 2),
        "session_mean_s": round(window.mean_session_s, 3),
        "session_p50_s": round(window.p50_session_s, 3),
        "session_max_s": round(window.max_session_s, 3),
        "first_wave_session_mean_s": round(window.first_wave_mean_s, 3),
        "last_wave_session_mean_s": round(window.last_wave_mean_s, 3),
        "wall_s": round(measured.wall_s, 2),
        "runner_cpu_s": round(measured.cpu_s, 2),
        "tool_processes_cpu_s": round(measured.children_cpu_s, 2),
        "run_tree_cpu_s": None if measured.tree_cpu_s is None else round(measured.tree_cpu_s, 2),
        "run_tree_cpu_ms_per_trajectory": (
            None if measured.tree_cpu_s is None else round(1e3 * measured.tree_cpu_s / prompts, 2)
        ),
        "runner_cpu_ms_per_turn": round(1e3 * measured.cpu_s / turns, 3),
        "runner_cpu_share_of_window": round(measured.cpu_s / window.seconds, 3) if window.seconds else None,
        "server_cpu_s": round(server_cpu, 2),
        "peak_rss_mib": common.mib(measured.max_rss),
        "sampled_vmhwm_mib": common.mib(measured.sampled_hwm),
        "peak_rss_kib_per_session": round(measured.max_rss / 1024 / inflight, 1),
        "max_threads": measured.max_threads,
        "max_open_fds": measured.max_fds,
        "load_average_before": round(load_before, 2),
        "runner_main_thread_cpu_wait_s": round(measured.main_thread_wait_s, 2),
        "machine_cpu_pressure": None if measured.cpu_pressure is None else round(measured.cpu_pressure, 3),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    common.use_source(args.source, getattr(args, "server_source", None))
    nofile = common.raise_fd_limit()
    if nofile < 3 * max(args.inflight) + 256:
        print(f"warning: open-files limit {nofile} is low for {max(args.inflight)} sessions in flight")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="trajkit-bench-") as tmp:
        work = args.keep or Path(tmp)
        common.sandboxes_dir(work)
        for mode in args.modes:
            tool_s = unloaded_tool_time(mode, work / "sandboxes")
            print(f"{mode}: unloaded tool time per trajectory {tool_s * 1e3:.2f} ms", flush=True)
            with common.LoadServer(*server_args(mode, args.latency)) as server:
                for inflight in args.inflight:
                    row = run_one(args, work, server, mode, inflight, tool_s)
                    rows.append(row)
                    print(
                        f"{mode:8} {inflight:5} in flight: {row['measured_per_s']:8.2f}/s of ideal "
                        f"{row['ideal_per_s']:8.2f}/s = {100 * row['ratio']:5.1f}%  session mean "
                        f"{row['session_mean_s']:.2f}s  runner CPU {row['runner_cpu_s']:.1f}s  "
                        f"peak RSS {row['peak_rss_mib']} MiB",
                        flush=True,
                    )
    common.marginal_memory(rows, ("mode",), "peak_rss_mib", "marginal_kib_per_session")
    results = {
        "figure": "throughput and memory against sessions in flight",
        "machine": common.machine(),
        "settings": {
            "latency_s": args.latency,
            "tool_calls": 3,
            "waves": args.waves,
            "trajkit_args": args.trajkit_arg,
        },
        "rows": rows,
    }
    print()
    print(render(rows))
    common.save_json(args.json, results)
    return results


def render(rows: list[dict[str, Any]]) -> str:
    return common.table(
        [
            (
                r["mode"],
                r["inflight"],
                r["prompts"],
                r["ideal_per_s"],
                r["measured_per_s"],
                f"{100 * r['ratio']:.1f}%",
                r["session_mean_s"],
                f"{r['first_wave_session_mean_s']} / {r['last_wave_session_mean_s']}",
                f"{r['runner_cpu_s']} / {r['tool_processes_cpu_s']}",
                "-"
                if r.get("run_tree_cpu_s") is None
                else f"{r['run_tree_cpu_s']} ({r['run_tree_cpu_ms_per_trajectory']} ms)",
                f"{100 * r['runner_cpu_share_of_window']:.0f}%" if r["runner_cpu_share_of_window"] else "-",
                r["server_cpu_s"],
                r["peak_rss_mib"],
                r.get("marginal_kib_per_session", "-"),
                r["runner_main_thread_cpu_wait_s"],
                "-" if r["machine_cpu_pressure"] is None else f"{100 * r['machine_cpu_pressure']:.0f}%",
                r["load_average_before"],
            )
            for r in rows
        ],
        (
            "tools",
            "in flight",
            "prompts",
            "ideal/s",
            "measured/s",
            "of ideal",
            "session mean s",
            "first / last wave s",
            "runner CPU s (own / tool processes)",
            "all the run's processes CPU s (per trajectory)",
            "runner CPU / window",
            "server CPU s",
            "peak RSS MiB",
            "KiB/session (marginal)",
            "loop waited for CPU s",
            "CPU pressure",
            "load avg",
        ),
    )


if __name__ == "__main__":
    main()
