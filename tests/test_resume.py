"""Exactly once: killed runs resume to exactly one trajectory per row, failures are retried.

Every test drives the real CLI in a subprocess against the project's HTTP test server.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import plugin_env, read_jsonl, trajkit, write_jsonl
from trajkit.run.ledger import read_jsonl as ledger_lines
from trajkit.testing.openai_server import OpenAITestServer
from trajkit.testing.policies import dialect_policy

# Kills its own process with SIGKILL at a chosen moment: right after the Nth record reaches the
# ledger, or in the middle of writing the merged output.
KILLER_PLUGIN = """
    import os, signal
    from trajkit import hookimpl
    from trajkit.record.writers import OutputWriter

    finished = 0

    @hookimpl
    def trajkit_trajectory_finished(run, record, rejection):
        global finished
        finished += 1
        if finished == int(os.environ.get("KILL_AFTER_RECORDS", "-1")):
            os.kill(os.getpid(), signal.SIGKILL)

    class DyingWriter(OutputWriter):
        name = "dying"
        filename = "dying.jsonl"

        def write(self, records, path):
            with open(path, "w") as out:
                for count, record in enumerate(records):
                    out.write("x\\n")
                    out.flush()
                    if count == int(os.environ.get("KILL_IN_MERGE_AT", "-1")):
                        os.kill(os.getpid(), signal.SIGKILL)
            return count

    @hookimpl
    def trajkit_writers():
        return [DyingWriter]
"""


def rows(count: int = 24) -> list[dict[str, Any]]:
    dataset: list[dict[str, Any]] = [{"prompt": f"Task number {i} [dialect:think]"} for i in range(count)]
    dataset += [dict(dataset[1]), dict(dataset[1]), dict(dataset[5])]
    return dataset


@pytest.fixture
def killer_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a ``trajkit`` subprocess with the killer plugin installed."""
    return plugin_env(tmp_path, "killer", KILLER_PLUGIN)


def run_args(dataset: Path, out: Path, server: OpenAITestServer, *extra: str) -> list[str]:
    return [
        "run", "--dataset_file", str(dataset), "--run_name", "r", "--output_dir", str(out),
        "--model", "m", "--base_url", server.base_url, "--num_workers", "4", "--batch_size", "4",
        "--quiet", *extra,
    ]  # fmt: skip


def assert_exactly_once(run_dir: Path, dataset: list[dict[str, Any]]) -> None:
    records = read_jsonl(run_dir / "trajectories.jsonl")
    assert [r["prompt_index"] for r in records] == list(range(len(dataset)))
    assert Counter(r["conversations"][1]["value"] for r in records) == Counter(d["prompt"] for d in dataset)
    ledger = [r for p in run_dir.glob("batch_*.jsonl") for r in ledger_lines(p)]
    assert len({r["work_id"] for r in ledger}) == len(ledger) == len(dataset), "a prompt completed twice"
    stats = json.loads((run_dir / "statistics.json").read_text())
    assert (stats["done"], stats["pending"], stats["kept"]) == (len(dataset), 0, len(dataset))


def sessions_started(server: OpenAITestServer) -> Counter[str]:
    """Conversations the server saw begin, by prompt text."""
    started: Counter[str] = Counter()
    for request in server.requests:
        messages = request.body["messages"]
        if not any(m["role"] == "assistant" for m in messages):
            started[next(m["content"] for m in messages if m["role"] == "user")] += 1
    return started


KILL_POINTS = [
    {"KILL_AFTER_RECORDS": "1"},
    {"KILL_AFTER_RECORDS": "2"},
    {"KILL_AFTER_RECORDS": "5"},
    {"KILL_AFTER_RECORDS": "9"},
    {"KILL_AFTER_RECORDS": "16"},
    {"KILL_AFTER_RECORDS": "27"},  # the last record: killed before the merge
    {"KILL_IN_MERGE_AT": "0"},
    {"KILL_IN_MERGE_AT": "13"},
    {"TIMED_KILL": "0.3"},
    {"TIMED_KILL": "0.9"},
    {"TIMED_KILL": "1.6"},
    {"KILL_AFTER_RECORDS": "11", "TORN_WRITE": "1"},
]


