"""The session function: one attempt of one work item, and the retries of one invocation.

:class:`Sessions` is built from a :class:`~trajkit.run.executor.SessionPlan` and the plugins installed
where it runs (this process for the ``local`` executor, a worker elsewhere for others). It holds
the model client and the sandbox backends for the life of the run and knows nothing of the run
directory: what an attempt produces goes back to the runner through a
:class:`~trajkit.run.executor.Driver`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from trajkit.agent import ConversationResult, Session, run_conversation
from trajkit.manager import PluginHost
from trajkit.model import ModelClient, ModelError
from trajkit.model.ratelimit import session_deadline
from trajkit.model.retry import backoff_delay
from trajkit.record.scorers import ScoreContext, Scorer, score_session
from trajkit.record.trajectory import record_json
from trajkit.run.executor import Attempts, Failed, Finished, SessionPlan, WorkOrder
from trajkit.sandbox import ImageUnavailable, Sandbox, SandboxBackend, SandboxError, SandboxSpec
from trajkit.tools import (
    Tool,
    ToolRun,
    ToolSession,
    close_session,
    close_tools,
    flat_tools,
    open_toolsets,
    session_tools,
)
from trajkit.tools.catalog import tool_schemas_key
from trajkit.tools.distributions import rng_for

if TYPE_CHECKING:
    from trajkit.config.run_config import RunConfig
    from trajkit.sandbox.check_files import CheckFile

log = logging.getLogger("trajkit")


class SessionFailure(Exception):
    def __init__(
        self,
        error_class: str,
        message: str,
        *,
        retryable: bool = True,
        stops_run: bool = False,
        permanent: bool = False,
    ):
        super().__init__(message)
        self.error_class = error_class
        self.retryable = retryable and not permanent
        self.stops_run = stops_run
        self.permanent = permanent


class Sessions:
    """The model client, the backends and the tools of one run, where its sessions run."""

    def __init__(self, plan: SessionPlan, host: PluginHost) -> None:
        self.plan = plan
        self.config = plan.config
        self.host = host
        self.client: ModelClient | None = None
        self.tool_run = ToolRun(plan.config)
        self.backends: dict[str, SandboxBackend] = {}
        self.digests: dict[tuple[str, str], str | None] = {}
        self.image_failures: dict[tuple[str, str], str] = {}
        self.offers: dict[tuple[str, ...], tuple[dict[str, Tool], str, list[dict[str, Any]]]] = {}
        """Toolsets drawn -> (the tools last offered, the key of their schemas, the schemas)."""
        self.scorers = [cls() for _, cls in sorted(host.scorers.items())]
        self.reported: set[str] = set()
        """Schema keys already handed back with a record."""

    async def open(self) -> None:
        """Check the model client, start the plan's backends and verify its images."""
        self.client = self.host.model_client(self.config.model).from_config(self.config)
        await self.client.check()  # a wrong URL, key or model stops the run here, before any sandbox
        drawn = [self.host.toolsets[name] for name in self.plan.distribution.drawn()]
        self.tool_run = await open_toolsets(drawn, self.config, self.host)
        for name in self.plan.backends:
            backend = self.host.backend(name)(self.config.sandbox_options.get(name))
            self.backends[name] = backend
            reaped = await backend.reap()
            if reaped:
                log.info("%s: removed %d sandboxes left behind by earlier runs", name, reaped)
        await asyncio.gather(*(self._verify(backend, image) for backend, image in self.plan.images))

    async def _verify(self, backend_name: str, image: str) -> None:
        try:
            self.digests[(backend_name, image)] = await self.backends[backend_name].verify_image(image)
        except ImageUnavailable as exc:
            self.image_failures[(backend_name, image)] = str(exc)
            log.error("image %s unavailable on %s: %s", image, backend_name, exc)
        except Exception as exc:
            self.image_failures[(backend_name, image)] = f"{type(exc).__name__}: {exc}"
            log.error("image %s could not be verified on %s: %s", image, backend_name, exc)

    def statistics(self) -> dict[str, Any]:
        return self.client.statistics() if self.client is not None else {}

    def spent(self) -> float:
        return self.client.spent() if self.client is not None else 0.0

    def listen(self, listener: Callable[[], None] | None) -> None:
        """Have ``listener`` called as each model answer is counted (:meth:`ModelClient.listen`)."""
        assert self.client is not None, "Sessions.open() first"
        self.client.listen(listener)

    async def close(self) -> None:
        """Close the client, reap this run's sandboxes and close the backends."""
        if self.client is not None:
            await self.client.aclose()
        try:
            await self.tool_run.aclose()
        except Exception as exc:
            log.warning("toolsets: closing failed: %s", exc)
        for name, backend in self.backends.items():
            try:
                await backend.reap(self.plan.run_id)
                await backend.aclose()
            except Exception as exc:
                log.warning("%s: cleanup failed: %s", name, exc)

    async def run(self, order: WorkOrder, driver: Attempts) -> None:
        """Attempt a work order until it succeeds, fails for good, or runs out of attempts."""
        config = self.config
        for attempt in range(1, config.max_attempts + 1):
            driver.started(order.work_id, attempt)
            try:
                finished = await self.attempt(order, attempt)
            except SessionFailure as failure:
                final = failure.stops_run or not failure.retryable or attempt == config.max_attempts
                driver.report(
                    Failed(
                        order.work_id,
                        attempt,
                        failure.error_class,
                        str(failure),
                        final,
                        failure.stops_run,
                        failure.permanent,
                    )
                )
                if final:
                    return
                await asyncio.sleep(backoff_delay(attempt, config.retry_backoff))
                continue
            driver.report(finished)
            return

    async def attempt(self, order: WorkOrder, attempt: int) -> Finished:
        """One attempt; every way it can fail is a :class:`SessionFailure`."""
        image = order.item.row.image
        if image and (order.backend, image) in self.image_failures:
            raise SessionFailure(
                "image_unavailable", self.image_failures[(order.backend, image)], retryable=False
            )
        timeout = self.config.prompt_timeout
        started = time.monotonic()
        try:
            async with asyncio.timeout(timeout) as deadline:
                with session_deadline(deadline):  # waits on the run's own rate limits do not count
                    return await self._session(order, attempt, started)
        except TimeoutError:
            raise SessionFailure("prompt_timeout", f"no result within {timeout:g}s") from None
        except ModelError as exc:
            raise SessionFailure(
                exc.error_class,
                str(exc),
                retryable=exc.retryable,
                stops_run=exc.stops_run,
                permanent=exc.permanent,
            ) from None
        except ImageUnavailable as exc:
            raise SessionFailure(exc.error_class, str(exc), retryable=False) from None
        except SandboxError as exc:
            raise SessionFailure(exc.error_class, str(exc)) from None
        except Exception as exc:
            raise SessionFailure("internal_error", f"{type(exc).__name__}: {exc}") from exc

    def _drawn(self, work_id: str) -> tuple[str, ...]:
        """The toolsets drawn for a work item."""
        return tuple(sorted(self.plan.distribution.sample(rng_for(self.config.seed, work_id))))

    def _offer(self, drawn: tuple[str, ...], tools: dict[str, Tool]) -> tuple[str, list[dict[str, Any]]]:
        """The key and list of the schemas of ``tools`` (the same for every session that draws
        the same toolsets, unless a toolset lists its tools per session)."""
        cached = self.offers.get(drawn)
        if cached is None or cached[0] != tools:
            schemas = [tools[name].schema() for name in sorted(tools)]
            cached = self.offers[drawn] = (tools, tool_schemas_key(schemas), schemas)
        return cached[1], cached[2]

    async def _session(self, order: WorkOrder, attempt: int, started: float) -> Finished:
        assert self.client is not None, "Sessions.open() first"
        toolsets = self._drawn(order.work_id)
        result, score, offered = await self._converse(order, toolsets)
        tools = flat_tools(offered)
        key, schemas = self._offer(toolsets, tools)
        owner = {name: toolset for toolset, by_name in offered.items() for name in by_name}
        used = {owner[name] for name, stat in result.tool_stats.items() if stat.count and name in owner}
        item, image = order.item, order.item.row.image
        record = record_json(
            result,
            sorted({*self.plan.run_tools, *tools}),
            work_id=item.work_id,
            prompt_id=item.prompt_id,
            prompt_index=item.index,
            sample=item.sample,
            metadata={
                **item.row.extra_fields,
                "batch_num": None,  # the ledger's batch, set by the runner as it appends the record
                "timestamp": datetime.now(UTC).isoformat(),
                "model": self.config.model,
            },
            toolsets_used=sorted(used),
            toolsets_offered=list(toolsets),
            tools_offered=sorted(tools),
            tool_schemas_key=key,
            duration_s=round(time.monotonic() - started, 3),
            attempt=attempt,
            backend=order.backend,
            image=image,
            digest=self.digests.get((order.backend, image)) if image else None,
            score=score,
        )
        new = key not in self.reported
        self.reported.add(key)
        return Finished(order.work_id, record, {key: schemas} if new else {})

    async def _converse(
        self, order: WorkOrder, toolsets: tuple[str, ...]
    ) -> tuple[ConversationResult, dict[str, Any] | None, dict[str, dict[str, Tool]]]:
        """One conversation in a fresh sandbox offering the tools ``toolsets`` give it there,
        scored before the sandbox closes; with those tools by toolset."""
        assert self.client is not None, "Sessions.open() first"
        config, item = self.config, order.item
        spec = SandboxSpec(
            run_id=self.plan.run_id,
            work_id=item.work_id,
            image=item.row.image,
            cwd=item.row.cwd,
            lifetime=min(config.sandbox_lifetime, config.prompt_timeout + 120),
        )
        sandbox = await self.backends[order.backend].create(spec)
        tool_session = ToolSession(self.tool_run)
        try:
            drawn = (self.host.toolsets[name] for name in toolsets)
            offered = await session_tools(drawn, tool_session, sandbox, item.work_id)
            tools = flat_tools(offered)
            session = build_session(config, self.client, sandbox, tools, self.plan.run_tools, tool_session)
            result = await run_conversation(session, item.row.prompt)
            # The session is over before it is scored: what its tools kept running (background
            # processes) must not change the sandbox under the check.
            await asyncio.shield(close_tools(tool_session))
            row = {"prompt": item.row.prompt, "image": item.row.image, "cwd": item.row.cwd}
            row |= {"backend": item.row.backend, **item.row.extra_fields}
            score = await score_result(self.scorers, row, result, sandbox, config, item.row.check_files)
            return result, score, offered
        finally:
            await asyncio.shield(close_session(tool_session, sandbox))


