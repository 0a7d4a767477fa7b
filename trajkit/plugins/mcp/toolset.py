"""Any MCP server as a toolset: ``[mcp_servers.NAME]`` in a run's configuration becomes the toolset
``mcp:NAME``, drawn by distributions and named with ``--toolsets`` like any other.

A ``per_session`` server (the default for a command) is started inside each session's sandbox
when the session starts, and ends with it: it sees only that sandbox's files, and the tools it
lists there are the tools that session offers. A ``shared`` server (a command run on the runner's
machine, or a URL) serves every session of the run, its tools listed once when the run is
configured. Either way the offered schemas are saved in ``tools.json``. The ``mcp`` SDK is the
client (``pip install trajkit[mcp]``); see docs/mcp.md.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import re
import shutil
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from trajkit import hookimpl
from trajkit.config.settings import StrictSettings
from trajkit.hookspecs import ConfigTable
from trajkit.plugins.mcp.client import Connection, Endpoint, ServerFailed
from trajkit.plugins.mcp.results import model_name, result_text, schema_problem
from trajkit.plugins.mcp.transport import HostPipe, Pipe, SandboxPipe
from trajkit.tools import Tool, ToolContext, ToolError, ToolRun, ToolSession, Toolset, ToolsetError

if TYPE_CHECKING:
    from trajkit.sandbox import Sandbox

log = logging.getLogger("trajkit")

TABLE = "mcp_servers"
PREFIX = "mcp:"
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class McpServer(StrictSettings):
    """One ``[mcp_servers.NAME]`` entry: a server the run offers as the toolset ``mcp:NAME``."""

    command: str | None = None
    """The program of a stdio server (found on PATH where it runs: in the sandbox for
    per_session, on this machine for shared)."""
    args: list[str] = Field(default_factory=list)
    """The program's arguments."""
    env: dict[str, str] = Field(default_factory=dict)
    """Variables set for a stdio server; ${NAME} in a value is the runner's variable NAME, passed
    to the server and never recorded (the run records the text as written)."""
    url: str | None = None
    """The endpoint of a Streamable HTTP server (always shared)."""
    headers: dict[str, str] = Field(default_factory=dict)
    """HTTP headers sent to a URL server; ${NAME} as in env."""
    mode: Literal["per_session", "shared"] | None = None
    """per_session: started in each session's sandbox, ending with it (the default for a command);
    shared: one process on this machine, or the URL, for the whole run."""
    timeout: float = Field(60.0, gt=0)
    """Seconds one tool call may take (at most the run's tool timeout)."""
    start_timeout: float = Field(30.0, gt=0)
    """Seconds the server has to start and list its tools."""
    max_message_bytes: int = Field(1 << 20, ge=1024)
    """Longest message taken from the server; a longer answer is a tool error, skipped unread."""
    prefix: str = Field("", pattern=r"^[a-zA-Z0-9_-]*$")
    """Put before each tool name (git_ makes status git_status), to keep names apart from other
    toolsets'."""
    description: str = ""
    """What the toolset is for, as trajkit lists it (default: the server's name)."""

    @model_validator(mode="after")
    def _one_transport(self) -> McpServer:
        if (self.command is None) == (self.url is None):
            raise ValueError("give either command (a stdio server) or url (a Streamable HTTP server)")
        if self.url is not None and self.mode == "per_session":
            raise ValueError("a url server runs outside the sandboxes: its mode can only be shared")
        return self

    @property
    def shared(self) -> bool:
        return self.url is not None or self.mode == "shared"


