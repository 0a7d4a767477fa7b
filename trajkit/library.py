"""The agent as a library: one prompt, one sandbox, one conversation, no run directory.

agent = Agent(model="scripted", enabled_toolsets=["terminal"])
agent.chat("List the files")                  # -> the final answer
agent.run_conversation("List the files")      # -> final_response and messages
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections.abc import Sequence
from typing import Any

from trajkit.agent import ConversationResult, Session, run_conversation
from trajkit.config.resolve import resolve
from trajkit.config.run_config import DEFAULT_SYSTEM_PROMPT
from trajkit.manager import PluginHost, load_plugins
from trajkit.sandbox import SandboxSpec
from trajkit.tools import ToolRun, ToolSession, close_session, flat_tools, open_toolsets, session_tools
from trajkit.tools.offer import Offer, missing
from trajkit.tools.offer import resolve as resolve_offer

log = logging.getLogger("trajkit")


class Agent:
    def __init__(
        self,
        model: str = "scripted",
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        enabled_toolsets: Sequence[str] | None = None,
        disabled_toolsets: Sequence[str] = (),
        max_turns: int = 10,
        system_prompt: str = DEFAULT_SYSTEM_PROMPT,
        ephemeral_system_prompt: str | None = None,
        sandbox: str = "local",
        sandbox_options: dict[str, str] | None = None,
        image: str | None = None,
        quiet_mode: bool = True,
        plugins: PluginHost | None = None,
        **settings: Any,
    ) -> None:
        """``settings``: any other setting of a run by name (``max_retries=2``, ``temperature=0.2``,
        a backend's under ``sandbox_options``), validated as ``trajkit run`` validates it."""
        self.host = plugins or load_plugins()
        endpoint = {k: v for k, v in (("base_url", base_url), ("api_key", api_key)) if v is not None}
        self.config = resolve(
            self.host,
            dict(
                model=model,
                max_turns=max_turns,
                system_prompt=system_prompt,
                ephemeral_system_prompt=ephemeral_system_prompt,
                sandbox=sandbox,
                sandbox_options={sandbox: dict(sandbox_options or {})},
                quiet=quiet_mode,
                **endpoint,
                **settings,
            ),
        )
        self.offer = self._offer(enabled_toolsets, disabled_toolsets)
        self.toolsets = [self.host.toolsets[name] for name in self.offer.distribution.drawn()]
        self.tools = {t.name: t for toolset in self.toolsets for t in toolset.tools}
        """Every tool a conversation may be offered."""
        self.image = image

    def _offer(self, enabled: Sequence[str] | None, disabled: Sequence[str]) -> Offer:
        """``enabled``: exactly these toolsets (as ``--toolsets``); None: the ``distribution``
        setting's draw per conversation if given, else every installed toolset that can run."""
        toolsets = list(enabled) if enabled is not None else []
        if enabled is None and self.config.distribution is None:
            absent = missing(self.host.toolsets, self.config, self.host)
            toolsets = sorted(name for name in self.host.toolsets if name not in absent)
        config = self.config.model_copy(update={"toolsets": toolsets, "disabled_toolsets": list(disabled)})
        found = resolve_offer(config, self.host)
        notice = found.notice()
        if notice and not found.fixed:
            log.warning("%s", notice)
        return found

    async def arun_conversation(self, prompt: str) -> ConversationResult:

        client = self.host.model_client(self.config.model).from_config(self.config)
        backend = self.host.backend(self.config.sandbox)(self.config.sandbox_options.get(self.config.sandbox))
        tool_run = ToolRun(self.config)
        try:
            tool_run = await open_toolsets(self.toolsets, self.config, self.host)
            if self.image:
                await backend.verify_image(self.image)
            spec = SandboxSpec(run_id=f"agent-{uuid.uuid4().hex[:8]}", work_id="0", image=self.image)
            sandbox = await backend.create(spec)
            tool_session = ToolSession(tool_run)
            drawn = self.offer.distribution.sample(random.Random())
            try:
                offered = await session_tools(
                    (self.host.toolsets[name] for name in sorted(drawn)), tool_session, sandbox
                )
                session = Session(
                    client=client,
                    sandbox=sandbox,
                    tools=flat_tools(offered),
                    known_tools=frozenset(self.tools),
                    system_prompt=self.config.system_prompt,
                    ephemeral_system_prompt=self.config.ephemeral_system_prompt,
                    max_turns=self.config.max_turns,
                    tool_session=tool_session,
                )
                return await run_conversation(session, prompt)
            finally:
                await close_session(tool_session, sandbox)
        finally:
            await tool_run.aclose()
            await backend.aclose()
            await client.aclose()

    def run_conversation(self, prompt: str) -> ConversationResult:
        return asyncio.run(self.arun_conversation(prompt))

    def chat(self, prompt: str) -> str:
        return self.run_conversation(prompt).final_response or ""

    def __repr__(self) -> str:
        details: dict[str, Any] = {"model": self.config.model, "tools": sorted(self.tools)}
        return f"Agent({details})"
