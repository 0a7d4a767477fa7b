"""Whole runs that mix local and Docker rows on a real engine: routing, image checks, no leaks."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import read_jsonl, trajkit, write_jsonl
from trajkit.testing.engines import need_engine
from trajkit.testing.openai_server import OpenAITestServer
from trajkit.testing.policies import dialect_policy

BUSYBOX = "trajkit-test/busybox:latest"
MISSING = "trajkit-test/does-not-exist:nope"


def _docker_client() -> Any:
    import docker

    return docker.from_env(timeout=30)


def _why_unavailable() -> str | None:
    try:
        import trajkit_docker  # noqa: F401

        client = _docker_client()
        client.ping()
        client.images.get(BUSYBOX)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc} (bash scripts/engines/docker.sh start && ... images)"
    return None


@pytest.fixture(scope="module")
def docker_client() -> Any:
    need_engine("docker", _why_unavailable())
    return _docker_client()


# Run names unique to this test session: the engine is shared with whatever else runs tests on the
# machine, and containers are found by run name.
MIXED = f"mixed-{uuid.uuid4().hex[:8]}"
ORPHANS = f"orphans-{uuid.uuid4().hex[:8]}"
CHURN = f"churn-{uuid.uuid4().hex[:8]}"


def containers_of(client: Any, run_name: str) -> list[str]:
    """The ids of this run's containers, from one listing: another test's container that vanishes
    meanwhile is no concern of ours (inspecting each listed container would fail on it)."""
    listed = client.api.containers(all=True, filters={"label": "trajkit=1"})
    return [
        c["Id"] for c in listed if (c.get("Labels") or {}).get("trajkit.run", "").startswith(f"{run_name}-")
    ]


def run_args(dataset: Path, out: Path, base_url: str, run_name: str, *extra: str) -> list[str]:
    return [
        "run", "--dataset_file", str(dataset), "--run_name", run_name, "--output_dir", str(out),
        "--model", "m", "--base_url", base_url, "--distribution", "terminal_only", "--num_workers", "8",
        "--sandbox_option", "docker.pull=never", "--quiet", *extra,
    ]  # fmt: skip


def test_listing_a_run_s_containers_survives_others_vanishing(docker_client: Any) -> None:
    """The engine is shared: other tests' containers come and go while ours are listed."""
    stop = threading.Event()
    churned: list[str] = []

    def churn() -> None:  # containers of a run of this test's own, made and removed at once
        while not stop.is_set():
            box = docker_client.containers.create(
                BUSYBOX, "true", labels={"trajkit": "1", "trajkit.run": f"{CHURN}-0"}
            )
            churned.append(box.id)
            box.remove(force=True)

    thread = threading.Thread(target=churn)
    thread.start()
    try:
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline and thread.is_alive():
            assert containers_of(docker_client, MIXED) == []
    finally:
        stop.set()
        thread.join()
    assert len(churned) >= 2 and containers_of(docker_client, CHURN) == []


def test_mixed_local_and_docker_rows_with_one_bad_image(tmp_path: Path, docker_client: Any) -> None:
    rows: list[dict[str, Any] | str] = []
    for i in range(10):
        rows.append({"prompt": f"local task {i}"})
        rows.append({"prompt": f"container task {i}", "image": BUSYBOX, "cwd": "/srv/app"})
    rows.append({"prompt": "needs an image nobody has", "image": MISSING})
    dataset = write_jsonl(tmp_path / "p.jsonl", rows)
    server = OpenAITestServer(dialect_policy)
    with server:
        result = trajkit(*run_args(dataset, tmp_path, server.base_url, MIXED))
    assert result.returncode == 1, result.stderr
    assert "needs an image nobody has" not in json.dumps([r.body for r in server.requests])

    run_dir = tmp_path / MIXED
    records = read_jsonl(run_dir / "trajectories.jsonl")
    assert len(records) == 20
    by_backend = {r["conversations"][1]["value"]: r["sandbox"] for r in records}
    for i in range(10):
        assert by_backend[f"local task {i}"]["backend"] == "local"
        docker_sandbox = by_backend[f"container task {i}"]
        assert (docker_sandbox["backend"], docker_sandbox["image"]) == ("docker", BUSYBOX)
        assert docker_sandbox["digest"]
    in_container = next(r for r in records if r["conversations"][1]["value"] == "container task 0")
    tool_results = [t["value"] for t in in_container["conversations"] if t["from"] == "tool"]
    assert "notes.txt" in tool_results[1] and "Task: container task 0" in tool_results[2]

    failures = read_jsonl(run_dir / "failures.jsonl")
    assert [(f["prompt_index"], f["error_class"]) for f in failures] == [(20, "image_unavailable")]
    assert MISSING in failures[0]["message"]
    assert containers_of(docker_client, MIXED) == []


