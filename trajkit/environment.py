"""The agent as a reinforcement-learning environment: rollouts of dataset rows, scored in their sandbox.

Built from a run's settings (toolsets or a distribution, the sandbox backend, the scorers), with
the same resolution as ``trajkit run``::

    async with Environment(distribution="terminal_only", sandbox="local") as env:
        rollouts = await env.rollout({"prompt": "...", "check": "test -f out.txt"},
                                     Policy(base_url=URL, model="policy"), samples=8)
        [r.score.value for r in rollouts]

A trainer that makes the model call itself drives one session a step at a time::

    async with env.stepper() as episode:
        messages, tools = await episode.reset(row)
        while True:
            tool_messages, done = await episode.step(my_model(messages, tools))
            if done:
                break
            messages += [assistant_message, *tool_messages]
        score = await episode.score()

Every sandbox is closed however its rollout ends; a sandbox that fails is an error of its rollout
alone (:attr:`Rollout.error`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trajkit.agent import ConversationResult, run_conversation
from trajkit.config.resolve import resolve
from trajkit.manager import PluginHost, load_plugins
from trajkit.model import AssistantMessage, Message, ModelClient, ModelError
from trajkit.model.stepping import StepClient
from trajkit.run.attempt import build_session, score_result
from trajkit.run.dataset import DatasetRow
from trajkit.sandbox import Sandbox, SandboxBackend, SandboxError, SandboxSpec
from trajkit.sandbox.check_files import CheckFile
from trajkit.tools import (
    Tool,
    ToolRun,
    ToolSession,
    close_session,
    flat_tools,
    open_toolsets,
    session_tools,
)
from trajkit.tools.offer import resolve as resolve_offer

log = logging.getLogger("trajkit")


@dataclass(frozen=True)
class Policy:
    """An OpenAI-compatible endpoint to roll out against."""

    base_url: str
    model: str
    api_key: str | None = None


@dataclass(frozen=True)
class Score:
    """What the scorers that apply to a row say of one session."""

    passed: bool
    value: float
    checks: list[dict[str, Any]]

    @classmethod
    def of(cls, record: Mapping[str, Any] | None) -> Score | None:
        if record is None:
            return None
        return cls(bool(record["passed"]), float(record["value"]), list(record["checks"]))


@dataclass
class Rollout:
    """One session of a row: its conversation and score, or the error that ended it."""

    row: dict[str, Any]
    sample: int
    result: ConversationResult | None = None
    score: Score | None = None
    """None when no scorer applies to the row, or the rollout failed."""
    error: str | None = None
    """``error_class: message`` when the session failed (the model, the sandbox, a timeout)."""
    tools: list[dict[str, Any]] = field(default_factory=list)
    """The schemas of the tools offered."""

    @property
    def messages(self) -> list[Message]:
        return self.result.messages if self.result is not None else []


class Environment:
    """Sessions of dataset rows with a run's toolsets, sandboxes and scorers; async, reusable
    across rollouts; :meth:`close` (or ``async with``) when done."""

    def __init__(
        self,
        *,
        concurrency: int = 16,
        plugins: PluginHost | None = None,
        seed: int | None = None,
        **settings: Any,
    ) -> None:
        """``settings``: any setting of a run by name (``toolsets=["terminal"]``,
        ``distribution="development"``, ``sandbox="docker"``, ``max_turns=8``, ``check_timeout=30``,
        ``sandbox_options={"docker": {...}}``), validated as ``trajkit run`` validates it.
        ``concurrency``: sessions running at once across every rollout of this environment."""
        self.host = plugins or load_plugins()
        self.settings = dict(settings)
        self.config = resolve(self.host, {"quiet": True, **settings})
        self.offer = resolve_offer(self.config, self.host)
        self.toolsets = [self.host.toolsets[name] for name in self.offer.distribution.drawn()]
        self.tools: dict[str, Tool] = {t.name: t for ts in self.toolsets for t in ts.tools}
        self.scorers = [cls() for _, cls in sorted(self.host.scorers.items())]
        self.run_id = f"env-{uuid.uuid4().hex[:8]}"
        self.random = random.Random(seed)
        self.concurrency = concurrency
        self.limit = asyncio.Semaphore(concurrency)
        self.tool_run = ToolRun(self.config)
        self.backends: dict[str, SandboxBackend] = {}
        self._opened = False
        self._lock = asyncio.Lock()
        self._count = 0

    async def __aenter__(self) -> Environment:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Start the toolsets (done on first use too)."""
        async with self._lock:
            if not self._opened:
                self.tool_run = await open_toolsets(self.toolsets, self.config)
                self._opened = True

    async def close(self) -> None:
        """Close the toolsets and the backends, removing any sandbox of this environment left."""
        try:
            await self.tool_run.aclose()
        finally:
            for name, backend in self.backends.items():
                try:
                    await backend.reap(self.run_id)
                    await backend.aclose()
                except Exception as exc:
                    log.warning("%s: cleanup failed: %s", name, exc)
            self.backends.clear()
            self._opened = False

    def client(self, policy: Policy | ModelClient) -> ModelClient:
        """A model client for ``policy``, with this environment's model settings (retries, timeouts)."""
        if isinstance(policy, ModelClient):
            return policy
        # the client's connection pool follows num_workers: sized for the sessions that run at once
        given = {
            "num_workers": self.concurrency,
            **self.settings,
            "model": policy.model,
            "base_url": policy.base_url,
        }
        if policy.api_key is not None:
            given["api_key"] = policy.api_key
        config = resolve(self.host, {"quiet": True, **given}, toolsets=False)  # its toolsets are open
        return self.host.model_client(config.model).from_config(config)

    async def rollout(
        self,
        row: Mapping[str, Any] | DatasetRow,
        policy: Policy | ModelClient,
        *,
        samples: int = 1,
        check_files: Sequence[CheckFile] = (),
    ) -> list[Rollout]:
        """``samples`` sessions of ``row`` against ``policy``, each in a fresh sandbox, scored;
        in sample order. A failed session is a :class:`Rollout` with its ``error``.
        ``check_files``: the row's check files as a run resolves them
        (:func:`trajkit.sandbox.check_files.resolve`), put in the sandbox before the checks."""
        client = self.client(policy)
        try:
            sessions = (self._one(row, client, k, check_files) for k in range(samples))
            return list(await asyncio.gather(*sessions))
        finally:
            if client is not policy:
                await client.aclose()

    async def _one(
        self,
        row: Mapping[str, Any] | DatasetRow,
        client: ModelClient,
        sample: int,
        check_files: Sequence[CheckFile] = (),
    ) -> Rollout:
        fields = row_fields(row)
        async with self.limit:
            rollout = Rollout(fields, sample)
            try:
                async with self.sandbox(fields) as (sandbox, tools, tool_session):
                    rollout.tools = [tool.schema() for tool in tools.values()]
                    session = build_session(self.config, client, sandbox, tools, self.tools, tool_session)
                    async with asyncio.timeout(self.config.prompt_timeout):
                        rollout.result = await run_conversation(session, fields["prompt"])
                        scored = await score_result(
                            self.scorers, fields, rollout.result, sandbox, self.config, check_files
                        )
                    rollout.score = Score.of(scored)
            except TimeoutError:
                rollout.error = f"prompt_timeout: no result within {self.config.prompt_timeout:g}s"
            except (ModelError, SandboxError) as exc:
                rollout.error = f"{exc.error_class}: {exc}"
            return rollout

    @contextlib.asynccontextmanager
    async def sandbox(self, row: Mapping[str, Any]) -> Any:
        """A fresh sandbox for ``row`` with the tools drawn for it and a session of theirs, all
        closed on exit however it is left."""
        await self.open()
        backend = await self._backend(row.get("backend") or self.config.sandbox)
        self._count += 1
        spec = SandboxSpec(
            run_id=self.run_id,
            work_id=str(self._count),
            image=row.get("image"),
            cwd=row.get("cwd"),
            lifetime=min(self.config.sandbox_lifetime, self.config.prompt_timeout + 120),
        )
        drawn = self.offer.distribution.sample(self.random)
        sandbox: Sandbox = await backend.create(spec)
        tool_session = ToolSession(self.tool_run)
        try:
            toolsets = (self.host.toolsets[name] for name in sorted(drawn))
            offered = await session_tools(toolsets, tool_session, sandbox, spec.work_id)
            yield sandbox, flat_tools(offered), tool_session
        finally:
            await asyncio.shield(close_session(tool_session, sandbox))

    async def _backend(self, name: str) -> SandboxBackend:
        async with self._lock:
            if name not in self.backends:
                self.backends[name] = self.host.backend(name)(self.config.sandbox_options.get(name))
            return self.backends[name]

    def stepper(self) -> Stepper:
        """One session driven by the caller's model calls (see the module's example)."""
        return Stepper(self)


