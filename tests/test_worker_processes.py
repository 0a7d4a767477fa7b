"""The local executor's worker processes (``--processes N``): a run's sessions on several cores.

Against the real test model server, through the real CLI: the records are those the runner's own
event loop makes; more than ``SESSIONS_PER_PROCESS`` sessions in flight take worker processes by
themselves; a worker killed mid-run loses nothing and runs nothing twice; a runner interrupted
or killed leaves no worker and no sandbox behind; ``--max_cost`` and the request limits hold for
the whole run, not per worker; what a worker cannot do (a plugin registered by hand, an endpoint
it cannot reach) stops the run before any session, with the error the runner's own loop gives.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import read_jsonl, trajkit, write_jsonl
from tests.test_model_misconfig import closed_port, one_error
from trajkit import hookimpl
from trajkit.config.resolve import resolve
from trajkit.manager import load_plugins
from trajkit.model.shared_limiter import LostHolder, SharedLimiter
from trajkit.plugins.local_executor import SESSIONS_PER_PROCESS, auto_processes
from trajkit.run.executor import combined_statistics
from trajkit.run.runner import Runner
from trajkit.testing.openai_server import OpenAITestServer
from trajkit.testing.policies import dialect_policy

PRICE = 0.25


def ledger(run_dir: Path) -> list[dict[str, Any]]:
    return [record for path in sorted(run_dir.glob("batch_*.jsonl")) for record in read_jsonl(path)]


def ledger_lines(run_dir: Path) -> int:
    """Records in the ledger so far (read while the run appends: its last line may be partial)."""
    return sum(path.read_bytes().count(b"\n") for path in run_dir.glob("batch_*.jsonl"))


def stable(record: dict[str, Any]) -> str:
    """A record without what differs between two runs of the same plan (times, duration, sandbox)."""
    metadata = {k: v for k, v in record["metadata"].items() if k != "timestamp"}
    text = json.dumps({**record, "metadata": metadata, "duration_s": None, "sandbox": None})
    return re.sub(r"\b\d\d:\d\d\b", "HH:MM", text)  # the times `ls -l` shows


def workers_of(pid: int) -> list[int]:
    """The worker processes a runner started (its children running the worker module)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == pid and b"trajkit.plugins.local_executor.worker" in command:
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def sandboxes_in(root: Path) -> list[Path]:
    """The sandboxes under a backend's root (not its own dot files)."""
    return [path for path in root.iterdir() if not path.name.startswith(".")]


def inherited_sockets(pid: int) -> list[str]:
    """The sockets of a process that a program it starts would inherit (no close-on-exec)."""
    found = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            flags = int((Path(f"/proc/{pid}/fdinfo") / fd.name).read_text().split("flags:")[1].split()[0], 8)
            if os.readlink(fd).startswith("socket:") and not flags & 0o2000000:
                found.append(fd.name)
    return found


def run_args(tmp_path: Path, dataset: Path, name: str, base_url: str, *more: str, root: Path) -> list[str]:
    return [
        "run", "--dataset_file", str(dataset), "--run_name", name, "--output_dir", str(tmp_path),
        "--model", "m", "--base_url", base_url, "--quiet",
        "--sandbox_option", f"local.root={root}", *more,
    ]  # fmt: skip


