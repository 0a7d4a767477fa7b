"""A whole run routed to Modal (the SDK-surface fake): creation paced, every sandbox terminated."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import read_jsonl, write_jsonl
from trajkit import hookimpl
from trajkit.config.resolve import resolve
from trajkit.manager import load_plugins
from trajkit.run.runner import Runner
from trajkit.sandbox import SandboxBackend
from trajkit.testing.openai_server import OpenAITestServer
from trajkit.testing.policies import dialect_policy

modal_backend = pytest.importorskip("trajkit_modal.backend", reason="trajkit_modal is not installed")
modal_testing = pytest.importorskip("trajkit_modal.testing", reason="trajkit_modal is not installed")


def test_fifty_prompts_on_modal_with_paced_creation(tmp_path: Path) -> None:
    fake = modal_testing.FakeModal(tmp_path / "cloud")
    rate, burst = 25.0, 4

    class FakeModalBackend(modal_backend.ModalBackend):  # type: ignore[name-defined]
        def __init__(self, options: Mapping[str, object] | None = None) -> None:
            super().__init__(options, sdk=fake)

    class Plugin:
        @hookimpl
        def trajkit_sandbox_backends(self) -> list[type[SandboxBackend]]:
            return [FakeModalBackend]

    host = load_plugins(blocked={"modal"}, extra=[("fake-modal", Plugin())])
    rows: list[dict[str, Any] | str] = [
        {"prompt": f"task {i}", "image": "python:3.11-slim", "backend": "modal"} for i in range(50)
    ]
    dataset = write_jsonl(tmp_path / "p.jsonl", rows)
    with OpenAITestServer(dialect_policy) as server:
        config = resolve(host, dict(
            dataset_file=dataset, run_name="modal", output_dir=tmp_path, model="m", base_url=server.base_url,
            num_workers=50, quiet=True, distribution="file_only",
            sandbox_options={"modal": {"create_rate": str(rate), "create_burst": str(burst)}},
        ))  # fmt: skip
        outcome = asyncio.run(Runner(config, host).run())
    assert outcome.exit_code == 0
    records = read_jsonl(tmp_path / "modal" / "trajectories.jsonl")
    assert len(records) == 50
    assert {(r["sandbox"]["backend"], r["sandbox"]["image"]) for r in records} == {
        ("modal", "python:3.11-slim")
    }
    times = sorted(fake.cloud.create_attempts)
    assert len(times) == 50
    for first in range(50):
        for last in range(first, 50):
            assert last - first + 1 <= burst + rate * (times[last] - times[first]) + 1
    assert fake.cloud.live() == []
    assert fake.cloud.leftovers({"trajkit": "1"}) == []
    asyncio.run(fake.aclose())
