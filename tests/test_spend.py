"""Honest accounting: every model answer counts as it arrives, whatever becomes of its session, toward
``--max_cost`` and the statistics, and a killed invocation's spend is known."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tests.helpers import read_jsonl, trajkit, write_jsonl
from tests.test_resume import run_args, sessions_started
from tests.test_run_faults import start
from trajkit.rundir import lock_holder
from trajkit.runner import ACCOUNTS_INTERVAL
from trajkit.testing.openai_server import OpenAITestServer
from trajkit.testing.policies import dialect_policy

PRICE = 0.25
"""Dollars the test endpoint charges for every answer."""


def priced(body: dict[str, Any]) -> dict[str, Any]:
    return {**dialect_policy(body), "_usage": {"prompt_tokens": 100, "completion_tokens": 10, "cost": PRICE}}


def test_sessions_that_time_out_are_paid_for_and_held_to_max_cost(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"slow task {i}"} for i in range(6)])
    with OpenAITestServer(priced, latency=0.5) as server:
        args = run_args(path, tmp_path, server, "--num_workers", "2", "--prompt_timeout", "1.2")
        result = trajkit(*args, "--max_attempts", "1", "--max_cost", "0.2")
        started = sessions_started(server)
    assert result.returncode == 1, result.stderr
    assert "--max_cost 0.2 reached" in result.stderr
    # the first two sessions were in flight when their first answers crossed the limit; none after
    assert sum(started.values()) == 2
    failures = read_jsonl(tmp_path / "r" / "failures.jsonl")
    assert [f["error_class"] for f in failures] == ["prompt_timeout", "prompt_timeout"]
    stats = json.loads((tmp_path / "r" / "statistics.json").read_text())
    assert stats["kept"] == 0 and stats["cost"] == 0  # no trajectory came out of it ...
    spent = stats["spent"]
    assert spent["requests"] >= 2 and spent["cost"] == PRICE * spent["requests"]  # ... but it was paid
    assert spent["prompt_tokens"] == 100 * spent["requests"]
    shown = trajkit("stats", str(tmp_path / "r"))
    assert f"| spent (every request, every invocation) | ${spent['cost']:,.4f} |" in shown.stdout


def test_a_killed_invocation_s_spend_is_counted(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"task {i}"} for i in range(40)])
    run_dir = tmp_path / "r"
    delay = [0.4]
    with OpenAITestServer(priced, latency=lambda _body: delay[0]) as server:
        process = start(run_args(path, tmp_path, server, "--num_workers", "2"))
        time.sleep(ACCOUNTS_INTERVAL + 2.5)  # at least one update of run.json
        process.kill()
        process.wait()
        while server.in_flight:  # the killed invocation's last requests, answered to no one
            time.sleep(0.05)
        killed_requests = server.count
        assert lock_holder(run_dir) is None
        entry = json.loads((run_dir / "run.json").read_text())["invocations"][0]
        assert "ended" not in entry and entry["model_client"]["cost"] >= PRICE
        delay[0] = 0.0
        server.reset()
        resumed = trajkit(*run_args(path, tmp_path, server, "--resume"))
        assert resumed.returncode == 0, resumed.stderr
        resumed_requests = server.count
    stats = json.loads((run_dir / "statistics.json").read_text())
    spent = stats["spent"]
    # the killed invocation's answers up to its last update, plus every answer of the resume
    assert (
        resumed_requests + entry["model_client"]["requests"]
        == spent["requests"]
        <= (resumed_requests + killed_requests)
    )
    assert spent["cost"] == PRICE * spent["requests"]
    assert spent["requests"] > stats["api_calls"] - resumed_requests  # more than the kept sessions show


def test_configured_prices_price_an_endpoint_that_reports_no_cost(tmp_path: Path) -> None:
    def unpriced(body: dict[str, Any]) -> dict[str, Any]:
        return {**dialect_policy(body), "_usage": {"prompt_tokens": 100, "completion_tokens": 10}}

    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"task {i}"} for i in range(3)])
    config = tmp_path / "run.toml"
    config.write_text('max_tpm = 1000000\n[prices]\n"m" = [2.0, 4.0]\n"other" = [100.0, 100.0]\n')
    with OpenAITestServer(unpriced) as server:
        result = trajkit(*run_args(path, tmp_path, server, "--config", str(config)))
    assert result.returncode == 0, result.stderr
    spent = json.loads((tmp_path / "r" / "statistics.json").read_text())["spent"]
    assert spent["requests"] >= 3
    assert abs(spent["cost"] - spent["requests"] * (100 * 2.0 + 10 * 4.0) / 1e6) < 1e-12
