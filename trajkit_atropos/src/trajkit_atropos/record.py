"""``--env.record_dir``: every rollout a trajectory in a trajkit run directory, written as
``trajkit serve --record`` writes served sessions (its lock, ledger, merges), with the group's
id, the sample and the score, so ``trajkit status``, ``stats`` and ``export`` read RL rollouts as
they read any run."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trajkit.environment import Environment, Rollout
from trajkit.record.secrets import Scrubber, environment_secrets
from trajkit.run.ledger import records
from trajkit.run.plan import filters, run_tools, writers
from trajkit.serve.recorder import Recorder

ROW_KEYS = frozenset({"prompt", "image", "cwd", "backend"})
"""A row's fields that are the session's; the others travel to the record's metadata."""
MERGE_INTERVAL = 30.0
"""Seconds between merges of the run directory's outputs while rollouts come in."""


class RolloutRecorder:
    def __init__(self, env: Environment, record_dir: Path, model: str) -> None:
        config = env.config.model_copy(
            update={"output_dir": record_dir.parent, "run_name": record_dir.name, "model": model}
        )
        self.env = env
        host = env.host
        scrubber = Scrubber([*config.secret_values(), *environment_secrets()])
        self.recorder = Recorder(
            config,
            run_tools(env.offer.distribution, host),
            filters(config, host),
            writers(config, host),
            scrubber,
            MERGE_INTERVAL,
        )

    def open(self, client_statistics: Callable[[], dict[str, Any]]) -> None:
        """Hold the run directory (on the event loop that records); ``client_statistics`` gives
        the model clients' counters for ``run.json``."""
        self.recorder.open(self.env.host, client_statistics)

    def recorded_groups(self, group_size: int) -> set[str]:
        """The ids of the groups whose every rollout the run directory holds already."""
        counts = Counter(
            str(record["metadata"].get("group_id"))
            for record in records(self.recorder.index)
            if record.get("metadata", {}).get("group_id")
        )
        return {group for group, count in counts.items() if count >= group_size}

    def record(self, rollout: Rollout, group_id: str, duration_s: float) -> None:
        assert rollout.result is not None
        host = self.env.host
        offered = {schema["function"]["name"] for schema in rollout.tools}
        called = {name for name, stat in rollout.result.tool_stats.items() if stat.count}
        toolsets = sorted(name for name, ts in host.toolsets.items() if offered & {t.name for t in ts.tools})
        used = sorted(name for name in toolsets if called & {t.name for t in host.toolsets[name].tools})
        prompt = [{"role": "user", "content": rollout.row["prompt"]}]
        row_fields = {k: v for k, v in rollout.row.items() if k not in ROW_KEYS}
        self.recorder.record(
            rollout.result, prompt, toolsets, used, rollout.tools, duration_s,
            rollout.row.get("backend") or self.env.config.sandbox, f"{group_id}.{rollout.sample}",
            score=None if rollout.score is None else dataclasses.asdict(rollout.score),
            metadata={**row_fields, "served": False, "group_id": group_id, "sample": rollout.sample},
        )  # fmt: skip

    async def close(self) -> None:
        await self.recorder.close()
