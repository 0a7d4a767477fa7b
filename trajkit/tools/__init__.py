"""Tools and toolsets: what the model may call, and how a call runs against the sandbox.

A toolset is a named group of tools that a distribution includes or leaves out as a whole. Most
toolsets are plain: their tools need only the session's sandbox. Others keep things between calls
or share them across sessions (an HTTP client and a cache, a browser, a server), declare settings,
or cannot be offered until something is configured; for those a :class:`Toolset` subclass
declares ``Settings`` and overrides :meth:`Toolset.problem` and :meth:`Toolset.start`, and its
tools keep per-session state in :attr:`ToolContext.session`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from trajkit.config.settings import StrictSettings
from trajkit.sandbox import Sandbox

if TYPE_CHECKING:
    from trajkit.config.run_config import RunConfig
    from trajkit.manager import PluginHost

log = logging.getLogger("trajkit")


class ToolError(Exception):
    """Raised by a tool implementation: the call failed, the message goes back to the model."""


class ToolsetError(Exception):
    """A toolset cannot start for this run (its server fails, its endpoint is unreachable): the run
    stops before any session, with this message (which must name no secret)."""


class NoSettings(StrictSettings):
    """A toolset without settings of its own."""


Cleanup = Callable[[], Awaitable[object]]


@dataclass
class ToolRun:
    """What the toolsets of one run (a ``trajkit run`` invocation, a server, a library agent) share
    while it lasts, in the process where its sessions run."""

    config: RunConfig | None = None
    """The run's configuration (its model and endpoint, for toolsets that call a model)."""
    settings: Mapping[str, StrictSettings] = field(default_factory=dict)
    """Toolset name -> its settings in this run."""
    resources: dict[str, Any] = field(default_factory=dict)
    """Toolset name -> what :meth:`Toolset.start` opened for its tools (clients, caches, pools)."""
    plugins: PluginHost | None = None
    """The plugins installed where the run's sessions run, for toolsets that use other plugins
    (the ``web`` toolset's search providers, ``vision``'s model client)."""
    _exits: contextlib.AsyncExitStack = field(default_factory=contextlib.AsyncExitStack, repr=False)

    def settings_of(self, toolset: Toolset) -> Any:
        """The toolset's settings in this run, else its defaults."""
        found = self.settings.get(toolset.name)
        return found if isinstance(found, toolset.Settings) else toolset.Settings()

    def on_close(self, cleanup: Cleanup) -> None:
        """Run ``cleanup`` when the run ends (last registered, first run)."""
        self._exits.push_async_callback(cleanup)

    async def aclose(self) -> None:
        await self._exits.aclose()


@dataclass
class ToolSession:
    """What lives as long as one session: state a toolset keeps between its calls (a shell's
    working directory, a browser page, background processes), closed when the session ends,
    before its sandbox."""

    run: ToolRun = field(default_factory=ToolRun)
    state: dict[str, Any] = field(default_factory=dict)
    """Toolset name -> its state in this session; a tool creates it on first use."""
    _exits: contextlib.AsyncExitStack = field(default_factory=contextlib.AsyncExitStack, repr=False)

    def on_close(self, cleanup: Cleanup) -> None:
        """Run ``cleanup`` when the session ends, however it ends (last registered, first run)."""
        self._exits.push_async_callback(cleanup)

    async def aclose(self) -> None:
        await self._exits.aclose()


@dataclass
class ToolContext:
    """What a tool implementation gets besides its arguments."""

    sandbox: Sandbox
    timeout: float = 60.0
    output_cap: int = 16 * 1024
    session: ToolSession = field(default_factory=ToolSession)


