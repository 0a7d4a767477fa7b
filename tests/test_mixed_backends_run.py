"""One dataset whose rows run on local, Docker and Singularity sandboxes, routed per row."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from tests.helpers import read_jsonl, trajkit, write_jsonl
from trajkit.testing.engines import need_engine
from trajkit.testing.openai_server import OpenAITestServer
from trajkit.testing.policies import dialect_policy

BUSYBOX = "trajkit-test/busybox:latest"
SIF = Path(os.environ.get("TRAJKIT_APPTAINER_IMAGES", "/var/lib/trajkit-apptainer/images")) / "busybox.sif"


def docker_missing() -> str | None:
    try:
        import docker

        import trajkit_docker  # noqa: F401

        client = docker.from_env(timeout=30)
        client.images.get(BUSYBOX)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def apptainer_missing() -> str | None:
    try:
        import trajkit_singularity  # noqa: F401
    except ImportError:
        return "trajkit_singularity is not installed"
    if not shutil.which("apptainer"):
        return "no apptainer binary (bash scripts/engines/apptainer.sh start)"
    return None if SIF.exists() else f"{SIF} is missing (bash scripts/engines/apptainer.sh images)"


def live_instances() -> list[str]:
    listing = subprocess.run(["apptainer", "instance", "list"], capture_output=True, text=True, timeout=60)
    return [line.split()[0] for line in listing.stdout.splitlines()[1:] if line.startswith("trajkit-")]


def test_local_docker_and_singularity_rows_in_one_run(tmp_path: Path) -> None:
    need_engine("docker", docker_missing())
    need_engine("apptainer", apptainer_missing())
    before = set(live_instances())
    rows: list[dict[str, Any]] = []
    for i in range(4):
        rows.append({"prompt": f"on the host {i}"})
        rows.append({"prompt": f"in docker {i}", "image": BUSYBOX})
        rows.append({"prompt": f"in a sif {i}", "image": str(SIF)})  # owned by singularity: routed there
        rows.append(
            {"prompt": f"named backend {i}", "image": str(SIF), "backend": "singularity", "cwd": "/data"}
        )
    dataset = write_jsonl(tmp_path / "p.jsonl", rows)
    with OpenAITestServer(dialect_policy) as server:
        result = trajkit(
            "run", "--dataset_file", str(dataset), "--run_name", "mixed", "--output_dir", str(tmp_path),
            "--model", "m", "--base_url", server.base_url, "--distribution", "terminal_only",
            "--num_workers", "8", "--sandbox_option", "docker.pull=never", "--quiet",
            "--sandbox_option", f"singularity.cache_dir={tmp_path / 'sif-cache'}",
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    records = read_jsonl(tmp_path / "mixed" / "trajectories.jsonl")
    assert len(records) == 16
    seen = {
        (r["conversations"][1]["value"].rsplit(" ", 1)[0], r["sandbox"]["backend"], r["sandbox"]["image"])
        for r in records
    }
    assert seen == {
        ("on the host", "local", None),
        ("in docker", "docker", BUSYBOX),
        ("in a sif", "singularity", str(SIF)),
        ("named backend", "singularity", str(SIF)),
    }
    assert all(r["sandbox"]["digest"] for r in records if r["sandbox"]["backend"] != "local")
    assert set(live_instances()) <= before, "an instance was left behind"
