"""Figure 10: ``trajkit compare`` of two large runs: time and peak memory.

Generates two runs of N prompts x S samples each (the nine-turn records of figure 5, scored, with
pass probabilities that differ per prompt and per run), then measures ``trajkit compare A B
--json`` in a subprocess: wall and CPU seconds, peak memory. Generated data is deleted afterwards.

    python -m bench.compare_scale                       # 10,000 prompts x 4 samples per run
    python -m bench.compare_scale --prompts 250000      # a million trajectories per run
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
from bench.ledger_scale import SENTINELS, _template


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.compare_scale", description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=10_000, help="prompts per run (default 10,000)")
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt (default 4)")
    parser.add_argument("--workdir", type=Path, help="where to generate (default: a temporary directory)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds for the comparison at most")
    parser.add_argument("--json", type=Path, help="write the results here")
    common.add_source_arg(parser)
    return parser.parse_args(argv)


def generate(run_dir: Path, prompts: int, samples: int, skill: float, seed: int) -> None:
    """A run's ledger: each prompt's samples pass with a probability around ``skill``."""
    from trajkit.run.dataset import DatasetRow

    rng = random.Random(seed)
    parts = _template()
    parts[-1] = parts[-1][:-1] + ',"score":@@SCORE@@}'
    run_dir.mkdir(parents=True)
    batch, handle = 0, (run_dir / "batch_0.jsonl").open("w")
    for i in range(prompts):
        prompt = f"Task {i}: write a script that prints the {i}th prime and check its output"
        prompt_id = DatasetRow(prompt=prompt).prompt_id()
        chance = min(1.0, max(0.0, rng.gauss(skill, 0.3)))
        for sample in range(samples):
            if (i * samples + sample) % 100 == 0 and i + sample:
                handle.close()
                batch += 1
                handle = (run_dir / f"batch_{batch}.jsonl").open("w")
            passed = rng.random() < chance
            values = {
                SENTINELS[0]: f"{prompt_id}.{sample}",
                SENTINELS[1]: prompt_id,
                SENTINELS[2]: prompt,
                SENTINELS[3]: "2026-01-01T00:00:00+00:00",
                SENTINELS[4]: f"result {i}",
            }
            line = "".join(values.get(p, p) for p in parts)
            score = {"passed": passed, "value": float(passed), "checks": []}
            handle.write(line.replace("@@SCORE@@", json.dumps(score)) + "\n")
    handle.close()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    common.use_source(args.source)
    tmp = Path(tempfile.mkdtemp(prefix="trajkit-bench-", dir=args.workdir))
    records = args.prompts * args.samples
    try:
        generate(tmp / "a", args.prompts, args.samples, 0.6, 1)
        generate(tmp / "b", args.prompts, args.samples, 0.65, 2)
        ledger_mib = common.mib(sum(p.stat().st_size for p in (tmp / "a").glob("batch_*.jsonl")))
        print(f"2 runs of {records:,} records ({ledger_mib} MiB of ledger each)", flush=True)
        argv_ = [sys.executable, "-m", "trajkit", "compare", str(tmp / "a"), str(tmp / "b"), "--json"]
        with (tmp / "out.json").open("wb") as out:
            measured = common.run_measured(
                argv_, env=common.child_env(), timeout=args.timeout, interval=0.25, stdout=out
            )
        if measured.returncode != 0:
            sys.exit(f"trajkit compare failed (exit {measured.returncode}):\n{measured.stderr_tail}")
        data = json.loads((tmp / "out.json").read_text())
        method = data["runs"][1]["paired"]["method"]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    row = {
        "prompts": args.prompts,
        "samples": args.samples,
        "records_per_run": records,
        "ledger_mib_per_run": ledger_mib,
        "wall_s": round(measured.wall_s, 2),
        "cpu_s": round(measured.cpu_s, 2),
        "peak_rss_mib": common.mib(measured.max_rss),
        "paired_method": method,
    }
    print(common.table([tuple(row.values())], tuple(row)))
    results = {"figure": "trajkit compare at scale", "machine": common.machine(), "rows": [row]}
    common.save_json(args.json, results)
    return results


if __name__ == "__main__":
    main()