def test_the_reaper_removes_containers_of_a_killed_run(tmp_path: Path, docker_client: Any) -> None:
    rows: list[dict[str, Any] | str] = [
        {"prompt": f"slow container task {i}", "image": BUSYBOX} for i in range(6)
    ]
    dataset = write_jsonl(tmp_path / "p.jsonl", rows)
    delay = {"seconds": 1.5}  # slow while the run is killed, quick for the resume
    server = OpenAITestServer(dialect_policy, latency=lambda _body: delay["seconds"])
    with server:
        args = run_args(dataset, tmp_path, server.base_url, ORPHANS)
        process = subprocess.Popen([sys.executable, "-m", "trajkit", *args], stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and len(containers_of(docker_client, ORPHANS)) < 6:
                time.sleep(0.2)
            orphans = set(containers_of(docker_client, ORPHANS))
            assert len(orphans) == 6, "containers should be alive while sessions are in flight"
        finally:
            os.kill(process.pid, signal.SIGKILL)  # also when the wait failed: leave no run behind
            process.wait()
        time.sleep(0.5)
        assert set(containers_of(docker_client, ORPHANS)) == orphans, "SIGKILL leaves them"

        delay["seconds"] = 0.0
        resumed = trajkit(*run_args(dataset, tmp_path, server.base_url, ORPHANS, "--resume"))
    assert resumed.returncode == 0, resumed.stderr
    # At least ours: the reaper also removes what other killed runs on the same engine left.
    reaped = re.search(r"removed (\d+) sandboxes left behind", resumed.stderr)
    assert reaped is not None and int(reaped.group(1)) >= 6, resumed.stderr
    assert containers_of(docker_client, ORPHANS) == []
    assert len(read_jsonl(tmp_path / ORPHANS / "trajectories.jsonl")) == 6


UNUSABLE_PATH_STEPS: list[tuple[str, dict[str, Any]]] = [
    ("read_file", {"path": "bad\0name.txt"}),
    ("write_file", {"path": "x" * 8000, "content": "x"}),
    ("patch", {"path": "dir/" + "n" * 300, "old_string": "a", "new_string": "b"}),
    ("write_file", {"path": "caf\udce9.txt", "content": "x"}),
    ("terminal", {"command": "echo still here"}),
]


def test_paths_no_engine_takes_are_tool_errors_not_failed_attempts(
    tmp_path: Path, docker_client: Any
) -> None:
    """A file tool's path with a NUL byte or 8,000 characters used to fail the whole attempt
    (``sandbox_error``, three attempts, the row pending, paid again by every resume), and the error
    in failures.jsonl named the engine's overlay directory on the host."""
    from tests.test_hostile_run import make_policy

    name = f"paths-{uuid.uuid4().hex[:8]}"
    dataset = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "[hostile] odd paths", "image": BUSYBOX}])
    server = OpenAITestServer(make_policy(UNUSABLE_PATH_STEPS))
    with server:
        result = trajkit(*run_args(dataset, tmp_path, server.base_url, name))
    assert result.returncode == 0, result.stderr
    run_dir = tmp_path / name
    [record] = read_jsonl(run_dir / "trajectories.jsonl")
    assert record["attempt"] == 1 and record["completed"]
    told = [turn["value"] for turn in record["conversations"] if turn["from"] == "tool"]
    assert len(told) == len(UNUSABLE_PATH_STEPS)
    for message in told[:-1]:
        assert message.startswith("Error: cannot "), message
        assert len(message) < 600
    assert "still here" in told[-1]
    assert record["tool_stats"]["read_file"] == {"count": 1, "success": 0, "failure": 1}
    assert not (run_dir / "failures.jsonl").exists() or read_jsonl(run_dir / "failures.jsonl") == []
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert b"overlay2" not in path.read_bytes(), path
    assert containers_of(docker_client, name) == []
