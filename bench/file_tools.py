"""Figure 12: the file tools on large inputs: time per call and the peak of the runner's Python
allocations (tracemalloc) while the call runs.

In-process, the local backend without isolation (the tools' own cost, not bubblewrap's):
read_file paging an 8 MiB file of short lines, patch applying a 50-hunk unified diff to it,
search_files over a tree of files.

    python -m bench.file_tools                       # quick: 8 MiB, 2,000 files
    python -m bench.file_tools --files 20000
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from typing import Any

from trajkit.plugins.files import tools as file_tools
from trajkit.plugins.local.sandbox import LocalBackend
from trajkit.sandbox import SandboxSpec
from trajkit.tools import ToolContext

Call = Callable[[], Awaitable[str]]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.file_tools", description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=2000, help="files in the searched tree (default 2000)")
    parser.add_argument("--repeat", type=int, default=5, help="calls per figure; the median is shown")
    parser.add_argument("--json", help="write the results to this file")
    return parser.parse_args(argv)


async def measure(call: Call, repeat: int) -> dict[str, float]:
    """The median time of ``repeat`` calls, then one more call traced for its peak (tracing slows
    Python down, so it is kept out of the timing)."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        await call()
        times.append(time.perf_counter() - started)
    tracemalloc.start()
    await call()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {"ms": round(statistics.median(times) * 1000, 1), "peak_mib": round(peak / 2**20, 2)}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as root:
        backend = LocalBackend({"root": root, "isolation": "none"})
        sandbox = await backend.create(SandboxSpec(run_id="bench-files", work_id="w0"))
        ctx = ToolContext(sandbox, timeout=120, output_cap=16 * 1024)
        try:
            lines = [f"value_{i} = {i}  # a line of an eight-megabyte file\n" for i in range(160_000)]
            text = "".join(lines)[: 8 * 2**20 - 1]
            text = text[: text.rindex("\n") + 1]
            await sandbox.write_file("big.py", text.encode())
            edited = text.splitlines(True)
            for n in range(50):
                edited[n * 3000 + 7] = f"changed_{n} = True\n"
            diff = "".join(difflib.unified_diff(text.splitlines(True), edited, "a/big.py", "b/big.py"))
            for n in range(args.files):
                await sandbox.write_file(f"tree/d{n % 50}/f{n}.py", f"def f{n}():\n    return {n}\n".encode())

            async def restore_and_patch() -> str:
                await sandbox.write_file("big.py", text.encode())
                return await file_tools.patch({"mode": "patch", "patch": diff}, ctx)

            figures = {
                "read_file first page": await measure(lambda: file_tools.read_file({"path": "big.py"}, ctx), args.repeat),
                "read_file last page": await measure(
                    lambda: file_tools.read_file({"path": "big.py", "offset": len(edited) - 100}, ctx), args.repeat
                ),
                "patch, 50 hunks (with a rewrite of the file)": await measure(restore_and_patch, args.repeat),
                f"search_files content, {args.files} files": await measure(
                    lambda: file_tools.search_files({"pattern": "return 1[0-9]*$", "path": "tree"}, ctx), args.repeat
                ),
                f"search_files names, {args.files} files": await measure(
                    lambda: file_tools.search_files({"pattern": "f1*.py", "target": "files"}, ctx), args.repeat
                ),
            }  # fmt: skip
        finally:
            await sandbox.close()
            await backend.aclose()
    return {"file_bytes": len(text), "file_lines": len(edited), "figures": figures}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    results = asyncio.run(run(args))
    print(f"file: {results['file_bytes']} bytes, {results['file_lines']} lines")
    for name, figure in results["figures"].items():
        print(f"{name:45} {figure['ms']:8.1f} ms   peak {figure['peak_mib']:6.2f} MiB")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    main()