def test_sigkill_at_many_moments_then_resume_gives_exactly_one_per_row(
    tmp_path: Path, killer_env: dict[str, str]
) -> None:
    dataset = rows()
    path = write_jsonl(tmp_path / "prompts.jsonl", dataset)
    server = OpenAITestServer(dialect_policy, latency=0.03)
    with server:
        for round_number, point in enumerate(KILL_POINTS):
            out = tmp_path / f"round{round_number}"
            env = {**killer_env, **{k: v for k, v in point.items() if k.startswith("KILL_")}}
            writers = ["--writer", "sharegpt", "--writer", "dying"] if "KILL_IN_MERGE_AT" in point else []
            server.reset()
            if "TIMED_KILL" in point:
                killed = run_killed_after(float(point["TIMED_KILL"]), run_args(path, out, server), env)
                assert killed
            else:
                first = trajkit(*run_args(path, out, server, *writers), env=env, subprocess=True)
                assert first.returncode == -signal.SIGKILL, (point, first.stderr)
            if "TORN_WRITE" in point:
                tear_last_ledger_line(out / "r")
            resumed = trajkit(*run_args(path, out, server, "--resume"), env=killer_env, subprocess=True)
            assert resumed.returncode == 0, (point, resumed.stderr)
            assert_exactly_once(out / "r", dataset)
            # A prompt is only started again if it was in flight when the process died.
            waste = sum(sessions_started(server).values()) - len(dataset)
            assert 0 <= waste <= 4 + 1, (point, waste)


def run_killed_after(delay: float, args: list[str], env: dict[str, str]) -> bool:
    full_env = {**os.environ, **env}
    process = subprocess.Popen([sys.executable, "-m", "trajkit", *args], env=full_env, stderr=subprocess.PIPE)
    time.sleep(delay)
    alive = process.poll() is None
    process.kill()
    process.wait()
    return alive or process.returncode == 0


def tear_last_ledger_line(run_dir: Path) -> None:
    """Leave the ledger as a kill in the middle of a write would: a last line cut short."""
    last = max(run_dir.glob("batch_*.jsonl"), key=lambda p: int(p.stem.split("_")[1]))
    data = last.read_bytes()
    last.write_bytes(data[: len(data) - 40])


def test_reordered_and_edited_dataset_resumes_correctly(tmp_path: Path) -> None:
    original = [{"prompt": f"item {i}"} for i in range(6)] + [{"prompt": "item 0"}]
    path = write_jsonl(tmp_path / "p.jsonl", original)
    server = OpenAITestServer(dialect_policy)
    with server:
        assert trajkit(*run_args(path, tmp_path, server, "--max_samples", "4")).returncode == 0
        edited = [original[3], {"prompt": "new one"}, original[0], original[6], original[5], original[1]]
        write_jsonl(path, edited)
        server.reset()
        more = ["--max_samples", "6", "--allow_change", "max_samples"]
        result = trajkit(*run_args(path, tmp_path, server, "--resume", *more))
        assert result.returncode == 0, result.stderr
        # item 3, item 0 and item 1 were done; "new one", the second "item 0" and item 5 were not.
        assert sorted(sessions_started(server)) == ["item 0", "item 5", "new one"]
    records = read_jsonl(tmp_path / "r" / "trajectories.jsonl")
    assert [r["conversations"][1]["value"] for r in records] == [row["prompt"] for row in edited]
    assert [r["prompt_index"] for r in records] == list(range(6))


class Flaky:
    """Fails the first ``fails`` sessions of prompts marked [flaky], every session of [doomed] ones."""

    def __init__(self, fails: int) -> None:
        self.fails = fails
        self.seen: Counter[str] = Counter()
        self.lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = next(m["content"] for m in body["messages"] if m["role"] == "user")
        first_turn = not any(m["role"] == "assistant" for m in body["messages"])
        with self.lock:
            if first_turn:
                self.seen[prompt] += 1
            count = self.seen[prompt]
        if "[doomed]" in prompt or ("[flaky]" in prompt and count <= self.fails):
            return {"_status": 503, "_error": f"upstream overloaded (session {count})"}
        return dialect_policy(body)


