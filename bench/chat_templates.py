"""Cost of rendering through transformers' chat-template renderer instead of a copy of its environment.

``python -m bench.chat_templates [--rows N] [--json FILE]``: the import time of transformers'
``chat_template_utils`` against jinja2's sandbox alone (each in a fresh interpreter, best of 3),
and the time to adapt, render and check one sample row (two renderings plus checks) through the
vendored Qwen2.5 template.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

TEMPLATE = Path(__file__).resolve().parent.parent / "tests" / "data" / "chat_templates" / "qwen2.5.jinja"


def import_seconds(statement: str, repeats: int = 3) -> float:
    code = f"import time; t = time.perf_counter(); {statement}; print(time.perf_counter() - t)"
    runs = [
        float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
        for _ in range(repeats)
    ]
    return min(runs)


def row_seconds(rows: int) -> float:
    from trajkit.plugins.export.chat_templates.adapt import adapt
    from trajkit.plugins.export.chat_templates.check import check_row
    from trajkit.plugins.export.chat_templates.export import SAMPLE_TOOLS, fit_template, sample_record
    from trajkit.plugins.export.chat_templates.source import load_chat_template

    template = load_chat_template(str(TEMPLATE))
    profile = fit_template(template, {}).profile
    record = sample_record(parallel=True)
    start = time.perf_counter()
    for _ in range(rows):
        _, outcome = check_row(template, profile, adapt(record, SAMPLE_TOOLS, profile, {}))
        assert not outcome.problems
    return (time.perf_counter() - start) / rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=500)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--source", type=Path, help="unused; accepted like the other benchmarks")
    args = parser.parse_args(argv)
    results = {
        "import_transformers_renderer_s": import_seconds(
            "from transformers.utils.chat_template_utils import render_jinja_template"
        ),
        "import_jinja2_sandbox_s": import_seconds("import jinja2.sandbox"),
        "row_adapt_render_check_ms": row_seconds(args.rows) * 1000,
    }
    for key, value in results.items():
        print(f"{key}: {value:.3f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