def test_worker_processes_make_the_records_the_local_executor_makes(
    tmp_path: Path, sandbox_root: Path
) -> None:
    rows = [{"prompt": f"task {i}", "topic": "t"} for i in range(12)]
    dataset = write_jsonl(tmp_path / "d.jsonl", rows)
    with OpenAITestServer(dialect_policy) as server:
        local = trajkit(
            *run_args(tmp_path, dataset, "local", server.base_url, "--num_workers", "4", root=sandbox_root)
        )
        assert local.returncode == 0, local.stderr
        server.reset()
        result = trajkit(
            *run_args(tmp_path, dataset, "processes", server.base_url, "--num_workers", "4", root=sandbox_root),
            "--processes", "2", "--verbose",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        requests = server.count
    first = read_jsonl(tmp_path / "local" / "trajectories.jsonl")
    second = read_jsonl(tmp_path / "processes" / "trajectories.jsonl")
    assert [stable(r) for r in second] == [stable(r) for r in first]
    statistics = json.loads((tmp_path / "processes" / "statistics.json").read_text())
    assert statistics["model_client"]["requests"] == requests  # summed over both workers
    manifest = json.loads((tmp_path / "processes" / "run.json").read_text())
    assert manifest["config"]["executor_options"] == {"local": {"processes": 2}}
    # the workers' log records reach the run's log; what both said while starting, once
    assert result.stderr.count("has no model list") == 1, result.stderr
    assert "2 worker processes run the sessions, up to 4 in flight" in result.stderr
    assert not sandboxes_in(sandbox_root)


def test_a_worker_killed_mid_run_loses_nothing_and_runs_nothing_twice(
    tmp_path: Path, sandbox_root: Path
) -> None:
    rows, limit = 200, 4
    dataset = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"job {i}"} for i in range(rows)])
    run_dir = tmp_path / "r"
    killed: list[int] = []
    most_before_the_kill: list[int] = []

    def kill_a_worker_midway(runner: subprocess.Popen[str]) -> None:
        deadline = time.monotonic() + 60
        while ledger_lines(run_dir) < rows // 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        workers = workers_of(runner.pid)
        killed.append(ledger_lines(run_dir))
        most_before_the_kill.append(server.max_in_flight)
        os.kill(workers[0], signal.SIGKILL)
        # The killed worker's requests stay open at the server until their answers are written,
        # while the run hands their permits to the other worker at once: the limit is on the
        # run's own requests, so the most in flight is counted again once those have ended
        # (only that figure of the server's is read after its reset).
        time.sleep(1.0)
        server.reset()

    with OpenAITestServer(dialect_policy, latency=0.03, keep_requests=False) as server:
        args = run_args(tmp_path, dataset, "r", server.base_url, "--num_workers", "20", root=sandbox_root)
        runner = subprocess.Popen(
            [sys.executable, "-m", "trajkit", *args, "--processes", "2",
             "--max_concurrent_requests", str(limit)],
            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        killer = threading.Thread(target=kill_a_worker_midway, args=(runner,), daemon=True)
        killer.start()
        _, stderr = runner.communicate(timeout=120)
        killer.join(5)
    assert runner.returncode == 0, stderr[-4000:]
    assert killed and killed[0] < rows, "the worker was killed before the run ended"

    records = ledger(run_dir)
    assert sorted(Counter(r["work_id"] for r in records).values()) == [1] * rows
    trajectories = read_jsonl(run_dir / "trajectories.jsonl")
    assert [t["prompt_index"] for t in trajectories] == list(range(rows))
    lost = [f for f in read_jsonl(run_dir / "failures.jsonl") if f["error_class"] == "worker_lost"]
    assert lost, stderr[-4000:]
    assert "go to the other workers" in stderr
    assert not sandboxes_in(sandbox_root)  # the dead worker's reaped by the other
    # One limit for the whole run, not one per worker: before the kill and after it.
    assert max(most_before_the_kill[0], server.max_in_flight) <= limit


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL], ids=["interrupted", "killed"])
def test_a_runner_that_stops_leaves_no_worker_and_no_sandbox(
    tmp_path: Path, sandbox_root: Path, how: signal.Signals
) -> None:
    rows = 8
    dataset = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"job {i}"} for i in range(rows)])
    with OpenAITestServer(dialect_policy, latency=1.0) as server:
        args = [*run_args(tmp_path, dataset, "r", server.base_url, "--num_workers", "8", root=sandbox_root),
                "--distribution", "terminal_only", "--processes", "2"]  # fmt: skip
        runner = subprocess.Popen(
            [sys.executable, "-m", "trajkit", *args],
            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(sandboxes_in(sandbox_root)) < rows:
            time.sleep(0.05)  # every session has its sandbox: they are all in flight
        workers = workers_of(runner.pid)
        assert len(workers) == 2 and len(sandboxes_in(sandbox_root)) >= rows, runner.stderr
        # the pipe to the runner reaches no program a worker starts (a sandbox could write to it)
        assert [inherited_sockets(pid) for pid in workers] == [[], []]
        runner.send_signal(how)
        _, stderr = runner.communicate(timeout=60)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (any(map(alive, workers)) or sandboxes_in(sandbox_root)):
            time.sleep(0.05)
        assert not any(map(alive, workers)), stderr[-4000:]
        assert not sandboxes_in(sandbox_root), stderr[-4000:]

        result = trajkit(*args, "--resume")  # what was not finished runs now, nothing twice
    assert result.returncode == 0, result.stderr
    assert sorted(Counter(r["work_id"] for r in ledger(tmp_path / "r")).values()) == [1] * rows
    assert [t["prompt_index"] for t in read_jsonl(tmp_path / "r" / "trajectories.jsonl")] == list(range(rows))


def priced(body: dict[str, Any]) -> dict[str, Any]:
    return {**dialect_policy(body), "_usage": {"prompt_tokens": 100, "completion_tokens": 10, "cost": PRICE}}


def test_max_cost_holds_for_the_whole_run(tmp_path: Path, sandbox_root: Path) -> None:
    rows = 40
    dataset = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"task {i}"} for i in range(rows)])
    with OpenAITestServer(priced, latency=0.05) as server:
        args = run_args(tmp_path, dataset, "r", server.base_url, "--num_workers", "4", root=sandbox_root)
        result = trajkit(*args, "--processes", "2", "--max_cost", "1")
    assert result.returncode == 1, result.stderr
    assert "--max_cost 1 reached" in result.stderr
    statistics = json.loads((tmp_path / "r" / "statistics.json").read_text())
    assert 1 <= statistics["done"] <= 8, statistics  # those in flight at the limit finish, no more
    counted = json.loads((tmp_path / "r" / "run.json").read_text())["invocations"][-1]["model_client"]
    assert counted["cost"] == PRICE * counted["requests"] == statistics["spent"]["cost"]


