"""The ``ray`` executor (trajkit_ray): sessions in Ray actors over a cluster's nodes.

The fault test starts a cluster of its own (``ray.cluster_utils.Cluster``: a head that runs no
sessions and three worker nodes, all on this machine) and kills a worker node while a few hundred
prompts run against the test model server: every row gets exactly one trajectory, no sandbox is
left, and the request limit holds for the whole run at the server. Without Ray these tests skip,
and fail where ``TRAJKIT_REQUIRE_ENGINES`` asks for ray (CI).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import read_jsonl, trajkit, write_jsonl
from trajkit.cli import run_params
from trajkit.config.resolve import resolve
from trajkit.config.run_config import RunConfig
from trajkit.manager import PluginError, load_plugins
from trajkit.run.runner import Runner
from trajkit.testing.engines import need_engine
from trajkit.testing.openai_server import OpenAITestServer
from trajkit.testing.policies import dialect_policy

RAY_MISSING = (
    None
    if importlib.util.find_spec("ray") and importlib.util.find_spec("trajkit_ray")
    else "ray or trajkit-ray is not installed (pip install -e ./trajkit_ray)"
)
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


def ray_driver(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``trajkit ARGS`` in a process of its own: a run with the Ray executor is a Ray driver, and
    Ray keeps process-wide state after ``ray.shutdown()`` (its log files open, PYTHONBREAKPOINT set)."""
    return trajkit(*args, env=env, timeout=timeout, subprocess=True)


FAST_NODE_DEATH = {
    # A killed node is noticed in about a second instead of 13 or 14 (REFERENCE §G).
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 200,
    "health_check_timeout_ms": 500,
    "health_check_failure_threshold": 3,
}


