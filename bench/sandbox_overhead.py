"""Figure 4: what a sandbox costs per prompt: create, one ``true``, close.

Local: trajkit's LocalBackend in this process (a temporary directory and one process start).
Docker: the trajkit_docker backend against the bare ``docker`` CLI doing the same steps
(``docker run -d IMAGE sleep``, ``docker exec ID true``, ``docker rm -f ID``); the ratio says what
trajkit adds. The Docker part is skipped, with a note, when no engine answers.

    python -m bench.sandbox_overhead                     # quick: 200 local, 10 docker
    python -m bench.sandbox_overhead --local 2000 --docker 50
    python -m bench.sandbox_overhead --shell /bin/sh     # the local backend's local.shell option
    python -m bench.sandbox_overhead --isolation none    # unconfined commands (the default is bubblewrap)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from bench import common

DEFAULT_IMAGE = "trajkit-test/busybox:latest"
STEPS = ("create", "exec", "close")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.sandbox_overhead", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--local", type=int, default=200, help="local sandboxes, one after another (default 200; 0: skip)"
    )
    parser.add_argument("--local-concurrency", type=int, default=50, help="also this many at once (0: skip)")
    parser.add_argument(
        "--execs", type=int, default=500, help="process starts for the exec-rate part (0: skip)"
    )
    parser.add_argument(
        "--exec-concurrency", type=int, default=50, help="process starts in flight (default 50)"
    )
    parser.add_argument("--shell", help="the local backend's shell (its local.shell option; default bash)")
    parser.add_argument(
        "--isolation",
        choices=["auto", "bwrap", "none"],
        help="the local backend's isolation option (default: the backend's own, auto)",
    )
    parser.add_argument(
        "--docker", type=int, default=10, help="Docker containers per method (default 10, 0: skip)"
    )
    parser.add_argument(
        "--image", default=DEFAULT_IMAGE, help=f"image for the Docker part (default {DEFAULT_IMAGE})"
    )
    parser.add_argument("--json", type=Path, help="write the results here")
    common.add_source_arg(parser)
    return parser.parse_args(argv)


def _summary(times: dict[str, list[float]]) -> dict[str, Any]:
    total = [sum(step) for step in zip(*(times[s] for s in STEPS), strict=True)]
    out: dict[str, Any] = {"n": len(total)}
    for name, values in (*((s, times[s]) for s in STEPS), ("total", total)):
        ordered = sorted(values)
        out[f"{name}_ms_median"] = round(1e3 * statistics.median(ordered), 3)
        out[f"{name}_ms_p90"] = round(1e3 * ordered[int(0.9 * (len(ordered) - 1))], 3)
    return out


async def _timed(times: dict[str, list[float]], step: str, action: Awaitable[Any]) -> Any:
    started = time.perf_counter()
    result = await action
    times[step].append(time.perf_counter() - started)
    return result


def _local_options(root: Path, shell: str | None, isolation: str | None = None) -> dict[str, str]:
    options = {"root": str(root), "shell": shell, "isolation": isolation}
    return {key: value for key, value in options.items() if value}


async def _local(n: int, concurrency: int, options: dict[str, str]) -> dict[str, Any]:
    from trajkit.plugins.local.sandbox import LocalBackend
    from trajkit.sandbox import SandboxSpec

    backend = LocalBackend(options)
    times: dict[str, list[float]] = {s: [] for s in STEPS}

    async def one(i: int) -> None:
        sandbox = await _timed(
            times, "create", backend.create(SandboxSpec(run_id="bench-local", work_id=f"w.{i}"))
        )
        result = await _timed(times, "exec", sandbox.exec("true", timeout=30))
        assert result.exit_code == 0, result
        await _timed(times, "close", sandbox.close())

    for i in range(min(20, n)):  # warm-up: imports, page cache, the child watcher
        await one(-1 - i)
    times = {s: [] for s in STEPS}
    started = time.perf_counter()
    if concurrency <= 1:
        for i in range(n):
            await one(i)
    else:
        gate = asyncio.Semaphore(concurrency)

        async def gated(i: int) -> None:
            async with gate:
                await one(i)

        await asyncio.gather(*(gated(i) for i in range(n)))
    wall = time.perf_counter() - started
    await backend.reap("bench-local")
    leftovers = list(Path(options["root"]).iterdir())
    return {
        **_summary(times),
        "concurrency": max(concurrency, 1),
        "per_second": round(n / wall, 1),
        "left_behind": len(leftovers),
    }


async def _exec_rate(
    n: int, concurrency: int, options: dict[str, str], how: str, watcher: str
) -> dict[str, Any]:
    """``true`` started n times, ``concurrency`` at once: through LocalSandbox.exec or bare asyncio."""
    import resource

    from trajkit.plugins.local.sandbox import LocalBackend
    from trajkit.sandbox import SandboxSpec

    if watcher == "pidfd":
        chosen = asyncio.PidfdChildWatcher()
        asyncio.set_child_watcher(chosen)
        chosen.attach_loop(asyncio.get_running_loop())
    backend = LocalBackend(options)
    sandbox = await backend.create(SandboxSpec(run_id="bench-exec", work_id="w.0"))
    gate = asyncio.Semaphore(concurrency)
    shell = backend.shell

    async def one() -> None:
        async with gate:
            if how == "trajkit":
                result = await sandbox.exec("true", timeout=30)
                assert result.exit_code == 0
            else:
                proc = await asyncio.create_subprocess_exec(
                    shell,
                    "-c",
                    "true",
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.DEVNULL,
                )
                await proc.wait()

    await asyncio.gather(*(one() for _ in range(min(n, 50))))  # the first starts an isolated sandbox
    before = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    in_sandbox = _supervisor_cpu(sandbox)
    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    in_sandbox = _supervisor_cpu(sandbox) - in_sandbox
    await sandbox.close()
    if watcher == "pidfd":
        asyncio.set_child_watcher(None)  # type: ignore[arg-type]  # back to the default

    def cpu(pair: Any) -> float:
        return sum(u.ru_utime + u.ru_stime for u in pair)

    return {
        "how": how,
        "child_watcher": watcher,
        "n": n,
        "concurrency": concurrency,
        "per_second": round(n / wall, 1),
        "parent_cpu_ms_per_exec": round(
            1e3 * (before[0].ru_utime + before[0].ru_stime - after[0].ru_utime - after[0].ru_stime) / -n, 3
        ),
        "total_cpu_ms_per_exec": round(1e3 * (cpu(after) - cpu(before) + in_sandbox) / n, 3),
    }


def _supervisor_cpu(sandbox: Any) -> float:
    """CPU seconds so far of an isolated local sandbox's supervisor and of the commands it ran (its
    reaped descendants); 0 for a sandbox without one. The supervisor is still running, so the
    runner's own accounting of its children does not hold it yet."""
    supervisor = getattr(sandbox, "supervisor", None)
    if supervisor is None or not supervisor.pid:
        return 0.0
    with open(f"/proc/{supervisor.pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return sum(int(field) for field in fields[11:15]) / os.sysconf("SC_CLK_TCK")


async def _docker_trajkit(n: int, image: str) -> dict[str, Any]:
    from trajkit.sandbox import SandboxSpec
    from trajkit_docker import DockerBackend

    backend = DockerBackend({"network": "none"})
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    times: dict[str, list[float]] = {s: [] for s in STEPS}
    try:
        await backend.verify_image(image)
        for i in range(-1, n):  # the first one warms the connection pool and is not counted
            sandbox = await _timed(
                times,
                "create",
                backend.create(SandboxSpec(run_id=run_id, work_id=f"w.{i}", image=image, lifetime=600)),
            )
            result = await _timed(times, "exec", sandbox.exec("true", timeout=60))
            assert result.exit_code == 0, result
            await _timed(times, "close", sandbox.close())
            if i < 0:
                times = {s: [] for s in STEPS}
    finally:
        await backend.reap(run_id)
        await backend.aclose()
    return _summary(times)


def _docker_cli(n: int, image: str) -> dict[str, Any]:
    times: dict[str, list[float]] = {s: [] for s in STEPS}

    def step(name: str, argv: list[str]) -> str:
        started = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
        times[name].append(time.perf_counter() - started)
        return done.stdout.strip()

    for i in range(-1, n):
        container = step(
            "create",
            ["docker", "run", "-d", "--network", "none", "--label", "trajkit-bench=1", image, "sleep", "600"],
        )
        try:
            step("exec", ["docker", "exec", container, "true"])
        finally:
            step("close", ["docker", "rm", "-f", container])
        if i < 0:
            times = {s: [] for s in STEPS}
    return _summary(times)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    common.use_source(args.source)
    common.raise_fd_limit()
    results: dict[str, Any] = {
        "figure": "sandbox create + exec true + close, per prompt",
        "machine": common.machine(),
    }
    with tempfile.TemporaryDirectory(prefix="trajkit-bench-") as tmp:
        options = _local_options(Path(tmp), args.shell, args.isolation)
        if args.local > 0:
            results["local_sequential"] = asyncio.run(_local(args.local, 1, options))
            _print("local, one at a time", results["local_sequential"])
        if args.local > 0 and args.local_concurrency > 1:
            results["local_concurrent"] = asyncio.run(_local(args.local, args.local_concurrency, options))
            _print(f"local, {args.local_concurrency} at once", results["local_concurrent"])
        if args.execs > 0:
            rates = []
            for how, watcher in (
                ("bare", "threaded"),
                ("trajkit", "threaded"),
                ("bare", "pidfd"),
                ("trajkit", "pidfd"),
            ):
                rate = asyncio.run(_exec_rate(args.execs, args.exec_concurrency, options, how, watcher))
                rates.append(rate)
                print(
                    f"exec 'true' {how:8} {watcher:8} child watcher: {rate['per_second']:7.1f}/s, runner CPU "
                    f"{rate['parent_cpu_ms_per_exec']:.3f} ms, with the child {rate['total_cpu_ms_per_exec']:.3f} ms "
                    "per exec",
                    flush=True,
                )
            results["exec_rate"] = rates
    if args.docker > 0:
        reason = common.docker_available(args.image)
        if reason:
            results["docker_skipped"] = reason
            print(f"docker: skipped: {reason}")
        else:
            results["docker_image"] = args.image
            results["docker_trajkit"] = asyncio.run(_docker_trajkit(args.docker, args.image))
            _print("docker through trajkit_docker", results["docker_trajkit"])
            results["docker_cli"] = _docker_cli(args.docker, args.image)
            _print("docker CLI", results["docker_cli"])
            ratio = results["docker_trajkit"]["total_ms_median"] / results["docker_cli"]["total_ms_median"]
            results["docker_ratio_trajkit_to_cli"] = round(ratio, 3)
            print(f"docker: trajkit / CLI = {ratio:.2f}")
    common.save_json(args.json, results)
    return results


def _print(title: str, summary: dict[str, Any]) -> None:
    steps = "  ".join(f"{s} {summary[f'{s}_ms_median']:.2f}" for s in STEPS)
    extra = f"  ({summary['per_second']}/s)" if "per_second" in summary else ""
    print(
        f"{title:32} n={summary['n']:5}  median ms: {steps}  total {summary['total_ms_median']:.2f} "
        f"(p90 {summary['total_ms_p90']:.2f}){extra}",
        flush=True,
    )


if __name__ == "__main__":
    main()