def row_fields(row: Mapping[str, Any] | DatasetRow) -> dict[str, Any]:
    """A dataset row, validated as a run validates it, as the scorers see it."""
    valid = row if isinstance(row, DatasetRow) else DatasetRow.model_validate(dict(row))
    return valid.model_dump()


class Stepper:
    """One session of a row where the caller plays the model: :meth:`reset`, then :meth:`step`
    with each assistant message until ``done``, :meth:`score`, :meth:`close`. The agent loop runs
    as in a rollout (tool calls run in the row's sandbox, ids deduplicated, ``max_turns`` kept);
    the caller's message is its model reply."""

    def __init__(self, env: Environment) -> None:
        self.env = env
        self.row: dict[str, Any] = {}
        self.client = StepClient()
        self.result: ConversationResult | None = None
        self._exits = contextlib.AsyncExitStack()
        self._sandbox: Sandbox | None = None
        self._task: asyncio.Task[ConversationResult] | None = None
        self._seen = 0

    async def __aenter__(self) -> Stepper:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def reset(self, row: Mapping[str, Any] | DatasetRow) -> tuple[list[Message], list[dict[str, Any]]]:
        """Open a sandbox for ``row``; the messages the model is to answer and the tools offered."""
        await self.close()
        self.row = row_fields(row)
        self.client = StepClient()
        sandbox, tools, tool_session = await self._exits.enter_async_context(self.env.sandbox(self.row))
        self._sandbox = sandbox
        session = build_session(self.env.config, self.client, sandbox, tools, self.env.tools, tool_session)
        self._task = asyncio.create_task(run_conversation(session, self.row["prompt"]))
        messages, schemas = await self._next()
        assert messages is not None, "the conversation ended before the first model call"
        self._seen = len(messages)
        return list(messages), list(schemas)

    async def step(self, message: AssistantMessage | Mapping[str, Any]) -> tuple[list[Message], bool]:
        """Answer the pending model call with ``message``; the tool messages it produced, and
        whether the session is over (an answer without tool calls, or ``max_turns`` reached)."""
        if self._task is None:
            raise RuntimeError("reset() first")
        if self._task.done():
            return [], True
        self.client.answer(message)
        messages, _ = await self._next()
        if messages is None:
            return [], True
        new = [m for m in messages[self._seen :] if m.get("role") == "tool"]
        self._seen = len(messages)
        return new, False

    async def _next(self) -> tuple[list[Message] | None, list[dict[str, Any]]]:
        """The next model request of the conversation, or None when it ended (raising its error)."""
        assert self._task is not None
        request = asyncio.ensure_future(self.client.request())
        await asyncio.wait({request, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if request.done():
            return request.result()
        request.cancel()
        self.result = self._task.result()
        return None, []

    async def score(self) -> Score | None:
        """The score of the session so far (the sandbox as it is now); None when no scorer applies."""
        if self._sandbox is None:
            raise RuntimeError("reset() first")
        result = self.result or ConversationResult(None, [], 0, False, self.client.usage)
        scored = await score_result(self.env.scorers, self.row, result, self._sandbox, self.env.config)
        return Score.of(scored)

    async def close(self) -> None:
        """Stop the session and close its sandbox (idempotent)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        self._task = None
        self._sandbox = None
        await self._exits.aclose()


__all__: Sequence[str] = ("Environment", "Policy", "Rollout", "Score", "Stepper")
