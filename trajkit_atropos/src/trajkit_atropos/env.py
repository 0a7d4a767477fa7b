"""The Atropos environment: a trajkit dataset's rows as items, each group ``group_size`` trajkit
sessions of one row against the inference server Atropos hands out, scored by trajkit's scorers
in the row's sandbox, tokenized with the policy's tokenizer and chat template.

``python -m trajkit_atropos serve|process|evaluate`` with Atropos's flags (``--env.*``,
``--openai.*``) and trajkit's (``--env.dataset_file``, ``--env.toolsets``, ...); the manual is
``docs/atropos.md``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

from atroposlib.envs.base import BaseEnv, ScoredDataGroup
from atroposlib.envs.server_handling.server_baseline import APIServerConfig

from trajkit.environment import Environment, Policy, Rollout
from trajkit.model import ModelClient
from trajkit_atropos.config import TrajkitEnvConfig, TrajkitEnvError, trajkit_settings
from trajkit_atropos.items import DatasetItems, GroupItem
from trajkit_atropos.record import RolloutRecorder
from trajkit_atropos.tokens import Renderer, RenderingError, Tokenized, policy_template

log = logging.getLogger("trajkit")

FAILED_GROUPS_IN_A_ROW = 8
"""Groups that fail one after another before the environment stops (the policy or the sandboxes
are down: going on would only spin)."""


class TrajkitEnv(BaseEnv):
    name = "trajkit"
    env_config_cls = TrajkitEnvConfig

    def __init__(
        self, config: TrajkitEnvConfig, server_configs: Any, slurm: bool = False, testing: bool = False
    ):
        super().__init__(config, server_configs, slurm, testing)
        self.config: TrajkitEnvConfig = config
        self.next_position = 0
        """The next group in the stream (restored from Atropos's checkpoints on restart)."""
        self.done: set[str] = set()
        """Groups rolled out in this process, or recorded in ``--env.record_dir`` before: never again."""
        self.running: set[str] = set()
        self.failed_in_a_row = 0
        self.environment: Environment | None = None
        self.items: DatasetItems | None = None
        self.renderer: Renderer | None = None
        self.recorder: RolloutRecorder | None = None
        self.clients: dict[int, ModelClient] = {}

    @classmethod
    def config_init(cls) -> tuple[TrajkitEnvConfig, list[APIServerConfig]]:
        # a list of APIServerConfig, not a ServerBaseline: `process` then takes --openai.* as given
        return TrajkitEnvConfig(), [APIServerConfig()]

    # -- lifecycle ---------------------------------------------------------------------------------

    async def setup(self) -> None:
        """Resolve the trajkit settings, read the dataset, fit the chat template, open the run directory."""
        if not self.config.dataset_file:
            raise TrajkitEnvError(
                "--env.dataset_file is required: the trajkit dataset whose rows are the items"
            )
        self.environment = Environment(
            concurrency=self.config.concurrency, seed=self.config.seed, **trajkit_settings(self.config)
        )
        self.items = DatasetItems(
            self.environment.config,
            self.environment.host,
            self.config.dataset_file,
            self.config.wandb_name or str(self.name),
        )
        unscored = [
            item.line
            for item, row in zip(self.items.items, self.items.rows, strict=True)
            if not any(scorer.applies(row) for scorer in self.environment.scorers)
        ]
        if unscored:
            lines = ", ".join(map(str, unscored[:10]))
            raise TrajkitEnvError(
                f"{self.config.dataset_file}: rows without a check or an answer cannot be scored "
                f"(line {lines}{', ...' if len(unscored) > 10 else ''})"
            )
        self.renderer = Renderer(policy_template(self.tokenizer, self.config.chat_template), self.tokenizer)
        if self.config.record_dir:
            model = self.server.servers[0].config.model_name if self.server.servers else "policy"
            self.recorder = RolloutRecorder(self.environment, Path(self.config.record_dir), model)
            self.recorder.open(self.client_statistics)
            self.done |= self.recorder.recorded_groups(self.config.group_size)
        await self.environment.open()
        log.info(
            "%d rows of %s, %d groups recorded before",
            len(self.items),
            self.config.dataset_file,
            len(self.done),
        )

    async def env_manager(self) -> None:
        try:
            await super().env_manager()
        finally:
            await self.teardown()

    async def process_manager(self) -> None:
        try:
            await super().process_manager()
        finally:
            await self.teardown()

    async def teardown(self) -> None:
        """Close the model clients, the run directory and every sandbox left."""
        try:
            if self.recorder is not None:  # first: its last entry in run.json reads the clients' counters
                await self.recorder.close()
                self.recorder = None
            for client in self.clients.values():
                await client.aclose()
            self.clients.clear()
        finally:
            if self.environment is not None:
                await self.environment.close()

    def save_checkpoint(self, step: int, data: dict[str, Any] | None = None) -> None:
        """Atropos's checkpoint, with where the stream of groups stands."""
        super().save_checkpoint(step, {"next_position": self.next_position} if data is None else data)

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        """No held-out split: evaluate a checkpoint with ``trajkit run`` and ``trajkit compare``."""
        return None

    # -- groups ------------------------------------------------------------------------------------

    async def get_next_item(self) -> GroupItem:
        assert self.items is not None, "setup() first"
        while True:
            item = self.items.at(self.next_position)
            self.next_position += 1
            if item.group_id not in self.done and item.group_id not in self.running:
                return item

    async def collect_trajectories(self, item: GroupItem) -> tuple[ScoredDataGroup | None, list[Any]]:
        """``group_size`` sessions of the item's row, scored and tokenized; None when one failed
        (its reason logged) or the group was rolled out already."""
        if item.group_id in self.done or item.group_id in self.running:
            return None, []
        self.running.add(item.group_id)
        try:
            rollouts = await asyncio.gather(*(self._rollout(item, k) for k in range(self.config.group_size)))
        finally:
            self.running.discard(item.group_id)
        self.done.add(item.group_id)
        failures = [r.error or "no score" for r in rollouts if r.error is not None or r.score is None]
        if failures:
            return self._failed(item, f"{len(failures)} of {len(rollouts)} sessions failed: {failures[0]}")
        try:
            group = self._group(item, rollouts)
        except RenderingError as exc:
            return self._failed(item, f"cannot be tokenized: {exc}")
        self.failed_in_a_row = 0
        return group, []

    async def _rollout(self, item: GroupItem, sample: int) -> Rollout:
        assert self.environment is not None
        async with self.server.dedicated_server() as server:
            started = time.monotonic()
            client = self._client(server)
            (rollout,) = await self.environment.rollout(item.row, client, check_files=item.check_files)
        rollout.sample = sample
        if self.recorder is not None and rollout.result is not None:
            self.recorder.record(rollout, item.group_id, time.monotonic() - started)
        return rollout

    def _client(self, server: Any) -> ModelClient:
        """One model client per inference server, with the trajkit settings' retries and timeouts."""
        assert self.environment is not None
        if id(server) not in self.clients:
            config = server.config
            policy = Policy(base_url=config.base_url, model=config.model_name, api_key=config.api_key or None)
            self.clients[id(server)] = self.environment.client(policy)
        return self.clients[id(server)]

    def client_statistics(self) -> dict[str, Any]:
        """The model clients' counters (requests, tokens, cost...), summed over the servers."""
        total: dict[str, Any] = {}
        for client in self.clients.values():
            for key, value in client.statistics().items():
                if isinstance(value, int | float):
                    total[key] = total.get(key, 0) + value
        return total

    def _group(self, item: GroupItem, rollouts: list[Rollout]) -> ScoredDataGroup:
        """The scored rollouts of a group as Atropos takes them."""
        assert self.renderer is not None
        tokenized: list[Tokenized] = [self.renderer.tokenize(r.messages, r.tools) for r in rollouts]
        return ScoredDataGroup(
            tokens=[t.tokens for t in tokenized],
            masks=[t.masks for t in tokenized],
            scores=[r.score.value for r in rollouts if r.score is not None],
            advantages=None,
            ref_logprobs=None,
            messages=[t.messages for t in tokenized] if self.config.include_messages else None,
            group_overrides={"group_id": item.group_id},
            overrides=[{"rollout_id": f"{item.group_id}.{r.sample}"} for r in rollouts],
            images=None,
        )

    def _failed(self, item: GroupItem, reason: str) -> tuple[None, list[Any]]:
        self.failed_in_a_row += 1
        log.warning("group %s (row %s) left out: %s", item.group_id, item.work_id, reason)
        if self.failed_in_a_row >= FAILED_GROUPS_IN_A_ROW:
            raise TrajkitEnvError(f"{self.failed_in_a_row} groups in a row failed; the last: {reason}")
        return None, []
