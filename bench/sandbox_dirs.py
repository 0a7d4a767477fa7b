"""What a local sandbox's directories cost the kernel, by the file system they are made on.

Each round makes ``--count`` sandboxes through trajkit's LocalBackend (its directory, owner file
and working directory), writes two small files in each as the file tools do, and closes them
(the tree removed), one after another; the CPU of this process (all its threads: the backend makes
and removes directories in worker threads) divided by the count. The same on every ``--root``.

    python -m bench.sandbox_dirs                                  # the temporary directory and /dev/shm
    python -m bench.sandbox_dirs --root /var/tmp --root /dev/shm --count 1000
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import common


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.sandbox_dirs", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--root",
        action="append",
        type=Path,
        help="a directory to make the sandboxes below, repeatable (default: the temporary directory and /dev/shm)",
    )
    parser.add_argument("--count", type=int, default=500, help="sandboxes per root (default 500)")
    parser.add_argument("--json", type=Path, help="write the results here")
    common.add_source_arg(parser)
    return parser.parse_args(argv)


async def _round(root: Path, count: int) -> dict[str, Any]:
    from trajkit.plugins.local.sandbox import LocalBackend
    from trajkit.sandbox import SandboxSpec

    backend = LocalBackend({"root": str(root)})
    body = b"a line of a small file\n" * 8

    async def one(i: int) -> None:
        sandbox = await backend.create(SandboxSpec(run_id="bench-dirs", work_id=f"w.{i}"))
        await sandbox.write_file("notes.txt", body)
        await sandbox.write_file("src/main.py", body)
        await sandbox.close()

    for i in range(20):  # warm-up: imports, the thread pool
        await one(-1 - i)
    cpu, wall = time.process_time(), time.perf_counter()
    for i in range(count):
        await one(i)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    await backend.reap("bench-dirs")
    await backend.aclose()
    return {
        "root": str(root),
        "file_system": file_system_of(root),
        "count": count,
        "cpu_ms_per_sandbox": round(1e3 * cpu / count, 3),
        "wall_ms_per_sandbox": round(1e3 * wall / count, 3),
    }


def file_system_of(path: Path) -> str:
    """The type of the file system ``path`` is on (the longest mount point above it)."""
    best, kind = "", "?"
    for line in Path("/proc/mounts").read_text().splitlines():
        _, point, fstype, *_ = line.split()
        if (str(path) + "/").startswith(point.rstrip("/") + "/") and len(point) >= len(best):
            best, kind = point, fstype
    return kind


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    common.use_source(args.source)
    parents = args.root or [Path(tempfile.gettempdir()), Path("/dev/shm")]
    rows = []
    for parent in parents:
        if not parent.is_dir():
            print(f"{parent}: not a directory, skipped")
            continue
        root = Path(tempfile.mkdtemp(prefix="trajkit-bench-dirs-", dir=parent))
        root.chmod(0o711)  # the sandboxes' own user passes through it when this runs as root
        try:
            row = asyncio.run(_round(root / "sandboxes", args.count))
        finally:
            shutil.rmtree(root, ignore_errors=True)
        rows.append(row)
        print(
            f"{parent} ({row['file_system']}): {row['cpu_ms_per_sandbox']:.3f} ms of CPU, "
            f"{row['wall_ms_per_sandbox']:.3f} ms per sandbox",
            flush=True,
        )
    results = {"figure": "a local sandbox's directories and two files, made and removed", "rows": rows}
    results["machine"] = common.machine()
    common.save_json(args.json, results)
    return results


if __name__ == "__main__":
    main()