@pytest.fixture
def ray_env(monkeypatch: pytest.MonkeyPatch) -> None:
    need_engine("ray", RAY_MISSING)
    for name, value in RAY_ENV.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def cluster(ray_env: None) -> Iterator[tuple[Any, list[Any]]]:
    """A head that runs no sessions (no CPU) and three worker nodes of one CPU each."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "include_dashboard": False, "_system_config": FAST_NODE_DEATH},
    )
    try:
        workers = [cluster.add_node(num_cpus=1) for _ in range(3)]
        cluster.wait_for_nodes()
        yield cluster, workers
    finally:
        cluster.shutdown()


def ledger_lines(run_dir: Path) -> int:
    return sum(len(path.read_text().splitlines()) for path in run_dir.glob("batch_*.jsonl"))


def test_a_worker_node_killed_mid_run_loses_nothing_and_runs_nothing_twice(
    tmp_path: Path, cluster: tuple[Any, list[Any]]
) -> None:
    head, workers = cluster
    rows = 300
    limit = 6
    dataset = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"job {i}"} for i in range(rows)])
    sandboxes = tmp_path / "sandboxes"
    run_dir = tmp_path / "r"
    killed: list[float] = []

    def kill_a_node_midway() -> None:
        deadline = time.monotonic() + 120
        while ledger_lines(run_dir) < rows // 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        killed.append(ledger_lines(run_dir))
        head.remove_node(workers[0], allow_graceful=False)

    key = "k-handed-to-every-node"  # the nodes started without it: the executor hands it over
    server = OpenAITestServer(dialect_policy, latency=0.03, keep_requests=False, api_key=key)
    with server:
        killer = threading.Thread(target=kill_a_node_midway, daemon=True)
        killer.start()
        result = ray_driver(
            "run", "--dataset_file", str(dataset), "--run_name", "r", "--output_dir", str(tmp_path),
            "--model", "m", "--base_url", server.base_url, "--quiet",
            "--executor", "ray", "--ray_address", head.address, "--ray.actors_per_node", "1",
            "--ray.batch_wait", "0.01", "--ray.poll_interval", "0.5", "--ray.lost_permits_after", "30",
            "--num_workers", "30", "--max_concurrent_requests", str(limit),
            "--sandbox_option", f"local.root={sandboxes}", "--sandbox_option", "local.isolation=none",
            env={**RAY_ENV, "OPENAI_API_KEY": key}, timeout=240,
        )  # fmt: skip
        killer.join(timeout=5)
    assert result.returncode == 0, result.stderr[-4000:]
    assert killed and killed[0] < rows, "the node was killed before the run ended"

    # exactly one record per row in the ledger, one trajectory per row in the dataset
    ledger = [record for path in sorted(run_dir.glob("batch_*.jsonl")) for record in read_jsonl(path)]
    assert sorted(Counter(r["work_id"] for r in ledger).values()) == [1] * rows
    trajectories = read_jsonl(run_dir / "trajectories.jsonl")
    assert [t["prompt_index"] for t in trajectories] == list(range(rows))

    # the lost node's sessions ran again elsewhere, and said so
    lost = [f for f in read_jsonl(run_dir / "failures.jsonl") if f["error_class"] == "node_lost"]
    assert lost, result.stderr[-4000:]
    assert {f["prompt_index"] for f in lost} <= {t["prompt_index"] for t in trajectories}
    assert "lost" in result.stderr

    # no sandbox left (the dead node's were reaped by the survivors, on this machine's one disk)
    assert not sandboxes.exists() or not any(sandboxes.iterdir())

    # the request limit held for the whole run, not per actor
    assert server.max_in_flight == limit
    statistics = json.loads((run_dir / "statistics.json").read_text())
    assert statistics["model_client"]["requests"] >= server.count - len(lost) * 10


PRICE = 0.25
"""Dollars the test endpoint charges for every answer."""


def priced(body: dict[str, Any]) -> dict[str, Any]:
    return {**dialect_policy(body), "_usage": {"prompt_tokens": 100, "completion_tokens": 10, "cost": PRICE}}


def test_without_an_address_the_run_starts_a_ray_of_its_own_and_holds_to_max_cost(
    tmp_path: Path, ray_env: None
) -> None:
    rows = 40
    dataset = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"task {i}"} for i in range(rows)])
    with OpenAITestServer(priced, latency=0.05) as server:
        args = [
            "run", "--dataset_file", str(dataset), "--run_name", "local", "--output_dir", str(tmp_path),
            "--model", "m", "--base_url", server.base_url, "--quiet", "--num_workers", "4",
        ]  # fmt: skip
        result = ray_driver(
            *args, "--executor", "ray", "--ray.local_cpus", "1", "--max_cost", "1", env=RAY_ENV
        )
        assert result.returncode == 1, result.stderr[-4000:]
        assert "--max_cost 1 reached" in result.stderr
        statistics = json.loads((tmp_path / "local" / "statistics.json").read_text())
        # the sessions in flight when the answers crossed the limit finish; no new one starts
        assert 1 <= statistics["done"] <= 8, statistics
        manifest = json.loads((tmp_path / "local" / "run.json").read_text())
        assert manifest["config"]["executor"] == "ray"
        counted = manifest["invocations"][-1]["model_client"]  # summed over the actors
        assert counted["cost"] == PRICE * counted["requests"] == statistics["spent"]["cost"]

        # the rest with the local executor (a change of the run's settings, allowed): every row once
        more = ["--executor", "local", "--allow_change", "executor", "--max_cost", "1000"]
        result = ray_driver(*args, "--resume", *more, env=RAY_ENV)
    assert result.returncode == 0, result.stderr[-4000:]
    trajectories = read_jsonl(tmp_path / "local" / "trajectories.jsonl")
    assert [t["prompt_index"] for t in trajectories] == list(range(rows))


def test_the_address_has_a_flag_of_its_own_and_a_configuration_key() -> None:
    need_engine("ray", RAY_MISSING)
    host = load_plugins()
    config = resolve(host, {"executor": "ray", "executor_options": {"ray": {"address": "HEAD:6379"}}})
    assert config.executor_options["ray"].address == "HEAD:6379"
    flags = {option for param in run_params(host) for option in param.opts}
    assert {"--ray_address", "--ray.actors_per_node"} <= flags
    assert "--ray.address" not in flags


def test_without_the_package_the_error_says_what_to_install(tmp_path: Path) -> None:
    host = load_plugins(entry_points=False)
    config = RunConfig(dataset_file=tmp_path / "d.jsonl", run_name="x", output_dir=tmp_path, executor="ray")
    with pytest.raises(
        PluginError, match=r"executor 'ray' is not installed: pip install \./trajkit_ray from the root"
    ):
        Runner(config, host)


def test_container_rows_run_in_docker_on_the_actor_s_node(tmp_path: Path, ray_env: None) -> None:
    """Sessions under the ray executor take their rows' backends on the node that runs them:
    local rows in local sandboxes, image rows in Docker containers, none left after the run."""
    from tests.test_docker_run import BUSYBOX, _why_unavailable, containers_of

    need_engine("docker", _why_unavailable())
    import docker

    client = docker.from_env(timeout=30)
    run_name = f"ray-docker-{time.monotonic_ns() % 10**8}"
    rows: list[dict[str, Any] | str] = []
    for i in range(6):
        rows.append({"prompt": f"local task {i}"})
        rows.append({"prompt": f"container task {i}", "image": BUSYBOX, "cwd": "/srv/app"})
    dataset = write_jsonl(tmp_path / "p.jsonl", rows)
    with OpenAITestServer(dialect_policy) as server:
        result = ray_driver(
            "run", "--dataset_file", str(dataset), "--run_name", run_name, "--output_dir", str(tmp_path),
            "--model", "m", "--base_url", server.base_url, "--distribution", "terminal_only", "--quiet",
            "--num_workers", "4", "--sandbox_option", "docker.pull=never",
            "--executor", "ray", "--ray.local_cpus", "2", env=RAY_ENV,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    records = read_jsonl(tmp_path / run_name / "trajectories.jsonl")
    assert [r["prompt_index"] for r in records] == list(range(len(rows)))
    backends = Counter((r["sandbox"]["backend"], r["sandbox"]["image"]) for r in records)
    assert backends == {("local", None): 6, ("docker", BUSYBOX): 6}
    assert all(r["tool_stats"]["terminal"]["count"] >= 1 for r in records)
    assert containers_of(client, run_name) == []