def expand(values: Mapping[str, str], what: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``values`` with each ${NAME} replaced by the runner's variable; an unset one is an error."""
    environ = os.environ if environ is None else environ

    def variable(found: re.Match[str]) -> str:
        if found.group(1) not in environ:
            raise ToolsetError(f"{what} names ${{{found.group(1)}}}, which is not set in the environment")
        return environ[found.group(1)]

    return {key: _VARIABLE.sub(variable, value) for key, value in values.items()}


@hookimpl
def trajkit_config_tables() -> list[ConfigTable]:
    return [ConfigTable(TABLE, McpServer, "MCP server")]


@hookimpl
def trajkit_configured_toolsets(config: Any) -> list[Toolset]:
    servers: dict[str, McpServer] = dict(config.tables.get(TABLE, {}))
    if not servers:
        return []
    try:
        import mcp  # noqa: F401
    except ImportError:
        raise ToolsetError("[mcp_servers] needs the mcp package: pip install 'trajkit[mcp]'") from None

    async def list_all() -> list[McpToolset]:
        return list(
            await asyncio.gather(*(configured(name, server) for name, server in sorted(servers.items())))
        )

    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # the caller may be on an event loop
        return list(pool.submit(asyncio.run, list_all()).result())


async def configured(name: str, server: McpServer) -> McpToolset:
    """The toolset of ``server``: a shared server's tools as it lists them, started once on this
    machine; a per-session server's are listed in each session's sandbox."""
    if not server.shared:
        expand(server.env, f"MCP server {name!r} env")  # a variable not set stops the run here
        return McpToolset.of(name, server, [])
    return McpToolset.of(name, server, await listed_on_host(name, server))


async def listed_on_host(name: str, server: McpServer) -> list[Any]:
    """What ``server`` lists when started on this machine; a :class:`ToolsetError` if it cannot."""
    connection = Connection(host_endpoint(name, server))
    try:
        return await connection.open()
    except ServerFailed as exc:
        raise ToolsetError(str(exc)) from None
    finally:
        await connection.close()


def host_endpoint(name: str, server: McpServer) -> Endpoint:
    label = f"MCP server {name!r}"
    if server.url is not None:
        headers = expand(server.headers, f"{label} headers")
        return Endpoint(label, url=server.url, headers=headers, **_limits(server))
    command, env = server.command or "", expand(server.env, f"{label} env")

    async def open_pipe() -> Pipe:
        found = shutil.which(command)
        if found is None:
            raise ServerFailed(f"{command!r} is not a program on this machine's PATH")
        return await HostPipe.start(found, server.args, env)

    return Endpoint(label, open_pipe=open_pipe, **_limits(server))


def _limits(server: McpServer) -> dict[str, Any]:
    return {"max_message": server.max_message_bytes, "start_timeout": server.start_timeout}


@dataclass(frozen=True)
class McpToolset(Toolset):
    """The tools one MCP server lists, each calling the server under its original name: a shared
    server's as listed when the run is configured, a per-session server's as listed in each
    session (:meth:`session_tools`)."""

    server: ServerTools | None = None

    @classmethod
    def of(cls, name: str, settings: McpServer, listing: list[Any]) -> McpToolset:
        server = ServerTools(name, settings)
        where = "shared by every session" if settings.shared else "one per session, in its sandbox"
        description = settings.description or f"the tools of the MCP server {name!r} ({where})"
        return cls(PREFIX + name, description, server.tools_of(listing), server=server)

    async def start(self, run: ToolRun) -> None:
        assert self.server is not None
        await self.server.start(run)

    async def session_tools(self, session: ToolSession, sandbox: Sandbox) -> tuple[Tool, ...]:
        assert self.server is not None
        if self.server.settings.shared:
            return self.tools
        return await self.server.open_in(session, sandbox)

    async def listed_tools(self) -> tuple[tuple[Tool, ...], str | None]:
        """A per-session server's tools as it lists them when started on this machine, which may
        differ from what it lists in a sandbox, or not start here at all."""
        server = self.server
        assert server is not None
        if server.settings.shared:
            return self.tools, None
        try:
            listing = await listed_on_host(server.name, server.settings)
        except ToolsetError as exc:
            return (), f"listed in each session's sandbox; on this machine: {exc}"
        return server.tools_of(listing), "listed in each session's sandbox; as started on this machine"


@dataclass
class ServerTools:
    """One configured server as its toolset's tools reach it, in one process."""

    name: str
    settings: McpServer
    listed: set[str] = field(default_factory=set)
    """A shared server's tool names when the run was configured."""
    said: set[str] = field(default_factory=set)

    @property
    def key(self) -> str:
        return PREFIX + self.name

    def tools_of(self, listing: list[Any]) -> tuple[Tool, ...]:
        """The tools offered for ``listing``: names the model API refuses mapped, tools whose
        schema is broken left out (each said once)."""
        tools: list[Tool] = []
        original: dict[str, str] = {}
        """Offered tool name -> the server's name for it."""
        for item in listing:
            problem = schema_problem(item.input_schema)
            if problem:
                self.say_once(f"MCP server {self.name!r}: tool {item.name!r} left out: {problem}")
                continue
            wanted = self.settings.prefix + item.name
            offered = model_name(wanted, set(original))
            description = item.description or item.title or ""
            if offered != wanted:
                self.say_once(f"MCP server {self.name!r}: tool {item.name!r} is offered as {offered!r}")
                description = f"{description} (MCP tool {item.name!r})".strip()
            original[offered] = item.name
            tools.append(Tool(offered, description, item.input_schema, self.caller(item.name)))
        self.listed = {item.name for item in listing}
        return tuple(tools)

    async def start(self, run: ToolRun) -> None:
        if not self.settings.shared:
            return
        connection = Connection(host_endpoint(self.name, self.settings))
        try:
            listing = await connection.open()
        except ServerFailed as exc:
            raise ToolsetError(str(exc)) from None
        run.on_close(connection.close)
        log.info("MCP server %r is shared by every session of this run", self.name)
        self.compare(listing)
        run.resources[self.key] = ServerState(connection)

    async def open_in(self, session: ToolSession, sandbox: Sandbox) -> tuple[Tool, ...]:
        """Start the server in ``sandbox`` for ``session`` (ending with it) and offer what it
        lists there; a :class:`ToolsetError` if it does not start or list."""
        state = ServerState(Connection(self.sandbox_endpoint(sandbox)))
        session.state[self.key] = state
        session.on_close(state.connection.close)
        try:
            listing = await state.connection.open()
        except ServerFailed as exc:
            state.failure = str(exc)
            raise ToolsetError(state.failure) from None
        return self.tools_of(listing)

    async def connection(self, ctx: ToolContext) -> Connection:
        """The run's connection (shared), or the one started in this session's sandbox."""
        if self.settings.shared:
            state = ctx.session.run.resources.get(self.key)
            if not isinstance(state, ServerState):
                raise ToolError(f"{self.key} was not started for this run")
            return state.connection
        state = ctx.session.state.get(self.key)
        if not isinstance(state, ServerState):
            raise ToolError(f"{self.key} was not started in this session")
        if state.failure:
            raise ToolError(state.failure)
        return state.connection

    def sandbox_endpoint(self, sandbox: Sandbox) -> Endpoint:
        settings = self.settings
        label = f"MCP server {self.name!r}"

        async def open_pipe() -> Pipe:
            env = expand(settings.env, f"{label} env")
            command = settings.command or ""
            return await SandboxPipe.start(sandbox, command, settings.args, env, settings.max_message_bytes)

        return Endpoint(label, open_pipe=open_pipe, **_limits(settings))

    def compare(self, listing: list[Any]) -> None:
        """A shared server whose tools differ from those listed when the run was configured
        keeps being offered the first list: said once."""
        now = {item.name for item in listing}
        if now != self.listed:
            self.say_once(
                f"MCP server {self.name!r} now lists other tools ({len(now - self.listed)} added, "
                f"{len(self.listed - now)} gone): the run keeps offering the tools it listed first"
            )

    def say_once(self, message: str) -> None:
        if message not in self.said:
            self.said.add(message)
            log.warning("%s", message)

    def caller(self, original: str) -> Callable[[dict[str, Any], ToolContext], Awaitable[str]]:
        async def call(args: dict[str, Any], ctx: ToolContext) -> str:
            connection = await self.connection(ctx)
            result = await connection.call(original, args, min(self.settings.timeout, ctx.timeout))
            if connection.list_changed:
                keeps = "run" if self.settings.shared else "session"
                self.say_once(
                    f"MCP server {self.name!r} said its tool list changed: the {keeps} keeps offering "
                    "the tools it listed first"
                )
            text, failed = result_text(result, ctx.output_cap)
            if failed:
                raise ToolError(text or "the tool reported an error")
            return text

        return call


@dataclass
class ServerState:
    connection: Connection
    failure: str = ""
