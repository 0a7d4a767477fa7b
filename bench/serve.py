"""``trajkit serve``: the latency it adds over the bare model per request, and requests/s at many
concurrent streaming sessions.

The model is ``trajkit.testing.openai_server`` in its own process; ``trajkit serve`` runs in
another, with the local sandbox (a fresh sandbox per request). The client here is bare aiohttp,
so its own cost stays small beside what is measured.

    python -m bench.serve [--requests 200] [--latency 0.02] [--stream-latency 1.0] [--concurrency 100]
                          [--streams 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

MODEL = "bench-model"
KEY = "bench-server-key-0123456789"


def start(command: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    """A process that prints ``READY URL`` once it listens."""
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith("READY "):
        process.kill()
        raise SystemExit(f"{command[:4]} did not start: {line!r}")
    return process, line.split()[1]


def cpu_seconds(pid: int) -> tuple[float, float]:
    """CPU of the process itself, and of its children it has reaped (the sandboxes' commands)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick


def body(prompt: str, stream: bool) -> dict[str, Any]:
    data: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": prompt}]}
    if stream:
        data.update(stream=True, stream_options={"include_usage": True})
    return data


async def one(session: aiohttp.ClientSession, url: str, data: dict[str, Any]) -> float:
    started = time.perf_counter()
    async with session.post(url, json=data, headers={"Authorization": f"Bearer {KEY}"}) as response:
        if response.status != 200:
            raise SystemExit(f"{url}: {response.status} {await response.text()}")
        async for _ in response.content.iter_any():
            pass
    return time.perf_counter() - started


async def sequential(url: str, count: int, stream: bool) -> list[float]:
    async with aiohttp.ClientSession() as session:
        await one(session, url, body("warm up", stream))
        return [await one(session, url, body(f"request {i}", stream)) for i in range(count)]


async def concurrent(url: str, concurrency: int, total: int) -> tuple[float, list[float]]:
    """``total`` streamed requests, ``concurrency`` at a time; returns the wall time and latencies."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(total):
        queue.put_nowait(i)
    latencies: list[float] = []
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                latencies.append(await one(session, url, body(f"stream {i}", True)))

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - started, latencies


def ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


def model_server(latency: float, tool_calls: int) -> tuple[subprocess.Popen[str], str]:
    return start(
        [
            sys.executable, "-m", "trajkit.testing.openai_server", "--port", "0", "--latency", str(latency),
            "--tool-calls", str(tool_calls), "--model", MODEL,
        ]
    )  # fmt: skip


def serve(base_url: str, root: str, concurrency: int, extra: list[str]) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "TRAJKIT_SERVER_KEY": KEY, "OPENAI_API_KEY": "not-needed"}
    return start(
        [
            sys.executable, "-m", "trajkit", "serve", "--port", "0", "--model", MODEL, "--base_url", base_url,
            "--toolsets", "terminal", "--max_concurrent", str(concurrency + 10),
            "--sandbox_option", f"local.root={root}", *extra,
        ],
        env,
    )  # fmt: skip


def stop(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def latency_figures(args: argparse.Namespace, root: str) -> dict[str, Any]:
    """Sequential requests, one model call each (the model answers at once): bare vs served."""
    model, model_url = model_server(args.latency, 0)
    server, served_url = serve(model_url, root, 1, args.serve_arg)
    try:
        bare = asyncio.run(sequential(f"{model_url}/chat/completions", args.requests, False))
        whole = asyncio.run(sequential(f"{served_url}/chat/completions", args.requests, False))
        streamed = asyncio.run(sequential(f"{served_url}/chat/completions", args.requests, True))
    finally:
        stop(server)
        stop(model)
    added = statistics.median(whole) - statistics.median(bare)
    return {
        "model_latency_ms": args.latency * 1000,
        "bare_p50_ms": ms(bare, 0.5),
        "served_p50_ms": ms(whole, 0.5),
        "served_p95_ms": ms(whole, 0.95),
        "streamed_p50_ms": ms(streamed, 0.5),
        "added_p50_ms": round(added * 1000, 2),
        "added_streamed_p50_ms": round((statistics.median(streamed) - statistics.median(bare)) * 1000, 2),
    }


def throughput_figures(args: argparse.Namespace, root: str) -> dict[str, Any]:
    """``--concurrency`` streaming sessions at once, each a tool call (``true`` in the terminal of a
    fresh sandbox) and an answer: two model calls of ``--stream-latency`` each."""
    model, model_url = model_server(args.stream_latency, 1)
    server, served_url = serve(model_url, root, args.concurrency, args.serve_arg)
    try:
        asyncio.run(concurrent(f"{served_url}/chat/completions", args.concurrency, args.concurrency))
        cpu_before = cpu_seconds(server.pid)
        wall, latencies = asyncio.run(
            concurrent(f"{served_url}/chat/completions", args.concurrency, args.streams)
        )
        cpu_after = cpu_seconds(server.pid)
    finally:
        stop(server)
        stop(model)
    ideal = args.concurrency / (2 * args.stream_latency)
    return {
        "concurrency": args.concurrency,
        "streams": args.streams,
        "requests_per_s": round(args.streams / wall, 1),
        "ideal_requests_per_s": round(ideal, 1),
        "of_ideal": round(args.streams / wall / ideal, 3),
        "p50_ms": ms(latencies, 0.5),
        "p95_ms": ms(latencies, 0.95),
        "serve_cpu_ms_per_request": round(1000 * (cpu_after[0] - cpu_before[0]) / args.streams, 2),
        "commands_cpu_ms_per_request": round(1000 * (cpu_after[1] - cpu_before[1]) / args.streams, 2),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.serve", description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=200, help="sequential requests per latency figure")
    parser.add_argument("--latency", type=float, default=0.02, help="the model's seconds per answer")
    parser.add_argument(
        "--stream-latency", type=float, default=1.0, help="the model's seconds per answer under load"
    )
    parser.add_argument("--concurrency", type=int, default=100, help="streaming sessions at once")
    parser.add_argument("--streams", type=int, default=1000, help="streamed requests in the throughput run")
    parser.add_argument(
        "--serve-arg", action="append", default=[], help="an extra flag for trajkit serve (repeatable)"
    )
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="trajkit-bench-serve-", dir="/dev/shm") as root:
        results = {"latency": latency_figures(args, root), "throughput": throughput_figures(args, root)}
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