ToolFunction = Callable[[dict[str, Any], ToolContext], Awaitable[str]]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    """JSON schema of the arguments object."""
    run: ToolFunction = field(compare=False)

    def schema(self) -> dict[str, Any]:
        """The tool as the OpenAI ``tools`` list expects it."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass(frozen=True)
class Toolset:
    """A named group of tools that a distribution includes or leaves out as a whole.

    Settings (``--NAME.KEY``, ``[toolset_options.NAME]``, ``--toolset_option NAME.KEY=VALUE``) are
    the pydantic model a subclass declares as ``Settings``.
    """

    name: str
    description: str
    tools: tuple[Tool, ...]
    Settings: ClassVar[type[StrictSettings]] = NoSettings
    optional: ClassVar[bool] = False
    """What a run does when :meth:`problem` finds a reason: an optional toolset (one that is off
    until configured, such as an image endpoint) is left out of the run's draws, said once; any
    other stops the run before it writes anything, saying what to set."""

    def problem(self, settings: Any) -> str | None:
        """Why this toolset cannot be offered with ``settings`` (an endpoint or key not set, a
        program not installed), in words that say what to set or install; None when it can.

        Called before a run writes anything, and by the commands that list toolsets; it must be
        quick and must not reach the network.
        """
        return None

    async def start(self, run: ToolRun) -> None:
        """Open what this toolset's tools share for the run (HTTP clients, caches, a browser).

        Called once per run, in each process where its sessions run, before the first session and
        only for toolsets the run may offer. Keep what it opens in ``run.resources[self.name]``
        and register its closing with ``run.on_close``. Raise :class:`ToolsetError` to stop the
        run before any session.
        """

    async def session_tools(self, session: ToolSession, sandbox: Sandbox) -> tuple[Tool, ...]:
        """The tools this toolset offers in one session: :attr:`tools` unless it learns them there
        (an MCP server started in the session's sandbox lists its own).

        Called once per session that draws this toolset, after its sandbox is created and before
        the first model call, with the session's :class:`ToolSession` (keep what it starts in
        ``session.state[self.name]`` and register its closing with ``session.on_close``). The
        tools it returns are those the model is offered, recorded in ``tools.json`` like any
        others; their names must not be another drawn toolset's (a clash is left out, said).
        Raise :class:`ToolsetError` when this session cannot have them: the session goes on
        without this toolset's tools and the message is logged with the session's work item.
        """
        return self.tools

    async def listed_tools(self) -> tuple[tuple[Tool, ...], str | None]:
        """The tools to show for this toolset where no session runs (``trajkit toolsets``), and a
        note on them: ``(self.tools, None)`` unless :meth:`session_tools` learns them per session,
        in which case they are what can be learnt here (maybe none), and the note says so. It may
        take time (start a server), within a bounded timeout; it must not raise."""
        return self.tools, None


def schemas_markdown(tools: Iterable[Tool]) -> str:
    """``tools``' schemas as the model is given them, one Markdown section each (for the pages
    that document them; a test keeps each page current)."""
    import json

    return "\n".join(
        f"### `{tool.name}`\n\n```json\n{json.dumps(tool.schema(), indent=2, ensure_ascii=False)}\n```\n"
        for tool in tools
    )


async def open_toolsets(
    toolsets: Iterable[Toolset], config: RunConfig, plugins: PluginHost | None = None
) -> ToolRun:
    """Start ``toolsets`` for a run with ``config``'s settings and the installed ``plugins``; the
    caller closes the result."""
    toolsets = list(toolsets)
    run = ToolRun(
        config, {toolset.name: config.settings_of(toolset) for toolset in toolsets}, plugins=plugins
    )
    try:
        for toolset in toolsets:
            await toolset.start(run)
    except BaseException:
        await run.aclose()
        raise
    return run


async def session_tools(
    toolsets: Iterable[Toolset], session: ToolSession, sandbox: Sandbox, work_id: str = ""
) -> dict[str, dict[str, Tool]]:
    """Toolset name -> its tools by name, as ``toolsets`` offer them in one session
    (:meth:`Toolset.session_tools`, asked concurrently); a toolset that cannot offer its tools
    here, or a tool whose name an earlier toolset has, is left out, said."""
    toolsets = list(toolsets)
    found = await asyncio.gather(
        *(toolset.session_tools(session, sandbox) for toolset in toolsets), return_exceptions=True
    )
    where = f"{work_id}: " if work_id else ""
    offered: dict[str, dict[str, Tool]] = {}
    taken: set[str] = set()
    for toolset, tools in zip(toolsets, found, strict=True):
        if isinstance(tools, ToolsetError):
            log.warning("%s%s offers no tools in this session: %s", where, toolset.name, tools)
            continue
        if isinstance(tools, BaseException):
            raise tools
        offered[toolset.name] = {}
        for tool in tools:
            if tool.name in taken:
                log.warning("%s%s: tool %r left out: another toolset has it", where, toolset.name, tool.name)
                continue
            taken.add(tool.name)
            offered[toolset.name][tool.name] = tool
    return offered


def flat_tools(offered: Mapping[str, Mapping[str, Tool]]) -> dict[str, Tool]:
    """Tool name -> tool of what :func:`session_tools` found, every toolset's together."""
    return {name: tool for by_name in offered.values() for name, tool in by_name.items()}


async def close_tools(tool_session: ToolSession) -> None:
    """Close what a session's tools kept (their background processes, pages, shells); a failure is
    logged, never raised. Closing again does nothing."""
    try:
        await tool_session.aclose()
    except Exception as exc:  # a toolset's cleanup must not keep the sandbox open
        log.warning("closing a session's tools failed: %s: %s", type(exc).__name__, exc)


async def close_session(tool_session: ToolSession, sandbox: Sandbox) -> None:
    """Close what a session's tools kept (before the sandbox they may run in), then the sandbox."""
    try:
        await close_tools(tool_session)
    finally:
        await sandbox.close()


@dataclass
class ToolOutcome:
    """The result of one tool call as the model sees it, and whether it counts as a failure."""

    content: str
    ok: bool
