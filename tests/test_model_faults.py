"""Whole runs against an endpoint in trouble: a 429 storm, the run's own limits, an endpoint that
goes away mid-run. Assertions are on behaviour; durations are printed for the record only."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.helpers import read_jsonl, trajkit, write_jsonl
from trajkit.testing.openai_server import Body, Fault, OpenAITestServer
from trajkit.testing.policies import dialect_policy

WORKERS = 32


def storm(number: int, body: Body) -> Fault | None:
    """20 % 429 (with Retry-After), 10 % 500, by request number so runs repeat."""
    draw = random.Random(number).random()
    if draw < 0.2:
        return Fault(status=429, headers={"Retry-After": "0.5"}, message="rate limited")
    if draw < 0.3:
        return Fault(status=500, message="internal hiccup")
    return None


def run(tmp: Path, name: str, server: OpenAITestServer, *extra: str) -> tuple[Any, float]:
    dataset = write_jsonl(tmp / f"{name}.jsonl", [{"prompt": f"{name} job {i}"} for i in range(120)])
    started = time.monotonic()
    result = trajkit(
        "run", "--dataset_file", str(dataset), "--run_name", name, "--output_dir", str(tmp),
        "--model", "m", "--base_url", server.base_url, "--quiet", "--distribution", "file_only",
        "--num_workers", str(WORKERS), "--max_retries", "10", *extra,
    )  # fmt: skip
    return result, time.monotonic() - started


def test_a_429_storm_neither_halves_concurrency_nor_times_sessions_out(tmp_path: Path) -> None:
    with OpenAITestServer(dialect_policy, latency=0.05) as calm:
        calm_result, calm_s = run(tmp_path, "calm", calm)
    with OpenAITestServer(dialect_policy, latency=0.05, faults=storm) as stormy:
        result, storm_s = run(tmp_path, "storm", stormy, "--prompt_timeout", "60")
        statuses = [r.status for r in stormy.requests]
    print(f"\n120 prompts, {WORKERS} workers: {calm_s:.1f}s without faults, {storm_s:.1f}s in the storm")
    assert calm_result.returncode == 0 and result.returncode == 0, result.stderr[-3000:]
    assert len(read_jsonl(tmp_path / "storm" / "trajectories.jsonl")) == 120
    stats = json.loads((tmp_path / "storm" / "statistics.json").read_text())["model_client"]
    assert stats["rate_limited"] == statuses.count(429) > 40
    assert stats["server_error"] == statuses.count(500) > 20
    assert stats["throttled"] == 0, "a fifth of 429s is not a rate limit that persists: no cut"
    assert stats["limiter_wait_s"] == 0.0, "no session was held back by the run's own limiter"
    assert not (tmp_path / "storm" / "failures.jsonl").exists() or not read_jsonl(
        tmp_path / "storm" / "failures.jsonl"
    )


def test_waiting_for_the_runs_own_limits_does_not_count_against_the_prompt_timeout(tmp_path: Path) -> None:
    """One request at a time for eight sessions: each waits far longer than its timeout, and finishes."""
    dataset = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"job {i}"} for i in range(8)])
    with OpenAITestServer(dialect_policy, latency=0.25) as server:
        result = trajkit(
            "run", "--dataset_file", str(dataset), "--run_name", "r", "--output_dir", str(tmp_path),
            "--model", "m", "--base_url", server.base_url, "--quiet", "--distribution", "file_only",
            "--num_workers", "8", "--max_concurrent_requests", "1", "--prompt_timeout", "2",
            "--max_attempts", "1",
        )  # fmt: skip
        total = len(server.requests)
    assert result.returncode == 0, result.stderr[-3000:]
    assert total * 0.25 > 2 * 2, "the sessions together needed far more than one prompt_timeout"
    stats = json.loads((tmp_path / "r" / "statistics.json").read_text())
    assert stats["model_client"]["limiter_wait_s"] > 2
    assert len(read_jsonl(tmp_path / "r" / "trajectories.jsonl")) == 8


def test_an_endpoint_gone_mid_run_holds_the_sessions_and_stops_the_run_once(tmp_path: Path) -> None:
    dataset = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"job {i}"} for i in range(200)])
    server = OpenAITestServer(dialect_policy, latency=0.05).start()
    command = [
        sys.executable, "-m", "trajkit", "run", "--dataset_file", str(dataset), "--run_name", "r",
        "--output_dir", str(tmp_path), "--model", "m", "--base_url", server.base_url, "--quiet",
        "--distribution", "file_only", "--num_workers", "16", "--retry_budget", "4",
    ]  # fmt: skip
    with subprocess.Popen(command, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL) as process:
        try:
            deadline = time.monotonic() + 60
            while server.count < 40 and time.monotonic() < deadline:
                time.sleep(0.02)
            server.stop()  # mid-run: in-flight connections dropped, new ones refused
            _, stderr = process.communicate(timeout=120)
        finally:
            if process.poll() is None:
                process.kill()
    assert process.returncode == 1, stderr[-3000:]
    assert stderr.count("stopping the run") == 1
    assert "cannot connect to 127.0.0.1" in stderr and "Connection refused" in stderr
    failures = read_jsonl(tmp_path / "r" / "failures.jsonl")
    assert failures and len(failures) <= 16, "the sessions in flight at most, not every prompt"
    assert {f["error_class"] for f in failures} <= {"endpoint_unreachable", "api_error"}
    status = json.loads((tmp_path / "r" / "statistics.json").read_text())
    assert status["pending"] > 100, "the rest waits for a resume"
