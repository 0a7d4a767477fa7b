"""Figure 6: ``trajkit compress``: records per second and peak memory, and summary requests per record.

Generates N synthetic trajectories (trajkit's record shape and, one in four, the reference
runner's; 4 to 24 gpt turns of 1 to 3 parallel calls, 5 to 20 lines per tool output), then
measures ``trajkit compress --strategy mask_observations`` on them in a subprocess (wall, CPU,
peak RSS) at N and at N/10, so memory that grew with the input would show. Then ``summary`` and
``pipeline`` on a sample against the project's test server (a summariser that answers at once with
a fixed-length summary): requests per record, and a rerun that must ask for nothing.

    python -m bench.compress                      # 100k records for masking, 200 for summaries
    python -m bench.compress --records 1000000 --summary-records 1000
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import common

BUDGET = 4000
"""Tokens (the offline estimate): under a 4k context, where most generated records do not fit."""
VARIANTS = 64
SENTINEL = "@@INDEX@@"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.compress", description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=100_000, help="records to mask (default 100k)")
    parser.add_argument(
        "--summary-records", type=int, default=200, help="records to summarise per strategy (default 200)"
    )
    parser.add_argument("--max-tokens", type=int, default=BUDGET, help=f"token budget (default {BUDGET})")
    parser.add_argument("--workdir", type=Path, help="where to generate (default: a temporary directory)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per measured step at most")
    parser.add_argument("--json", type=Path, help="write the results here")
    common.add_source_arg(parser)
    return parser.parse_args(argv)


def _variants() -> list[str]:
    """Record texts with the prompt index left as a sentinel; seeded, so every run is the same."""
    from trajkit.testing.trajectories import reference_record, trajkit_record

    rng = random.Random(6)
    texts = []
    for number in range(VARIANTS):
        steps, parallel, lines = rng.randint(4, 24), rng.randint(1, 3), rng.randint(5, 20)
        make = reference_record if number % 4 == 3 else trajkit_record
        record = make(0, steps=steps, parallel=parallel, lines=lines)
        record["prompt_index"] = SENTINEL
        record["conversations"][1]["value"] = f"Task {SENTINEL}: inspect the repository and fix it"
        # Every record's tool output names its record, so no two records share a region (and a
        # summary): the cache must not make the summary figures look cheaper than they are.
        for turn in record["conversations"]:
            turn["value"] = turn["value"].replace("r0.", f"r{SENTINEL}.")
        # As each writes them: trajkit's files are compact (orjson), the reference's json.dumps'.
        texts.append(
            json.dumps(record) if make is reference_record else json.dumps(record, separators=(",", ":"))
        )
    return texts


def generate(path: Path, count: int) -> dict[str, Any]:
    texts = _variants()
    with path.open("w") as out:
        for index in range(count):
            text = texts[index % VARIANTS].replace(f'"{SENTINEL}"', str(index)).replace(SENTINEL, str(index))
            out.write(text + "\n")
    size = path.stat().st_size
    return {"records": count, "input_mib": common.mib(size), "bytes_per_record": round(size / count)}


def compress_argv(source: Path, out: Path, budget: int, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "trajkit", "compress", str(source), "--out", str(out),
        "--max_tokens", str(budget), "--quiet", "--overwrite", *extra,
    ]  # fmt: skip


def measure_mask(args: argparse.Namespace, work: Path, count: int) -> dict[str, Any]:
    source = work / f"in-{count}.jsonl"
    sizes = generate(source, count)
    out = work / f"mask-{count}.jsonl"
    argv = compress_argv(source, out, args.max_tokens, "--strategy", "mask_observations")
    measured = common.run_measured(argv, env=common.child_env(), timeout=args.timeout, interval=0.25)
    if measured.returncode != 0:
        sys.exit(f"trajkit compress failed (exit {measured.returncode}):\n{measured.stderr_tail}")
    metrics = json.loads(out.with_name(out.name + ".metrics.json").read_text())
    assert metrics["records"] == count, metrics
    row = {
        **sizes,
        "wall_s": round(measured.wall_s, 2),
        "cpu_s": round(measured.cpu_s, 2),
        "records_per_s": round(count / measured.wall_s),
        "records_per_cpu_s": round(count / measured.cpu_s),
        "peak_rss_mib": common.mib(measured.max_rss),
        "under_budget": metrics["under_budget"],
        "over_budget_before": metrics["over_budget_before"],
        "reduction_percent": metrics["reduction_percent"],
        "output_mib": common.mib(out.stat().st_size),
    }
    print(
        f"mask_observations, {count:,} records ({sizes['input_mib']} MiB): {row['wall_s']} s, "
        f"{row['records_per_s']:,} records/s, peak {row['peak_rss_mib']} MiB; "
        f"{metrics['under_budget']:,} under budget ({metrics['over_budget_before']:,} were over)",
        flush=True,
    )
    for path in (source, out):
        path.unlink()
    return row


def summary_policy(body: dict[str, Any]) -> dict[str, Any]:
    """A summary of about 200 tokens (the estimate's 4 characters a token), the same for a region."""
    seen = body["messages"][-1]["content"].count("[TOOL RESULT")
    return {"content": f"Progress: {seen} tool results condensed. " + "Facts: file a.py, value 42. " * 28}


def measure_summaries(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    from trajkit.testing.openai_server import OpenAITestServer

    count = args.summary_records
    source = work / "summary-in.jsonl"
    generate(source, count)
    rows = []
    with OpenAITestServer(summary_policy, keep_requests=False) as server:
        for strategy in ("summary", "pipeline"):
            out = work / f"{strategy}.jsonl"
            model = ["--strategy", strategy, "--model", "bench-model", "--base_url", server.base_url]
            rows.append(_summary_row(args, source, out, model, server, strategy, count))
    return rows


def _summary_row(
    args: argparse.Namespace,
    source: Path,
    out: Path,
    model: list[str],
    server: Any,
    strategy: str,
    count: int,
) -> dict[str, Any]:
    before = server.count
    first = common.run_measured(compress_argv(source, out, args.max_tokens, *model), env=common.child_env())
    if first.returncode != 0:
        sys.exit(f"trajkit compress --strategy {strategy} failed:\n{first.stderr_tail}")
    asked = server.count - before
    metrics = json.loads(out.with_name(out.name + ".metrics.json").read_text())
    # The same command again, over the finished output: every summary must come from the cache.
    argv = [a for a in compress_argv(source, out, args.max_tokens, *model) if a != "--overwrite"]
    again = common.run_measured(argv, env=common.child_env())
    assert again.returncode == 0, again.stderr_tail
    row = {
        "strategy": strategy,
        "records": count,
        "over_budget_before": metrics["over_budget_before"],
        "under_budget": metrics["under_budget"],
        "requests": asked,
        "requests_per_record": round(asked / count, 2),
        "requests_per_compressed_record": round(asked / max(1, metrics["over_budget_before"]), 2),
        "summaries": metrics["summaries"],
        "masked": metrics["masked"],
        "rerun_requests": server.count - before - asked,
        "wall_s": round(first.wall_s, 2),
    }
    print(
        f"{strategy}, {count} records: {asked} summary requests = {row['requests_per_record']} per record "
        f"({row['requests_per_compressed_record']} per record over budget), {row['under_budget']} under "
        f"budget; rerun: {row['rerun_requests']} requests",
        flush=True,
    )
    return row


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    common.use_source(args.source)
    work = Path(tempfile.mkdtemp(prefix="trajkit-bench-compress-", dir=args.workdir))
    try:
        free, needed = shutil.disk_usage(work).free, args.records * 70_000  # input and output, with room
        if free < needed:
            sys.exit(f"{work}: {common.mib(free)} MiB free, about {common.mib(needed)} MiB needed")
        sizes = sorted({n for n in (args.records // 10, args.records) if n > 0})
        mask_rows = [measure_mask(args, work, n) for n in sizes]
        summary_rows = measure_summaries(args, work) if args.summary_records else []
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results = {
        "figure": "trajkit compress",
        "machine": common.machine(),
        "max_tokens": args.max_tokens,
        "mask_observations": mask_rows,
        "summary": summary_rows,
    }
    print()
    print(render(mask_rows, summary_rows))
    common.save_json(args.json, results)
    return results


def render(mask_rows: list[dict[str, Any]], summary_rows: list[dict[str, Any]]) -> str:
    mask = common.table(
        [
            (
                f"{r['records']:,}",
                r["input_mib"],
                r["wall_s"],
                f"{r['records_per_s']:,}",
                r["cpu_s"],
                f"{r['records_per_cpu_s']:,}",
                r["peak_rss_mib"],
                f"{r['under_budget']:,} / {r['over_budget_before']:,}",
            )
            for r in mask_rows
        ],
        (
            "records",
            "input MiB",
            "wall s",
            "records/s",
            "CPU s",
            "records per CPU s",
            "peak RSS MiB",
            "under budget / were over",
        ),
    )
    summary = common.table(
        [
            (
                r["strategy"],
                r["records"],
                r["over_budget_before"],
                r["requests_per_record"],
                r["requests_per_compressed_record"],
                r["under_budget"],
                r["rerun_requests"],
            )
            for r in summary_rows
        ],
        ("strategy", "records", "over budget", "requests/record", "requests/over-budget record",
         "under budget after", "rerun requests"),
    )  # fmt: skip
    return f"{mask}\n\n{summary}" if summary_rows else mask


if __name__ == "__main__":
    main()
