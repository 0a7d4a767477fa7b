"""The agent behind the API: one model client and one sandbox backend for the server's life, a
fresh sandbox and session per request, every finished session handed to the recorder.

Per-request sampling fields reach the model as the session's ``model_params``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from trajkit.agent import ConversationResult, Session, ToolStatus, run_conversation
from trajkit.config.run_config import RunConfig
from trajkit.manager import PluginHost
from trajkit.model import AssistantMessage, Message, ModelClient, ToolCall
from trajkit.record.secrets import Scrubber, environment_secrets
from trajkit.run.runner import Runner
from trajkit.sandbox import Sandbox, SandboxBackend, SandboxSpec
from trajkit.serve.protocol import ChatRequest, ProtocolError
from trajkit.serve.recorder import Recorder
from trajkit.serve.settings import ServeSettings
from trajkit.tools import ToolRun, ToolSession, close_session, flat_tools, open_toolsets, session_tools

log = logging.getLogger("trajkit")


@dataclass
class Served:
    """A finished session and what the response needs besides it."""

    result: ConversationResult
    reasoning: list[str]


class ServedAgent:
    """Everything the routes need to answer a chat completion."""

    def __init__(self, config: RunConfig, settings: ServeSettings, host: PluginHost) -> None:
        plan = Runner(config, host)  # the run's own resolution of distribution, filters and writers
        self.config = config = plan.config  # with the distribution drawn named
        self.settings = settings
        self.host = host
        self.distribution = plan.distribution  # every toolset at 1.0 for --toolsets
        self.client_class = plan.client_class
        self.toolsets = [host.toolsets[name] for name in self.distribution.drawn()]
        self.run_tools = plan.run_tools
        self.tool_run = ToolRun(config)
        self.run_id = f"serve-{os.getpid()}-{int(time.time())}"
        self.scrubber = Scrubber([*config.secret_values(), *environment_secrets()])
        if settings.key():
            self.scrubber = Scrubber([*self.scrubber.secrets, settings.key() or ""])
        self.recorder = (
            Recorder(
                config, self.run_tools, plan.filters, plan.writers, self.scrubber, settings.merge_interval
            )
            if settings.record is not None
            else None
        )
        self.client: ModelClient
        self.backend: SandboxBackend

    async def start(self) -> None:
        """Check the endpoint, start the backend (clearing what dead servers left), open the run."""
        self.client = self.client_class.from_config(self.config)
        await self.client.check()
        self.tool_run = await open_toolsets(self.toolsets, self.config, self.host)
        backend_class = self.host.backend(self.config.sandbox)
        self.backend = backend_class(self.config.sandbox_options.get(self.config.sandbox, {}))
        reaped = await self.backend.reap()
        if reaped:
            log.info("%s: removed %d sandboxes left behind earlier", self.config.sandbox, reaped)
        if self.recorder is not None:
            self.recorder.open(self.host, self.client.statistics)

    async def stop(self) -> None:
        try:
            if self.recorder is not None:
                await self.recorder.close()
        finally:
            await self.client.aclose()
            await self.tool_run.aclose()
            await self.backend.reap(self.run_id)
            await self.backend.aclose()

    def check_request(self, request: ChatRequest) -> list[dict[str, Any]]:
        """Refuse what this server cannot honour; returns the client's tool schemas."""
        params = request.model_params()
        if params and not self.client_class.takes_params:
            raise ProtocolError(
                400, f"the model client {self.client_class.name!r} takes no per-request "
                f"{', '.join(sorted(params))}", param=sorted(params)[0],
            )  # fmt: skip
        schemas = [tool.model_dump() for tool in request.tools or []]
        clash = sorted({s["function"]["name"] for s in schemas} & set(self.host.tools))
        if clash:
            raise ProtocolError(
                400, f"tools: {', '.join(clash)} is the name of an agent tool; rename the client's tool",
                param="tools",
            )  # fmt: skip
        return schemas

    async def housekeeping(self, request: ChatRequest, messages: list[Message]) -> AssistantMessage:
        """A chat UI's own request (a title, tags, follow-ups): one plain model call, no tools."""
        params = request.model_params()
        if params:
            return await self.client.complete(messages, [], params)
        return await self.client.complete(messages, [])

    async def run(
        self,
        request: ChatRequest,
        system: str | None,
        conversation: list[Message],
        on_reply: Callable[[str, str], None] | None = None,
        on_tool: Callable[[ToolCall, ToolStatus], None] | None = None,
    ) -> Served:
        """One agent session in a fresh sandbox, closed however the session ends (cancelled too)."""
        client_tools = self.check_request(request)
        client_names = {schema["function"]["name"] for schema in client_tools}
        request_id = uuid.uuid4().hex[:16]
        toolsets = self.distribution.sample(random.Random(request_id))
        reasoning: list[str] = []

        def replied(reply: AssistantMessage) -> None:
            text, answer = split_reply(reply, client_names)
            if text:
                reasoning.append(text)
            if on_reply is not None:
                on_reply(text, answer)

        started = time.monotonic()
        spec = SandboxSpec(
            run_id=self.run_id,
            work_id=request_id,
            lifetime=min(self.config.sandbox_lifetime, self.settings.request_timeout + 120),
        )
        sandbox = await self.backend.create(spec)
        tool_session = ToolSession(self.tool_run)
        try:
            drawn = (self.host.toolsets[name] for name in sorted(toolsets))
            offered = await session_tools(drawn, tool_session, sandbox, request_id)
            tools = flat_tools(offered)
            for clash in sorted(set(tools) & client_names):  # a tool learnt in this session
                log.warning(
                    "%s: the client's own tool %r is offered instead of the session's", request_id, clash
                )
                del tools[clash]
            session = self._session(sandbox, tools, system, client_tools, replied, on_tool)
            session.model_params = request.model_params()
            session.tool_session = tool_session
            result = await run_conversation(session, conversation)
        finally:
            await _close(tool_session, sandbox)
        if self.recorder is not None:
            schemas = [tools[name].schema() for name in sorted(tools)]
            schemas += sorted(client_tools, key=lambda schema: schema["function"]["name"])
            called = {name for name, stat in result.tool_stats.items() if stat.count}
            used = {name for name, by_name in offered.items() if called & set(by_name)}
            self.recorder.record(
                result, conversation, sorted(toolsets), sorted(used), schemas,
                time.monotonic() - started, self.config.sandbox, request_id, own_tools=tools,
            )  # fmt: skip
        return Served(result, reasoning)

    def _session(
        self,
        sandbox: Sandbox,
        tools: dict[str, Any],
        system: str | None,
        client_tools: Sequence[dict[str, Any]],
        on_reply: Callable[[AssistantMessage], None],
        on_tool: Callable[[ToolCall, ToolStatus], None] | None,
    ) -> Session:
        config = self.config
        return Session(
            client=self.client,
            sandbox=sandbox,
            tools=tools,
            known_tools=frozenset(self.run_tools),
            system_prompt=system if system is not None else config.system_prompt,
            ephemeral_system_prompt=config.ephemeral_system_prompt,
            prefill_messages=config.prefill_messages,
            max_turns=config.max_turns,
            tool_timeout=config.tool_timeout,
            tool_output_cap=config.tool_output_cap,
            client_tools=client_tools,
            on_reply=on_reply,
            on_tool=on_tool,
        )


