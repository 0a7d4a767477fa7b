"""An MCP server that does what a badly made or hostile one does, on the ``mcp`` SDK's own
``MCPServer``: it crashes, hangs, floods, lists a tool whose schema is broken and tools whose
names the model API refuses, changes its tool list mid-run, and fails. A stdio server, or a
Streamable HTTP one with ``--http PORT`` (``--http-json PORT``: its answers plain JSON)."""

import asyncio
import os
import sys

import mcp_types as types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

LONG_NAME = "measure_" + "very_" * 38 + "long"
"""A 200-character tool name."""
state = {"calls": 0}


class HostileServer(MCPServer):
    async def list_tools(self) -> list[types.Tool]:
        tools = await super().list_tools()
        broken = {"type": "object", "properties": {"x": {"type": 12}}}
        return [*tools, types.Tool(name="broken_schema", description="never offered", input_schema=broken)]


server = HostileServer("hostile")


@server.tool()
def count() -> str:
    """How many calls this process has answered (its state: lost when it is started again)."""
    state["calls"] += 1
    return str(state["calls"])


@server.tool()
def crash() -> str:
    """End the process at once."""
    sys.stdout.flush()
    os._exit(3)


@server.tool()
async def hang() -> str:
    """Never answer."""
    await asyncio.sleep(3600)
    return "late"


@server.tool()
def flood(megabytes: int) -> str:
    """Answer with this many megabytes of text."""
    return "x" * (megabytes << 20)


@server.tool()
def fail() -> str:
    """Fail: the answer is an error."""
    raise ToolError("this tool always fails")


@server.tool(name="look up the weather")
def weather() -> str:
    """A tool whose name holds spaces."""
    return "sunny"


@server.tool(name=LONG_NAME)
def measure() -> str:
    """A tool whose name is 200 characters long."""
    return "long"


@server.tool()
async def grow(ctx: Context) -> str:
    """Add a tool to the list, and say the list changed."""
    server.add_tool(lambda: "new", name="added_later")
    await ctx.session.send_tool_list_changed()
    return "grown"


@server.tool()
def header(name: str, ctx: Context) -> str:
    """The value of an HTTP header of this request (served over Streamable HTTP)."""
    request = ctx.request_context.request
    return str(request.headers.get(name)) if request is not None else "no request"


if __name__ == "__main__":
    if sys.argv[1:2] in (["--http"], ["--http-json"]):  # Streamable HTTP on a loopback port
        plain = sys.argv[1] == "--http-json"  # answers as plain JSON, not server-sent events
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]), json_response=plain)
    else:
        server.run("stdio")
