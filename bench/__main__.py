"""Run every benchmark at its quick default size: ``python -m bench [--json-dir DIR] [--source DIR]``.

Each benchmark also runs alone (``python -m bench.<name> --help``); BENCHMARKS.md gives the full
sizes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench import (
    atropos,
    browser_inside,
    browser_sessions,
    chat_templates,
    cold_start,
    compare_scale,
    compress,
    file_tools,
    ledger_scale,
    sandbox_dirs,
    sandbox_overhead,
    sandbox_start,
    scaling,
    turn_cpu,
)

BENCHMARKS = {
    "turn_cpu": turn_cpu.main,
    "scaling": scaling.main,
    "sandbox_overhead": sandbox_overhead.main,
    "sandbox_dirs": sandbox_dirs.main,
    "sandbox_start": sandbox_start.main,
    "ledger_scale": ledger_scale.main,
    "compress": compress.main,
    "cold_start": cold_start.main,
    "chat_templates": chat_templates.main,
    "compare_scale": compare_scale.main,
    "file_tools": file_tools.main,
    "atropos": atropos.main,
    "browser_sessions": browser_sessions.main,
    "browser_inside": browser_inside.main,
}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--only", default=",".join(BENCHMARKS), help="comma-separated subset")
    parser.add_argument("--json-dir", type=Path, help="write each benchmark's results to DIR/NAME.json")
    parser.add_argument("--source", type=Path, help="import trajkit from this directory (see --help of each)")
    args = parser.parse_args()
    chosen = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {', '.join(BENCHMARKS)}")
    for name in chosen:
        print(f"== {name}", flush=True)
        argv: list[str] = []
        if args.json_dir:
            argv += ["--json", str(args.json_dir / f"{name}.json")]
        if args.source:
            argv += ["--source", str(args.source)]
        BENCHMARKS[name](argv)


if __name__ == "__main__":
    main()
