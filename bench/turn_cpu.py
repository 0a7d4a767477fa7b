"""Figure 1: CPU seconds the runner spends per model turn, and where they go.

The model answers at once (zero latency) and the tool is a no-op that never touches the sandbox,
so everything measured is the harness: HTTP client, agent loop, sandbox lifecycle, records,
ledger. ``trajkit run`` runs in a subprocess whose CPU is read exactly when it exits; two runs of
different sizes give the marginal CPU per turn (the slope), free of start-up and merge costs.

    python -m bench.turn_cpu                       # quick: 40 and 400 prompts, py-spy profile
    python -m bench.turn_cpu --prompts 2000 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import common, profiles

TOOL_CALLS = 3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.turn_cpu", description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=400, help="prompts of the large run (default 400)")
    parser.add_argument("--base-prompts", type=int, default=40, help="prompts of the small run (default 40)")
    parser.add_argument("--workers", type=int, default=50, help="sessions in flight (default 50)")
    parser.add_argument("--tool-calls", type=int, default=TOOL_CALLS, help="tool turns per trajectory")
    parser.add_argument("--repeat", type=int, default=1, help="measure each size this many times (median)")
    parser.add_argument(
        "--profile",
        choices=["py-spy", "cprofile", "none"],
        default="py-spy" if profiles.py_spy_available() else "cprofile",
        help="profile one extra run of --prompts (default py-spy when installed, else cProfile)",
    )
    parser.add_argument("--top", type=int, default=15, help="profile rows to show")
    common.add_run_args(parser, keep_help="keep run directories and profiles here")
    args = parser.parse_args(argv)
    if not 0 < args.base_prompts < args.prompts:
        parser.error("need 0 < --base-prompts < --prompts")
    return args


def measure(
    args: argparse.Namespace,
    work: Path,
    server: common.LoadServer,
    prompts: int,
    tag: str,
    prefix: list[str] | None = None,
) -> tuple[common.Measured, float]:
    dataset = work / f"prompts-{prompts}.jsonl"
    if not dataset.exists():
        common.write_prompts(dataset, prompts)
    argv = common.trajkit_argv(
        dataset,
        f"turns-{tag}",
        work / "runs",
        server.base_url,
        workers=args.workers,
        extra=["--distribution", "noop_only", "--max_turns", str(args.tool_calls + 2), *args.trajkit_arg],
        prefix=prefix or [],
    )
    server.mark()
    result = common.run_measured(argv, env=common.child_env(work / "site"), timeout=args.timeout)
    server_cpu = server.cpu_since_mark()
    stats_path = work / "runs" / f"turns-{tag}" / "statistics.json"
    stats = json.loads(stats_path.read_text()) if stats_path.exists() else {}
    expected_calls = prompts * (args.tool_calls + 1)
    if result.returncode != 0 or stats.get("kept") != prompts or stats.get("api_calls") != expected_calls:
        sys.exit(
            f"run {tag} did not produce {prompts} kept trajectories with {expected_calls} model calls "
            f"(exit {result.returncode}, kept {stats.get('kept')}, calls {stats.get('api_calls')}):\n"
            f"{result.stderr_tail}"
        )
    return result, server_cpu


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    common.use_source(args.source, getattr(args, "server_source", None))
    common.raise_fd_limit()
    turns_per_prompt = args.tool_calls + 1
    with tempfile.TemporaryDirectory(prefix="trajkit-bench-") as tmp:
        work = args.keep or Path(tmp)
        common.install_noop_plugin(work / "site")
        server_args = [
            "--latency",
            "0",
            "--tool-calls",
            str(args.tool_calls),
            "--tool",
            "noop",
            "--arguments",
            "{}",
        ]
        slopes, totals, fixed, server_per_turn = [], [], [], []
        runs = []
        with common.LoadServer(*server_args) as server:
            measure(args, work, server, args.base_prompts, "warmup")  # caches, page cache
            for i in range(args.repeat):
                small, small_server = measure(args, work, server, args.base_prompts, f"small{i}")
                large, large_server = measure(args, work, server, args.prompts, f"large{i}")
                d_turns = (args.prompts - args.base_prompts) * turns_per_prompt
                slope = (large.cpu_total_s - small.cpu_total_s) / d_turns
                slopes.append(slope)
                totals.append(large.cpu_total_s / (args.prompts * turns_per_prompt))
                fixed.append(small.cpu_total_s - slope * args.base_prompts * turns_per_prompt)
                server_per_turn.append((large_server - small_server) / d_turns)
                runs.append({"small": _brief(small), "large": _brief(large)})
                print(
                    f"[{i + 1}/{args.repeat}] small {small.cpu_total_s:.2f}s CPU, large {large.cpu_total_s:.2f}s "
                    f"CPU ({large.wall_s:.1f}s wall): {slope * 1e3:.3f} ms CPU per turn",
                    flush=True,
                )
            per_turn = statistics.median(slopes)
            summary_text = ""
            profile_file = None
            if args.profile != "none":
                if args.profile == "py-spy":
                    profile_file = work / "profile.py-spy.txt"
                    prefix = [*profiles.py_spy_prefix(profile_file), sys.executable]
                else:
                    profile_file = work / "profile.cprofile"
                    prefix = [sys.executable, *profiles.cprofile_args(profile_file)]
                measure(args, work, server, args.prompts, "profile", prefix=prefix)
                summary = (
                    profiles.summarise_py_spy(profile_file)
                    if args.profile == "py-spy"
                    else profiles.summarise_cprofile(profile_file)
                )
                summary_text = summary.render(args.top, per_turn * 1e3)
    results = {
        "figure": "harness CPU per model turn (zero latency, no-op tool)",
        "machine": common.machine(),
        "settings": {
            "prompts": args.prompts,
            "base_prompts": args.base_prompts,
            "workers": args.workers,
            "tool_calls": args.tool_calls,
            "repeat": args.repeat,
            "trajkit_args": args.trajkit_arg,
        },
        "cpu_ms_per_turn": round(per_turn * 1e3, 3),
        "cpu_ms_per_turn_runs": [round(s * 1e3, 3) for s in slopes],
        "cpu_ms_per_turn_including_fixed": round(statistics.median(totals) * 1e3, 3),
        "fixed_cpu_s": round(statistics.median(fixed), 3),
        "server_cpu_ms_per_turn": round(statistics.median(server_per_turn) * 1e3, 3),
        "runs": runs,
        "profile": {"tool": args.profile, "summary": summary_text},
    }
    print(
        f"\nrunner CPU per model turn: {results['cpu_ms_per_turn']} ms marginal "
        f"({results['cpu_ms_per_turn_including_fixed']} ms including {results['fixed_cpu_s']} s of start-up "
        f"and merge); load server {results['server_cpu_ms_per_turn']} ms per request"
    )
    if summary_text:
        print(f"\nprofile ({args.profile}, {args.prompts} prompts):\n{summary_text}")
    common.save_json(args.json, results)
    return results


def _brief(m: common.Measured) -> dict[str, Any]:
    return {
        "wall_s": round(m.wall_s, 2),
        "cpu_s": round(m.cpu_s, 3),
        "children_cpu_s": round(m.children_cpu_s, 3),
        "max_rss_mib": common.mib(m.max_rss),
        "threads": m.max_threads,
    }


if __name__ == "__main__":
    main()