def test_a_plugin_registered_in_this_process_alone_stops_the_run_before_any_session(tmp_path: Path) -> None:
    class Plugin:
        @hookimpl
        def trajkit_run_start(self, run: Any, pending: int) -> None:
            pass

    dataset = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "task"}])
    with OpenAITestServer(dialect_policy) as server:
        host = load_plugins(extra=[("by_hand", Plugin())])
        config = resolve(host, {
            "dataset_file": str(dataset), "run_name": "r", "output_dir": str(tmp_path), "quiet": True,
            "executor_options": {"local": {"processes": 2}}, "base_url": server.base_url, "model": "m",
        })  # fmt: skip
        runner = Runner(config, host)
        with pytest.raises(RuntimeError, match="registered in this process alone: by_hand"):
            asyncio.run(runner.run())
        assert server.requests == []


def test_an_unreachable_endpoint_is_the_one_error_of_the_runner_s_own_loop(
    tmp_path: Path, sandbox_root: Path
) -> None:
    port = closed_port()
    dataset = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "task"}])
    result = trajkit(
        *run_args(tmp_path, dataset, "r", f"http://127.0.0.1:{port}/v1", root=sandbox_root),
        "--processes",
        "2",
    )
    assert one_error(result) == f"error: cannot connect to 127.0.0.1:{port}: Connection refused"


async def test_the_shared_limiter_refuses_a_lost_holder_and_takes_back_its_permits() -> None:
    """Permits per holder; a lost holder gets no more, and what it held comes back as it
    releases it or after the grace period."""
    limiter = SharedLimiter()
    limiter.configure(3, None, None)
    limiter.configure(50, None, None)  # the first configuration stands
    for _ in range(3):
        await limiter.acquire("a", 0)
    waiting = asyncio.ensure_future(limiter.acquire("b", 0))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # three permits at most, for the whole run
    assert await limiter.forget("a", 0.2) == 3  # "a" was lost
    with pytest.raises(LostHolder):
        await limiter.acquire("a", 0)  # its process, still running, may send nothing more
    await limiter.release("a", True)  # a request it had sent has ended
    await asyncio.wait_for(waiting, 1)
    assert limiter.state()["held"] == {"a": 2, "b": 1}
    await asyncio.sleep(0.3)  # the grace period is over: the rest are free again
    assert limiter.state()["held"] == {"b": 1}
    assert limiter.state()["active"] == 1
    await limiter.release("a", True)  # a late release from the lost holder changes nothing
    assert limiter.state()["active"] == 1


def test_counters_of_several_processes_add_up_but_the_shared_limiter_s() -> None:
    parts = [
        {"requests": 3, "cost": 0.5, "throttled": 2, "limiter_wait_s": 0.1234, "model": "m"},
        {"requests": 4, "cost": 0.25, "throttled": 2, "limiter_wait_s": 0.1, "model": "m"},
    ]
    assert combined_statistics(parts) == {
        "requests": 7, "cost": 0.75, "throttled": 2, "limiter_wait_s": 0.223, "model": "m",
    }  # fmt: skip


def test_many_sessions_in_flight_take_worker_processes_unless_a_plugin_was_registered_by_hand() -> None:
    cpus = len(os.sched_getaffinity(0))
    installed = load_plugins()
    assert auto_processes(SESSIONS_PER_PROCESS, installed) == 0  # one process's worth: the runner's loop
    assert auto_processes(1000, installed) == (min(cpus, 8) if cpus > 1 else 0)
    assert auto_processes(100_000, installed) == (cpus if cpus > 1 else 0)

    class Plugin:
        @hookimpl
        def trajkit_run_start(self, run: Any, pending: int) -> None:
            pass

    assert auto_processes(1000, load_plugins(extra=[("by_hand", Plugin())])) == 0
    registered_later = load_plugins()
    registered_later.pm.register(Plugin(), name="later")
    assert auto_processes(1000, registered_later) == 0
