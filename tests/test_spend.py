"""Honest accounting: every model answer counts as it arrives, whatever becomes of its session, toward
``--max_cost`` and the statistics; it is saved as it arrives, so a killed invocation's spend is
known to its last answer; ``--max_cost`` admits a session only while the spend and the sessions in
flight fit under it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import read_jsonl, trajkit, write_jsonl
from tests.test_resume import run_args, sessions_started
from tests.test_run_live import started
from tests.test_run_settings import run_as_printed
from trajkit.run import invocation as invocation_module
from trajkit.run.rundir import RunDir
from trajkit.testing.openai_server import OpenAITestServer, tool_script_policy
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
    # one session starts before anything is known of a session's cost; its first answer crosses
    # the limit, so no other starts (two workers, yet the second session would only add cost)
    assert sum(started.values()) == 1
    failures = read_jsonl(tmp_path / "r" / "failures.jsonl")
    assert [f["error_class"] for f in failures] == ["prompt_timeout"]
    stats = json.loads((tmp_path / "r" / "statistics.json").read_text())
    assert stats["kept"] == 0 and stats["cost"] == 0  # no trajectory came out of it ...
    spent = stats["spent"]
    assert spent["requests"] >= 2 and spent["cost"] == PRICE * spent["requests"]  # ... but it was paid
    assert spent["prompt_tokens"] == 100 * spent["requests"]
    shown = trajkit("stats", str(tmp_path / "r"))
    assert f"| spent (every request, every invocation) | ${spent['cost']:,.4f} |" in shown.stdout


class Killer:
    """The test endpoint, priced, that kills the runner with SIGKILL at an invocation's Nth request.

    First it holds every request (unanswered) and waits, so that every answer it has sent is read
    and saved by the runner before the kill; then it kills, and answers what it held with errors
    nobody reads. ``sent`` counts the answers it sent (what the runner must have paid for)."""

    def __init__(self, kill_at: int) -> None:
        self.kill_at = kill_at
        self.pid: int | None = None
        self.seen = 0
        self.sent = 0
        self.frozen = False

    async def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        self.seen += 1
        if self.pid is not None and self.seen == self.kill_at:
            self.frozen = True
            await asyncio.sleep(1.5)  # the answers already sent reach the runner and its spend file
            os.kill(self.pid, signal.SIGKILL)
            self.pid, self.frozen = None, False
            return {"_status": 503, "_error": "the runner was killed"}
        held = False
        while self.frozen:
            held = True
            await asyncio.sleep(0.05)
        if held:
            return {"_status": 503, "_error": "the runner was killed"}
        self.sent += 1
        return priced(body)


def test_a_run_killed_five_times_reports_every_answer_the_endpoint_sent(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"task {i}"} for i in range(24)])
    run_dir = tmp_path / "r"
    killer = Killer(kill_at=10)
    with OpenAITestServer(killer, latency=0.02) as server:
        for invocation in range(5):
            killer.seen = 0
            args = run_args(path, tmp_path, server, *(["--resume"] if invocation else []))
            process = started(args, tmp_path / f"killed{invocation}.err")
            killer.pid = process.pid
            assert process.wait(timeout=120) == -signal.SIGKILL, (
                tmp_path / f"killed{invocation}.err"
            ).read_text()
        killer.seen = 0
        final = trajkit(*run_args(path, tmp_path, server, "--resume"))
        assert final.returncode == 0, final.stderr
    spent = json.loads((run_dir / "statistics.json").read_text())["spent"]
    assert spent["requests"] == killer.sent > 5 * (10 - 1)
    assert spent["cost"] == PRICE * killer.sent
    assert spent["prompt_tokens"] == 100 * killer.sent
    assert len(list((run_dir / "spend").iterdir())) == 6  # one spend file per invocation
    status = trajkit("status", str(run_dir)).stdout
    assert f"spent              {PRICE * killer.sent}" in status


def test_max_cost_overshoots_by_at_most_one_mean_session_at_16_in_flight(tmp_path: Path) -> None:
    answer, answers = 0.01, 4  # three tool calls and an answer: every session costs 0.04
    script = tool_script_policy(answers - 1)

    def policy(body: dict[str, Any]) -> dict[str, Any]:
        return {**script(body), "_usage": {"prompt_tokens": 100, "completion_tokens": 10, "cost": answer}}

    cap = 2.0
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"task {i}"} for i in range(120)])
    with OpenAITestServer(policy, latency=0.2) as server:
        args = run_args(path, tmp_path, server, "--num_workers", "16", "--max_cost", str(cap))
        result = trajkit(*args)
        assert server.max_in_flight == 16  # the run had 16 sessions in flight at times
    assert result.returncode == 1, result.stderr
    assert f"--max_cost {cap:g} reached" in result.stderr
    statistics = json.loads((tmp_path / "r" / "statistics.json").read_text())
    spent, mean = statistics["spent"]["cost"], answer * answers
    assert statistics["spent"]["requests"] == statistics["api_calls"]  # no session was cut short
    assert cap <= spent <= cap + mean + 1e-9, (spent, statistics["done"])


def test_max_cost_policy_stop_ends_the_sessions_in_flight_and_a_larger_cap_finishes_them(
    tmp_path: Path,
) -> None:
    rows = 30
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"slow task {i}"} for i in range(rows)])
    run_dir = tmp_path / "r"
    with OpenAITestServer(priced, latency=0.3) as server:
        args = run_args(path, tmp_path, server, "--max_cost", "2", "--max_cost_policy", "stop")
        stopped = trajkit(*args)
        assert stopped.returncode == 1, stopped.stderr
        spent = json.loads((run_dir / "statistics.json").read_text())["spent"]["cost"]
        assert 2 <= spent <= 2 + PRICE * 4  # answers already on their way when the cap was crossed
        budget = [f for f in read_jsonl(run_dir / "failures.jsonl") if f["error_class"] == "budget"]
        assert budget and all("--max_cost 2 reached" in f["message"] for f in budget)
        status = trajkit("status", str(run_dir)).stdout
        assert "'budget': " in status

        command = [line for line in stopped.stderr.splitlines() if line.startswith("to finish: ")][-1]
        assert command.startswith(f"to finish: trajkit run --resume {run_dir} --max_cost ")
        finished = run_as_printed(command.removeprefix("to finish: "))
        assert finished.returncode == 0, finished.stderr
    assert_exactly_once_by_index(run_dir, rows)
    ledger = {r["prompt_index"] for p in run_dir.glob("batch_*.jsonl") for r in read_jsonl(p)}
    assert {f["prompt_index"] for f in budget} <= ledger  # the stopped sessions ran again


def assert_exactly_once_by_index(run_dir: Path, rows: int) -> None:
    records = read_jsonl(run_dir / "trajectories.jsonl") + [
        line["record"] for line in read_jsonl(run_dir / "rejected.jsonl")
    ]
    assert sorted(r["prompt_index"] for r in records) == list(range(rows))


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


def test_a_spend_file_keeps_the_last_whole_line_and_stays_small(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(invocation_module, "SPEND_LINES", 10)
    path = RunDir(tmp_path).spend_path("r-1-2")
    path.parent.mkdir()
    spend = invocation_module.SpendFile(path)
    for answer in range(1, 26):
        assert spend.write(
            {"requests": answer, "prompt_tokens": 100 * answer, "completion_tokens": 0, "cost": 0.5 * answer}
        )
    spend.log.close()
    assert len(path.read_text().splitlines()) <= 10  # rewritten as its last line now and then
    assert RunDir(tmp_path).spend() == {
        "r-1-2": {"requests": 25, "prompt_tokens": 2500, "completion_tokens": 0, "cost": 12.5}
    }
    with path.open("ab") as handle:
        handle.write(b'{"requests": 26, "prompt_tok')  # a kill in the middle of a line
    assert RunDir(tmp_path).spend()["r-1-2"]["requests"] == 25
    (tmp_path / "spend" / "r-3-4.jsonl").write_text(
        '{"requests": 2, "prompt_tokens": 1, "completion_tokens": 1, "cost": 1.0}\n'
    )
    invocations = [
        {"run_id": "r-1-2", "model_client": {"requests": 3, "cost": 99.0}},  # its spend file says more
        {"model_client": {"requests": 4, "prompt_tokens": 0, "completion_tokens": 0, "cost": 2.0}},  # served
    ]
    assert RunDir(tmp_path).spent(invocations) == {
        "requests": 31,
        "prompt_tokens": 2501,
        "completion_tokens": 1,
        "cost": 15.5,
    }
