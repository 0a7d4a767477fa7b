"""Figure 5: resume (scan + plan) and merge of a large ledger: time and peak memory.

Generates N synthetic trajectory records (the fields of trajkit.record.trajectory.TrajectoryRecord, nine
turns each) in ``batch_N.jsonl`` files plus the dataset of their N prompts, then measures, each in
a fresh subprocess: planning a resume (read the dataset, ``trajkit.run.ledger.scan``,
``trajkit.run.ledger.assign``), the merge (``trajkit.run.finalize.finalize`` with the sharegpt writer and
the default filters), and ``trajkit run --resume`` on the finished run end to end. Memory per
record at two sizes shows what grows with the ledger. Generated data is deleted afterwards.

    python -m bench.ledger_scale                                    # quick: 10k and 100k records
    python -m bench.ledger_scale --records 1000000 --compare 100000 # the full figure
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import common

RUN_NAME = "ledger"
SENTINELS = ("@@WORK_ID@@", "@@PROMPT_ID@@", "@@PROMPT@@", "@@TIMESTAMP@@", "@@OUTPUT@@")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.ledger_scale", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--records", type=int, default=100_000, help="records of the large ledger (default 100k)"
    )
    parser.add_argument(
        "--compare", type=int, default=10_000, help="records of the small ledger (default 10k; 0: skip)"
    )
    parser.add_argument(
        "--batch-size", type=int, default=100, help="records per batch file (trajkit's default 100)"
    )
    parser.add_argument("--workdir", type=Path, help="where to generate (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the generated data")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per measured step at most")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--phase", choices=["resume", "merge"], help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--dataset", type=Path, help=argparse.SUPPRESS)
    common.add_source_arg(parser)
    return parser.parse_args(argv)


# -- generation ----------------------------------------------------------------------------------


def _template() -> list[str]:
    """A record as JSON text cut at the sentinels, validated against TrajectoryRecord."""
    from trajkit.record.trajectory import TrajectoryRecord

    def turn(kind: str, value: str, **extra: Any) -> dict[str, Any]:
        base: dict[str, Any] = {
            "from": kind,
            "value": value,
            "reasoning": None,
            "tool_calls": [],
            "tool_call_id": None,
            "name": None,
        }
        return {**base, **extra}

    conversations = [
        turn(
            "system",
            "You are a capable assistant working in a sandboxed environment. Use the tools you are "
            "given to inspect, create and run things; think step by step, check results, and finish "
            "with a concise answer.",
        ),
        turn("human", SENTINELS[2]),
    ]
    for step, command in enumerate(("ls -la", "cat notes.txt", "python3 solve.py")):
        call_id = f"call_{step + 1}_0"
        arguments = json.dumps({"command": command})
        conversations.append(
            turn(
                "gpt",
                "",
                reasoning=f"Step {step + 1}: run {command} and look at the result.",
                tool_calls=[{"id": call_id, "name": "terminal", "arguments": arguments}],
            )
        )
        output = json.dumps({"exit_code": 0, "output": f"{SENTINELS[4]} line {step}\n" * 3})
        conversations.append(turn("tool", output, tool_call_id=call_id, name="terminal"))
    conversations.append(
        turn(
            "gpt",
            "The task is done: the script printed the expected result.",
            reasoning="All three steps succeeded.",
        )
    )
    tools = ["execute_code", "patch", "read_file", "search_files", "terminal", "write_file"]
    stats = {
        name: {
            "count": 3 if name == "terminal" else 0,
            "success": 3 if name == "terminal" else 0,
            "failure": 0,
        }
        for name in tools
    }
    record = {
        "work_id": SENTINELS[0],
        "prompt_id": SENTINELS[1],
        "prompt_index": 0,
        "conversations": conversations,
        "metadata": {"batch_num": 0, "timestamp": SENTINELS[3], "model": "bench/synthetic-model"},
        "completed": True,
        "partial": False,
        "api_calls": 4,
        "toolsets_used": ["code", "file", "terminal"],
        "tools_offered": tools,
        "tool_stats": stats,
        "tool_error_counts": dict.fromkeys(tools, 0),
        "invalid_tool_calls": 0,
        "usage": {"prompt_tokens": 5321, "completion_tokens": 412, "total_tokens": 5733, "cost": 0.00123},
        "duration_s": 4.321,
        "attempt": 1,
        "finish_reason": "stop",
        "sandbox": {"backend": "local", "image": None, "digest": None},
    }
    TrajectoryRecord.model_validate(record)
    try:  # the ledger as the measured trajkit writes it
        from trajkit.jsonutil import dumps_bytes

        text = dumps_bytes(record).decode()
    except ImportError:  # a trajkit from before orjson ledgers (--source)
        text = json.dumps(record, ensure_ascii=False)
    parts = [text]
    for sentinel in SENTINELS:
        parts = [piece for part in parts for piece in _split_keep(part, sentinel)]
    return parts


def _split_keep(text: str, sentinel: str) -> list[str]:
    pieces = text.split(sentinel)
    out = [pieces[0]]
    for piece in pieces[1:]:
        out += [sentinel, piece]
    return out


def generate(directory: Path, count: int, batch_size: int) -> dict[str, Any]:
    """Write ``count`` prompts and their records; returns sizes."""
    from trajkit.run.dataset import DatasetRow

    started = time.perf_counter()
    run_dir = directory / RUN_NAME
    run_dir.mkdir(parents=True)
    parts = _template()
    dataset = directory / "prompts.jsonl"
    stamp = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
    handle = None
    with dataset.open("w") as prompts:
        for i in range(count):
            prompt = f"Task {i}: write a script that prints the {i}th prime and check its output"
            prompts.write(json.dumps({"prompt": prompt, "source": "bench"}) + "\n")
            if i % batch_size == 0:
                if handle is not None:
                    handle.close()
                handle = (run_dir / f"batch_{i // batch_size}.jsonl").open("w")
            prompt_id = DatasetRow(prompt=prompt).prompt_id()
            values = {
                SENTINELS[0]: f"{prompt_id}.0",
                SENTINELS[1]: prompt_id,
                SENTINELS[2]: prompt,
                SENTINELS[3]: datetime.fromtimestamp(stamp + i * 0.01, UTC).isoformat(),
                SENTINELS[4]: f"result {i}",
            }
            assert handle is not None
            handle.write("".join(values.get(p, p) for p in parts) + "\n")
    if handle is not None:
        handle.close()
    ledger_bytes = sum(p.stat().st_size for p in run_dir.glob("batch_*.jsonl"))
    return {
        "records": count,
        "batch_files": -(-count // batch_size),
        "ledger_mib": common.mib(ledger_bytes),
        "bytes_per_record": round(ledger_bytes / count),
        "dataset_mib": common.mib(dataset.stat().st_size),
        "generate_s": round(time.perf_counter() - started, 1),
    }


# -- the measured phases (run in a subprocess) -----------------------------------------------------


def _rss() -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def phase(args: argparse.Namespace) -> None:
    """Run one phase in this process and print its figures as JSON on stdout."""
    import gc

    from trajkit.plugins.export.writers import ShareGPTWriter
    from trajkit.plugins.filters import HallucinatedTool, NoReasoning
    from trajkit.run.dataset import read_dataset
    from trajkit.run.finalize import finalize
    from trajkit.run.ledger import assign, scan

    run_dir: Any = args.run_dir
    try:  # the run directory as the measured trajkit names it
        from trajkit.run.rundir import RunDir

        run_dir = RunDir(args.run_dir)
    except ImportError:  # a trajkit from before RunDir (--source): functions of the path
        pass
    gc.collect()
    out: dict[str, Any] = {"baseline_rss": _rss()}
    clock = time.perf_counter()
    items, errors = read_dataset(args.dataset)
    assert not errors, errors[:3]
    out["read_dataset_s"], clock = time.perf_counter() - clock, time.perf_counter()
    out["rss_after_dataset"] = _rss()
    index = scan(run_dir)
    out["scan_s"], clock = time.perf_counter() - clock, time.perf_counter()
    out["rss_after_scan"] = _rss()
    paired = assign(items, index)
    out["assign_s"], clock = time.perf_counter() - clock, time.perf_counter()
    out["rss_after_assign"] = _rss()
    out["pending"] = sum(1 for _, location in paired if location is None)
    out["done"] = len(paired) - out["pending"]
    if args.phase == "merge":
        run_tools = ["execute_code", "patch", "read_file", "search_files", "terminal", "write_file"]
        stats = finalize(
            run_dir, paired, index, [HallucinatedTool(), NoReasoning()], [ShareGPTWriter()], run_tools
        )
        out["finalize_s"] = time.perf_counter() - clock
        out["kept"] = stats["kept"]
        out["rss_after_finalize"] = _rss()
    print(json.dumps(out))


def measure_phase(args: argparse.Namespace, directory: Path, name: str) -> dict[str, Any]:
    argv = [
        sys.executable,
        "-m",
        "bench.ledger_scale",
        "--phase",
        name,
        "--run-dir",
        str(directory / RUN_NAME),
        "--dataset",
        str(directory / "prompts.jsonl"),
    ]
    if common.SOURCE:
        argv += ["--source", str(common.SOURCE)]
    out_file = directory / f"{name}.json"
    with out_file.open("wb") as handle:
        measured = common.run_measured(
            argv, env=common.child_env(), timeout=args.timeout, interval=0.25, stdout=handle
        )
    if measured.returncode != 0:
        sys.exit(f"phase {name} failed (exit {measured.returncode}):\n{measured.stderr_tail}")
    figures = json.loads(out_file.read_text().strip().splitlines()[-1])
    figures["wall_s"] = measured.wall_s
    figures["cpu_s"] = measured.cpu_s
    figures["peak_rss"] = measured.max_rss
    return figures


def measure_cli(args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    """``trajkit run --resume`` on the finished run: plan, nothing to do, merge and statistics."""
    argv = [
        sys.executable,
        "-m",
        "trajkit",
        "run",
        "--dataset_file",
        str(directory / "prompts.jsonl"),
        "--run_name",
        RUN_NAME,
        "--output_dir",
        str(directory),
        "--resume",
        "--quiet",
    ]
    measured = common.run_measured(argv, env=common.child_env(), timeout=args.timeout, interval=0.25)
    if measured.returncode != 0:
        sys.exit(f"trajkit run --resume failed (exit {measured.returncode}):\n{measured.stderr_tail}")
    return {"wall_s": measured.wall_s, "cpu_s": measured.cpu_s, "peak_rss": measured.max_rss}


def one_size(args: argparse.Namespace, root: Path, count: int) -> dict[str, Any]:
    directory = root / f"ledger-{count}"
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    try:
        sizes = generate(directory, count, args.batch_size)
        print(
            f"{count} records: {sizes['ledger_mib']} MiB in {sizes['batch_files']} files "
            f"({sizes['bytes_per_record']} B/record), generated in {sizes['generate_s']} s",
            flush=True,
        )
        resume = measure_phase(args, directory, "resume")
        assert resume["done"] == count and resume["pending"] == 0, resume
        merge = measure_phase(args, directory, "merge")
        assert merge["kept"] == count, merge
        output = directory / RUN_NAME / "trajectories.jsonl"
        with output.open("rb") as handle:
            lines = sum(1 for _ in handle)
        assert lines == count, (lines, count)
        cli = measure_cli(args, directory)
    finally:
        if not args.keep:
            shutil.rmtree(directory, ignore_errors=True)
    row = {
        **sizes,
        "resume": _figures(resume, count),
        "merge": _figures(merge, count),
        "trajkit_run_resume": {
            "wall_s": round(cli["wall_s"], 2),
            "cpu_s": round(cli["cpu_s"], 2),
            "peak_rss_mib": common.mib(cli["peak_rss"]),
        },
    }
    r, m = row["resume"], row["merge"]
    print(
        f"  resume: {r['total_s']} s (dataset {r['read_dataset_s']} s, scan {r['scan_s']} s, assign "
        f"{r['assign_s']} s), peak {r['peak_rss_mib']} MiB = {r['bytes_per_record']} B/record above start-up",
        flush=True,
    )
    print(
        f"  merge:  {m['total_s']} s (finalize {m['finalize_s']} s), peak {m['peak_rss_mib']} MiB = "
        f"{m['bytes_per_record']} B/record",
        flush=True,
    )
    c = row["trajkit_run_resume"]
    print(f"  trajkit run --resume (finished run): {c['wall_s']} s, peak {c['peak_rss_mib']} MiB", flush=True)
    return row


def _figures(raw: dict[str, Any], count: int) -> dict[str, Any]:
    steps = ("read_dataset_s", "scan_s", "assign_s", "finalize_s")
    out: dict[str, Any] = {k: round(raw[k], 2) for k in steps if k in raw}
    out["total_s"] = round(sum(raw[k] for k in steps if k in raw), 2)
    out["process_wall_s"] = round(raw["wall_s"], 2)
    out["peak_rss_mib"] = common.mib(raw["peak_rss"])
    out["bytes_per_record"] = round((raw["peak_rss"] - raw["baseline_rss"]) / count)
    out["dataset_bytes_per_record"] = round((raw["rss_after_dataset"] - raw["baseline_rss"]) / count)
    out["index_bytes_per_record"] = round((raw["rss_after_scan"] - raw["rss_after_dataset"]) / count)
    out["assign_bytes_per_record"] = round((raw["rss_after_assign"] - raw["rss_after_scan"]) / count)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    args = parse_args(argv)
    common.use_source(args.source)
    if args.phase:
        phase(args)
        return None
    sizes = sorted({n for n in (args.compare, args.records) if n > 0})
    tmp = Path(tempfile.mkdtemp(prefix="trajkit-bench-", dir=args.workdir))
    try:
        free = shutil.disk_usage(tmp).free
        needed = max(sizes) * 7000  # ledger, merged output and the dataset, with room to spare
        if free < needed:
            sys.exit(f"{tmp}: {common.mib(free)} MiB free, about {common.mib(needed)} MiB needed")
        rows = [one_size(args, tmp, n) for n in sizes]
    finally:
        if args.keep:
            print(f"generated data kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    results = {"figure": "resume and merge at scale", "machine": common.machine(), "rows": rows}
    print()
    print(render(rows))
    common.save_json(args.json, results)
    return results


def render(rows: list[dict[str, Any]]) -> str:
    return common.table(
        [
            (
                f"{r['records']:,}",
                r["ledger_mib"],
                r["resume"]["total_s"],
                r["resume"]["peak_rss_mib"],
                r["resume"]["bytes_per_record"],
                f"{r['resume']['dataset_bytes_per_record']} / {r['resume']['index_bytes_per_record']} / "
                f"{r['resume']['assign_bytes_per_record']}",
                r["merge"]["total_s"],
                r["merge"]["peak_rss_mib"],
                r["merge"]["bytes_per_record"],
                r["trajkit_run_resume"]["wall_s"],
                r["trajkit_run_resume"]["peak_rss_mib"],
            )
            for r in rows
        ],
        (
            "records",
            "ledger MiB",
            "resume s",
            "resume peak MiB",
            "resume B/record",
            "dataset / index / plan B/record",
            "merge s",
            "merge peak MiB",
            "merge B/record",
            "`run --resume` s",
            "`run --resume` peak MiB",
        ),
    )


if __name__ == "__main__":
    main()