async def _close(tool_session: ToolSession, sandbox: Sandbox) -> None:
    """Close the session and its sandbox even when the session was cancelled (a client that went
    away): the close runs to its end before the cancellation goes on."""
    closing = asyncio.ensure_future(close_session(tool_session, sandbox))
    try:
        await asyncio.shield(closing)
    except asyncio.CancelledError:
        await closing
        raise


def split_reply(reply: AssistantMessage, client_tools: set[str]) -> tuple[str, str]:
    """A turn's (reasoning, answer) as the client sees them. What a model says beside calls to the
    agent's own tools is part of its working, not of the answer, so it travels with the reasoning;
    beside calls to the client's tools it is the answer's content, as OpenAI's API has it."""
    text = reply.reasoning or ""
    working = bool(reply.tool_calls) and not any(c.name in client_tools for c in reply.tool_calls)
    if working and reply.content:
        return (f"{text}\n\n{reply.content}" if text else reply.content), ""
    return text, reply.content or ""


LABEL_KEYS = ("command", "path", "pattern", "query", "code", "url")


def tool_label(call: ToolCall, limit: int = 80) -> str:
    """A short line saying what a call does: ``terminal: ls -la``."""
    try:
        arguments = json.loads(call.arguments) if call.arguments.strip() else {}
    except ValueError:
        arguments = {}
    detail = ""
    if isinstance(arguments, dict):
        values = [arguments.get(key) for key in LABEL_KEYS] + list(arguments.values())
        detail = next((v for v in values if isinstance(v, str) and v.strip()), "")
    detail = " ".join(detail.split())
    label = f"{call.name}: {detail}" if detail else call.name
    return label if len(label) <= limit else label[: limit - 1] + "…"