def build_session(
    config: RunConfig,
    client: ModelClient,
    sandbox: Sandbox,
    tools: Mapping[str, Tool],
    known_tools: Iterable[str],
    tool_session: ToolSession,
) -> Session:
    """One conversation's :class:`Session` with the run's settings (prompts, turns, tool limits)."""
    return Session(
        client=client,
        sandbox=sandbox,
        tools=tools,
        known_tools=frozenset(known_tools),
        system_prompt=config.system_prompt,
        ephemeral_system_prompt=config.ephemeral_system_prompt,
        prefill_messages=config.prefill_messages,
        max_turns=config.max_turns,
        tool_timeout=config.tool_timeout,
        tool_output_cap=config.tool_output_cap,
        tool_session=tool_session,
    )


async def score_result(
    scorers: Sequence[Scorer],
    row: Mapping[str, Any],
    result: ConversationResult,
    sandbox: Sandbox,
    config: RunConfig,
    check_files: Sequence[CheckFile] = (),
) -> dict[str, Any] | None:
    """The record's ``score`` of a finished conversation, its sandbox still open (None when no
    scorer applies to the row); ``check_files`` are put back in the sandbox before the checks."""
    if not scorers:
        return None
    context = ScoreContext(row, result.final_response, result.messages, sandbox, config.check_timeout)
    return await score_session(scorers, context, check_files)