def test_failures_are_retried_and_the_doomed_are_reported(tmp_path: Path) -> None:
    dataset = [{"prompt": "steady"}, {"prompt": "wobbly [flaky]"}, {"prompt": "lost cause [doomed]"}]
    path = write_jsonl(tmp_path / "p.jsonl", dataset)
    policy = Flaky(fails=2)
    server = OpenAITestServer(policy)
    with server:
        args = run_args(path, tmp_path, server, "--max_retries", "0", "--retry_backoff", "0.05")
        result = trajkit(*args)
    assert result.returncode == 1
    assert "--resume" in result.stderr
    records = read_jsonl(tmp_path / "r" / "trajectories.jsonl")
    assert [r["conversations"][1]["value"] for r in records] == ["steady", "wobbly [flaky]"]
    assert records[1]["attempt"] == 3
    failures = read_jsonl(tmp_path / "r" / "failures.jsonl")
    assert Counter(f["prompt_index"] for f in failures) == {1: 2, 2: 3}
    assert {f["error_class"] for f in failures} == {"api_error"}
    assert "503" in failures[-1]["message"] and "upstream overloaded" in failures[-1]["message"]
    stats = json.loads((tmp_path / "r" / "statistics.json").read_text())
    assert stats["failures"]["failing_by_class"] == {"api_error": 1}
    assert stats["failures"]["failed_attempts"] == 5
    assert stats["pending"] == 1

    status = trajkit("status", str(tmp_path / "r"))
    assert "pending            1" in status.stdout and "failing            1" in status.stdout

    # The next --resume retries only what is still missing.
    with OpenAITestServer(dialect_policy) as healthy:  # another endpoint: a change allowed explicitly
        result = trajkit(*run_args(path, tmp_path, healthy, "--resume", "--allow_change", "base_url"))
        assert result.returncode == 0, result.stderr
        assert list(sessions_started(healthy)) == ["lost cause [doomed]"]


def test_ctrl_c_closes_live_sandboxes_and_leaves_a_consistent_run(tmp_path: Path, sandbox_root: Path) -> None:
    dataset = [{"prompt": f"slow task {i}"} for i in range(12)]
    path = write_jsonl(tmp_path / "p.jsonl", dataset)
    sandboxes = sandbox_root / "sandboxes"
    server = OpenAITestServer(dialect_policy, latency=1.0)
    with server:
        args = run_args(path, tmp_path, server, "--sandbox_option", f"local.root={sandboxes}")
        process = subprocess.Popen(
            [sys.executable, "-m", "trajkit", *args], stderr=subprocess.PIPE, text=True
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(list(sandboxes.glob("[!.]*"))) < 4:
            time.sleep(0.05)
        assert len(list(sandboxes.glob("[!.]*"))) == 4, "sessions should be in flight"
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
        assert process.returncode == 130, stderr
        assert "--resume" in stderr
        assert list(sandboxes.glob("[!.]*")) == []
        run_dir = tmp_path / "r"
        stats = json.loads((run_dir / "statistics.json").read_text())
        assert stats["done"] + stats["pending"] == 12 and stats["pending"] > 0
        assert len(read_jsonl(run_dir / "trajectories.jsonl")) == stats["done"]
        server.latency = 0.0
        resumed = trajkit(*run_args(path, tmp_path, server, "--resume"))
        assert resumed.returncode == 0, resumed.stderr
    assert_exactly_once(run_dir, dataset)


def test_prompt_timeout_is_a_failure_with_its_class(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "too slow"}])
    with OpenAITestServer(dialect_policy, latency=3.0) as server:
        result = trajkit(*run_args(path, tmp_path, server, "--prompt_timeout", "0.5", "--max_attempts", "1"))
    assert result.returncode == 1
    failures = read_jsonl(tmp_path / "r" / "failures.jsonl")
    assert [f["error_class"] for f in failures] == ["prompt_timeout"]
