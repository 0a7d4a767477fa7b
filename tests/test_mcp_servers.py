"""MCP servers as toolsets: ``[mcp_servers.NAME]`` becomes ``mcp:NAME``, its tools listed once,
their names made acceptable to the model API, and every fault of a server a tool error (a hostile
server on the SDK's own ``MCPServer``, a real ``mcp-server-time`` from PyPI, a standard-library
server per session in a local sandbox)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest

from tests.helpers import trajkit
from tests.test_plugins import plugin_with
from trajkit.config.resolve import ConfigurationError, resolve
from trajkit.config.settings import StrictSettings
from trajkit.hookspecs import ConfigTable
from trajkit.manager import PluginHost, load_plugins
from trajkit.plugins.local.sandbox import LocalBackend
from trajkit.plugins.mcp.results import NAME_RULE, model_name, result_text, schema_problem
from trajkit.plugins.mcp.toolset import McpToolset, expand
from trajkit.sandbox import Sandbox, SandboxSpec
from trajkit.sandbox.processes import OutputLog
from trajkit.tools import (
    Tool,
    ToolContext,
    ToolError,
    ToolSession,
    Toolset,
    ToolsetError,
    open_toolsets,
    session_tools,
)

TESTS = Path(__file__).parent
HOSTILE = str(TESTS / "mcp_hostile_server.py")
STDLIB_SERVER = (TESTS / "mcp_stdlib_server.py").read_text()
TIME_SERVER = shutil.which("mcp-server-time") or str(Path(sys.executable).parent / "mcp-server-time")


def configured(servers: dict[str, Any]) -> tuple[PluginHost, Any]:
    host = load_plugins()
    return host, resolve(host, {"mcp_servers": servers})


@contextlib.asynccontextmanager
async def local_session(
    toolset: Toolset, config: Any, host: PluginHost, root: Path, work_id: str, **options: str
) -> AsyncIterator[tuple[ToolContext, Sandbox]]:
    """A session of a run offering ``toolset``, in a local sandbox of its own under ``root``."""
    run = await open_toolsets([toolset], config, host)
    backend = LocalBackend({"root": str(root), **options})
    sandbox = await backend.create(SandboxSpec(run_id="mcp-test", work_id=work_id))
    session = ToolSession(run)
    try:
        yield ToolContext(sandbox=sandbox, session=session), sandbox
    finally:
        await session.aclose()
        await sandbox.close()
        await run.aclose()
        await backend.aclose()


def test_names_the_model_api_refuses_are_mapped_and_schemas_checked() -> None:
    taken: set[str] = set()
    spaced = model_name("look up the weather", taken)
    assert spaced == "look_up_the_weather"
    long = model_name("x" * 200, taken)
    assert NAME_RULE.match(long) and len(long) == 64
    assert model_name("x" * 200, {long}) != long  # a taken name gets a longer digest
    assert model_name("ok_name", taken) == "ok_name"
    assert schema_problem({"type": "object", "properties": {"a": {"type": "string"}}}) is None
    assert "not an object" in (schema_problem({"type": "string"}) or "")
    assert "not valid JSON Schema" in (
        schema_problem({"type": "object", "properties": {"x": {"type": 12}}}) or ""
    )


def test_results_become_the_text_of_a_tool_turn_within_the_cap() -> None:
    result = types.CallToolResult(
        content=[
            types.TextContent(type="text", text="hello"),
            types.ImageContent(type="image", data="aGVsbG8=", mime_type="image/png"),
            types.EmbeddedResource(
                type="resource", resource=types.TextResourceContents(uri="file:///a.txt", text="inside")
            ),
            types.ResourceLink(type="resource_link", uri="file:///b", name="b"),
        ],
        is_error=False,
    )
    text, failed = result_text(result, 10_000)
    assert not failed
    assert text.splitlines() == [
        "hello",
        "[image image/png, 6 bytes]",
        "[resource file:///a.txt]",
        "inside",
        "[resource file:///b (b)]",
    ]
    structured = types.CallToolResult(content=[], structured_content={"files": ["a"]}, is_error=True)
    assert result_text(structured, 100) == ('{"files": ["a"]}', True)
    flood = types.CallToolResult(content=[types.TextContent(type="text", text="y" * 50_000)])
    capped, _ = result_text(flood, 1000)
    assert len(capped.encode()) < 1200 and "truncated" in capped


def test_a_background_process_s_output_is_read_back_as_it_came_or_said_lost() -> None:
    log = OutputLog(8)
    log.feed(b"abcd")
    assert log.read_from(0) == (b"abcd", 4, 0)
    log.feed(b"efgh")
    assert log.read_from(4) == (b"efgh", 8, 0)
    log.feed(b"0123456789")  # more than the tail keeps: the bytes between were dropped
    assert log.read_from(8) == (b"6789", 18, 6)
    assert log.read_from(2) == (b"cd", 4, 0)  # the head first, then what is left of the rest
    assert log.read_from(4) == (b"6789", 18, 10)


def test_environment_values_come_from_the_runner_by_name() -> None:
    assert expand({"TOKEN": "Bearer ${SECRET}"}, "env", {"SECRET": "s3"}) == {"TOKEN": "Bearer s3"}
    with pytest.raises(ToolsetError, match=r"names \$\{MISSING\}, which is not set"):
        expand({"TOKEN": "${MISSING}"}, "env", {})
    per_session = {"command": "a-server-of-the-image", "env": {"TOKEN": "${MCP_TEST_NEVER_SET}"}}
    with pytest.raises(ConfigurationError, match=r"MCP server 'late' env names \$\{MCP_TEST_NEVER_SET\}"):
        configured({"late": per_session})  # before any session, though it starts in sessions


def test_configuration_errors_name_the_entry_and_key() -> None:
    host = load_plugins()
    with pytest.raises(ConfigurationError, match=r"MCP server .both.*either command"):
        resolve(host, {"mcp_servers": {"both": {"command": "x", "url": "http://127.0.0.1:9/mcp"}}})
    with pytest.raises(ConfigurationError, match=r"mcp_servers.typo.comand.*no setting .comand."):
        resolve(host, {"mcp_servers": {"typo": {"comand": "x"}}})
    with pytest.raises(ConfigurationError, match="'no-such-mcp-program' is not a program"):
        resolve(host, {"mcp_servers": {"gone": {"command": "no-such-mcp-program", "mode": "shared"}}})


def test_a_hostile_shared_server_only_ever_gives_tool_errors(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "trajkit")
    server = {
        "command": sys.executable,
        "args": [HOSTILE],
        "mode": "shared",
        "timeout": 3,
        "max_message_bytes": 1 << 20,
    }
    patient = {**server, "timeout": 120, "prefix": "slow_"}  # 100 MB take a while to make
    host, config = configured({"hostile": server, "patient": patient})
    toolset, flooding = host.toolsets["mcp:hostile"], host.toolsets["mcp:patient"]
    assert isinstance(toolset, McpToolset)
    names = {tool.name for tool in toolset.tools}
    assert "broken_schema" not in names  # its schema is broken: left out, said once
    assert "look_up_the_weather" in names
    assert all(NAME_RULE.match(name) for name in names)
    mapped = {tool.name: tool for tool in toolset.tools if tool.name.startswith("measure_")}
    (long_tool,) = mapped.values()
    assert "(MCP tool 'measure_very_" in long_tool.description  # the mapping is in the schema saved
    warnings = [r.getMessage() for r in caplog.records]
    assert sum("MCP server 'hostile': tool 'broken_schema' left out" in w for w in warnings) == 1

    async def main() -> None:
        run = await open_toolsets([toolset, flooding], config, host)
        ctx = ToolContext(sandbox=None, timeout=30, output_cap=4096, session=ToolSession(run))  # type: ignore[arg-type]
        tools = {tool.name: tool for ts in (toolset, flooding) for tool in ts.tools}

        async def call(name: str, **args: Any) -> str:
            return await tools[name].run(args, ctx)

        try:
            assert await call("count") == "1"
            assert await call("look_up_the_weather") == "sunny"
            assert await call(long_tool.name) == "long"
            with pytest.raises(ToolError, match=r"answer was \d+ bytes, more than the 1048576"):
                await call("slow_flood", megabytes=100)
            assert await call("slow_count") == "1"  # the same process, still answering
            began = time.monotonic()
            with pytest.raises(ToolError, match="did not answer within 3s"):
                await call("hang")
            assert time.monotonic() - began < 20
            with pytest.raises(ToolError, match="always fails"):
                await call("fail")
            assert await call("grow") == "grown"
            assert await call("count") == "2"
            with pytest.raises(ToolError, match="ended during this call and was started again"):
                await call("crash")
            assert await call("count") == "1"  # a new process: what the first held is lost
            with pytest.raises(ToolError):
                await call("crash")
            with pytest.raises(ToolError, match="unavailable"):
                await call("count")
        finally:
            await run.aclose()

    asyncio.run(main())
    warnings = [r.getMessage() for r in caplog.records]
    assert sum("said its tool list changed" in w for w in warnings) == 1


def server_directories() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("trajkit-mcp-*"))


def test_mcp_server_time_shared_answers_and_reports_errors() -> None:
    before = server_directories()
    host, config = configured({"time": {"command": TIME_SERVER, "mode": "shared"}})
    toolset = host.toolsets["mcp:time"]
    assert {tool.name for tool in toolset.tools} == {"get_current_time", "convert_time"}
    schema = {tool.name: tool for tool in toolset.tools}["convert_time"].parameters
    assert schema["required"] == ["source_timezone", "time", "target_timezone"]  # offered as it is

    async def main() -> None:
        run = await open_toolsets([toolset], config, host)
        ctx = ToolContext(sandbox=None, session=ToolSession(run))  # type: ignore[arg-type]
        tools = {tool.name: tool for tool in toolset.tools}
        try:
            now = json.loads(await tools["get_current_time"].run({"timezone": "Asia/Tokyo"}, ctx))
            assert now["timezone"] == "Asia/Tokyo" and now["datetime"].endswith("+09:00")
            with pytest.raises(ToolError, match="Nowhere/Land"):
                await tools["get_current_time"].run({"timezone": "Nowhere/Land"}, ctx)
        finally:
            await run.aclose()

    asyncio.run(main())
    assert server_directories() <= before  # each server ran in an empty directory, removed after it


def test_a_per_session_server_is_listed_in_its_own_sandbox_and_ends_with_it(
    sandbox_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MCP_TEST_NOTE_KEY", "key-from-the-environment")
    # Its program exists in the sandbox alone: made there, on the sandbox's own files.
    server = {  # per_session: the default for a command
        "command": "./notes-server",
        "env": {"NOTE_KEY": "${MCP_TEST_NOTE_KEY}"},
        "max_message_bytes": 1 << 20,
    }
    host, config = configured({"notes": server})  # nothing started on this machine
    assert "key-from-the-environment" not in json.dumps(config.manifest())
    toolset = host.toolsets["mcp:notes"]
    assert toolset.tools == ()  # listed in each session
    script = f"#!/usr/bin/env python3\n{STDLIB_SERVER}".encode()

    async def main() -> None:
        async with (
            local_session(toolset, config, host, sandbox_root, "a") as (a, first),
            local_session(toolset, config, host, sandbox_root, "b") as (b, second),
        ):
            for sandbox in (first, second):
                await sandbox.write_file("notes-server", script)
                await sandbox.exec("chmod +x notes-server", timeout=30)
            await first.write_file("seen-by-a.txt", b"x")
            tools = {tool.name: tool for tool in await toolset.session_tools(a.session, first)}
            assert set(tools) == {"write_note", "list_files", "environment", "flood"}
            await toolset.session_tools(b.session, second)
            assert await tools["write_note"].run({"name": "note.txt", "text": "hi"}, a) == "written"
            assert json.loads(await tools["list_files"].run({}, a)) == [
                "note.txt",
                "notes-server",
                "seen-by-a.txt",
            ]
            assert json.loads(await tools["list_files"].run({}, b)) == ["notes-server"]  # b's server
            assert await tools["environment"].run({"name": "NOTE_KEY"}, a) == "key-from-the-environment"
            assert (
                await tools["environment"].run({"name": "MCP_TEST_NOTE_KEY"}, a) == "None"
            )  # only what is named
            assert await first.read_file("note.txt") == b"hi"  # written inside the sandbox
            with pytest.raises(ToolError, match=r"answer was \d+ bytes, more than the 1048576"):
                await tools["flood"].run({"megabytes": 30}, a)  # streamed through, never held whole
            assert len(json.loads(await tools["list_files"].run({}, a))) == 3
            found = await first.exec("ps -eo args | grep -c '^python3 ./notes-server' || true", timeout=30)
            assert found.stdout.strip() == "1"
            await a.session.aclose()
            found = await first.exec("ps -eo args | grep -c '^python3 ./notes-server' || true", timeout=30)
            assert found.stdout.strip() == "0"  # the server ended with its session
            with pytest.raises(ToolError, match="not started in this session"):
                await tools["list_files"].run({}, ToolContext(sandbox=first))

    asyncio.run(main())


def test_a_per_session_server_that_fails_to_start_leaves_its_tools_out(
    sandbox_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    host, config = configured(
        {
            "notes": {"command": "python3", "args": ["-c", STDLIB_SERVER], "start_timeout": 20},
            "broken": {"command": "./bin/server", "start_timeout": 20},
            "absent": {"command": "no-such-mcp-server", "start_timeout": 20},
        }
    )
    drawn = [host.toolsets[name] for name in ("mcp:absent", "mcp:broken", "mcp:notes")]

    async def main() -> None:
        async with local_session(drawn[2], config, host, sandbox_root, "a") as (ctx, sandbox):
            await sandbox.exec(
                "mkdir -p bin && printf '#!/bin/sh\\nexit 1\\n' > bin/server && chmod +x bin/server",
                timeout=30,
            )
            offered = await session_tools(drawn, ctx.session, sandbox, "w-1")
            assert set(offered) == {"mcp:notes"}  # the session goes on with the server that started
            assert json.loads(await offered["mcp:notes"]["list_files"].run({}, ctx)) == ["bin"]

    with caplog.at_level(logging.WARNING, logger="trajkit"):
        asyncio.run(main())
    said = [r.getMessage() for r in caplog.records if "offers no tools in this session" in r.getMessage()]
    assert len(said) == 2
    assert any(m.startswith("w-1: mcp:broken") and "MCP server 'broken' failed to start" in m for m in said)
    assert any(m.startswith("w-1: mcp:absent") for m in said)


def test_names_are_unique_across_toolsets() -> None:
    host = load_plugins()
    server = {
        "command": "python3",
        "args": ["-c", STDLIB_SERVER.replace('"list_files"', '"read_file"')],
        "mode": "shared",
    }
    with pytest.raises(Exception, match=r"tool 'read_file' is registered twice"):
        resolve(host, {"mcp_servers": {"clash": server}})
    prefixed = resolve(host, {"mcp_servers": {"clash": {**server, "prefix": "notes_"}}})
    assert {t.name for t in host.toolsets["mcp:clash"].tools} == {
        "notes_read_file",
        "notes_write_note",
        "notes_environment",
        "notes_flood",
    }
    assert prefixed.tables["mcp_servers"]["clash"].prefix == "notes_"


class Greeter(StrictSettings):
    greeting: str = "hello"


def test_any_plugin_can_declare_a_table_and_build_toolsets_from_it() -> None:
    """The seams the MCP plugin uses are generic: a third-party plugin gets the same."""

    async def greet(args: dict[str, Any], ctx: ToolContext) -> str:
        return "hi"

    def trajkit_configured_toolsets(config: Any) -> list[Toolset]:
        entries = config.tables.get("greeters", {})
        return [
            Toolset(f"greet:{name}", entry.greeting, (Tool(f"greet_{name}", "", {"type": "object"}, greet),))
            for name, entry in entries.items()
        ]

    plugin = plugin_with(
        trajkit_config_tables=lambda: [ConfigTable("greeters", Greeter, "greeter")],
        trajkit_configured_toolsets=trajkit_configured_toolsets,
    )
    host = load_plugins(extra=[("greeters", plugin)])
    config = resolve(host, {"greeters": {"formal": {"greeting": "good day"}}, "toolsets": ["greet:formal"]})
    assert config.tables["greeters"]["formal"].greeting == "good day"
    assert host.toolsets["greet:formal"].description == "good day"
    assert "greet_formal" in host.tools
    assert config.manifest()["tables"] == {"greeters": {"formal": {"greeting": "good day"}}}
    with pytest.raises(ConfigurationError, match=r"greeters.formal.greting: greeter 'formal' has no setting"):
        resolve(host, {"greeters": {"formal": {"greting": "x"}}})
    given_back = resolve(host, {"tables": {"greeters": {"plain": {}}}})  # as a resolved one holds it
    assert given_back.tables["greeters"]["plain"].greeting == "hello"
    with pytest.raises(ConfigurationError, match=r"no installed plugin reads a table \[readers\]"):
        resolve(host, {"tables": {"readers": {}}})
    resolve(host, {})  # a configuration without the table: its toolsets are gone again
    assert "greet:formal" not in host.toolsets


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def hostile_http_server(mode: str) -> Iterator[str]:
    """The hostile server over Streamable HTTP on a loopback port (``--http`` or ``--http-json``):
    its URL, once it answers."""
    import subprocess
    import urllib.request

    port = free_port()
    process = subprocess.Popen(
        [sys.executable, HOSTILE, mode, str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/mcp", timeout=2)
            except urllib.error.HTTPError:
                break  # it answers (a GET without a session is refused)
            except OSError:
                assert time.monotonic() < deadline and process.poll() is None, "the HTTP server did not start"
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.kill()
        process.wait()


def test_a_streamable_http_server_is_shared_and_gets_its_headers(monkeypatch: pytest.MonkeyPatch) -> None:
    with hostile_http_server("--http") as url:
        monkeypatch.setenv("MCP_TEST_TOKEN", "token-from-the-environment")
        server = {
            "url": url,
            "headers": {"X-Test-Token": "${MCP_TEST_TOKEN}"},
            "description": "the hostile server over HTTP",
        }
        host, config = configured({"remote": server})
        toolset = host.toolsets["mcp:remote"]
        assert toolset.description == "the hostile server over HTTP"
        assert config.manifest()["tables"]["mcp_servers"]["remote"]["headers"] == {
            "X-Test-Token": "${MCP_TEST_TOKEN}"
        }

        async def main() -> None:
            run = await open_toolsets([toolset], config, host)
            ctx = ToolContext(sandbox=None, session=ToolSession(run))  # type: ignore[arg-type]
            tools = {tool.name: tool for tool in toolset.tools}
            try:
                assert (
                    await tools["header"].run({"name": "x-test-token"}, ctx) == "token-from-the-environment"
                )
                assert await tools["count"].run({}, ctx) == "1"
            finally:
                await run.aclose()

        asyncio.run(main())


def test_a_plain_json_answer_over_http_is_read_up_to_max_message_bytes() -> None:
    """A Streamable HTTP server answering 100 MB of plain JSON: the call fails once the answer
    passes ``max_message_bytes``, never held whole, and the server's other tools still answer."""
    import resource

    with hostile_http_server("--http-json") as url:
        host, config = configured({"remote": {"url": url, "timeout": 120}})
        toolset = host.toolsets["mcp:remote"]
        tools = {tool.name: tool for tool in toolset.tools}

        async def main() -> None:
            run = await open_toolsets([toolset], config, host)
            ctx = ToolContext(sandbox=None, timeout=120, session=ToolSession(run))  # type: ignore[arg-type]
            try:
                assert await tools["count"].run({}, ctx) == "1"
                peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
                with pytest.raises(ToolError, match=r"the answer was more than the 1048576 bytes taken"):
                    await tools["flood"].run({"megabytes": 100}, ctx)
                grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak
                assert grown < 50 * 1024, f"the runner grew by {grown} KiB"
                assert await tools["count"].run({}, ctx) == "2"  # the same server, still answering
            finally:
                await run.aclose()

        asyncio.run(main())


def test_the_http_client_refuses_a_compressed_json_answer_and_asks_for_none() -> None:
    """A gzip answer 1 KiB long on the wire could be a gigabyte once decoded: refused unread."""
    import gzip
    import http.server
    import threading

    import httpx2

    from trajkit.plugins.mcp.transport import http_client

    asked: list[str | None] = []

    class Answers(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            asked.append(self.headers.get("Accept-Encoding"))
            body = json.dumps({"jsonrpc": "2.0", "id": 1, "result": {"text": "x" * 5000}}).encode()
            packed = self.path == "/gzip"
            body = gzip.compress(body) if packed else body
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            if packed:
                self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"

    async def main() -> None:
        async with http_client({"X-Test": "1"}, 8192) as client:
            plain = await client.post(f"{base}/plain", json={})
            assert len(await plain.aread()) > 5000  # within the bound
            async with client.stream("POST", f"{base}/gzip", json={}) as packed:
                with pytest.raises(httpx2.StreamError, match=r"compressed \(gzip\), which was not asked"):
                    await packed.aread()
        async with http_client({}, 1024) as client:
            with pytest.raises(httpx2.StreamError, match="more than the 1024 bytes taken"):
                await client.post(f"{base}/plain", json={})

    try:
        asyncio.run(main())
    finally:
        server.shutdown()
        server.server_close()
    assert set(asked) == {"identity"}


def test_trajkit_toolsets_lists_what_each_server_offers(tmp_path: Path) -> None:
    config = tmp_path / "servers.toml"
    config.write_text(
        f'[mcp_servers.time]\ncommand = {json.dumps(TIME_SERVER)}\nmode = "shared"\n'
        f'[mcp_servers.notes]\ncommand = "python3"\nargs = ["-c", {json.dumps(STDLIB_SERVER)}]\n'
        '[mcp_servers.absent]\ncommand = "./only-in-the-image"\n'
    )
    result = trajkit("toolsets", "--config", str(config), "--json")
    assert result.returncode == 0, result.stderr
    listed = {entry["toolset"]: entry for entry in map(json.loads, result.stdout.splitlines())}
    assert listed["mcp:time"]["tools"] == {
        "get_current_time": "Get current time in a specific timezone.",
        "convert_time": "Convert time between timezones.",
    }
    assert "shared by every session" in listed["mcp:time"]["description"]
    assert "one per session, in its sandbox" in listed["mcp:notes"]["description"]
    assert "terminal" in listed and listed["terminal"]["problem"] is None
    assert listed["mcp:time"]["note"] is None
    assert listed["mcp:notes"]["note"] == "listed in each session's sandbox; as started on this machine"
    assert listed["mcp:absent"]["tools"] == {}
    assert listed["mcp:absent"]["note"] == (
        "listed in each session's sandbox; on this machine: "
        "MCP server 'absent' failed to start: ServerFailed: './only-in-the-image' is not a program "
        "on this machine's PATH"
    )
    text = trajkit("toolsets", "--config", str(config))
    assert "mcp:notes: the tools of the MCP server 'notes'" in text.stdout
    assert "  (listed in each session's sandbox; as started on this machine)" in text.stdout
    assert "  write_note: Write a note to a file of the working directory." in text.stdout


def git_server_mounts() -> list[str]:
    """The directories outside the system's that this Python and its ``mcp_server_git`` need, for
    a confined local sandbox to see them read-only."""
    import mcp_server_git

    needed = {sys.prefix, sys.base_prefix, str(Path(mcp_server_git.__file__).parents[1])}
    system = ("/usr", "/etc", "/bin", "/lib", "/sbin")
    return sorted(path for path in needed if not path.startswith(system))


def reachable_by_anyone(path: str) -> bool:
    """Whether a user of no group of the path's can reach ``path`` (a confined sandbox's can)."""
    return all(os.stat(part).st_mode & 0o001 for part in (path, *map(str, Path(path).parents)))


def test_mcp_server_git_per_session_over_the_repository_in_its_sandbox(sandbox_root: Path) -> None:
    """``mcp-server-git --repository .``: a server that starts only where the session's repository
    is, listed and called in the session's sandbox, whose working directory is that repository
    (a confined one when this Python is where its user can reach it, as under /usr; else, as
    under root's home, the unconfined one)."""
    server = {"command": sys.executable, "args": ["-m", "mcp_server_git", "--repository", "."]}
    host, config = configured({"git": server})
    toolset = host.toolsets["mcp:git"]
    mounts = git_server_mounts()
    confined = all(map(reachable_by_anyone, mounts))
    options = {"read_only": ",".join(mounts)} if confined else {"isolation": "none"}

    async def main() -> None:
        run = await open_toolsets([toolset], config, host)
        backend = LocalBackend({"root": str(sandbox_root), **options})
        sandbox = await backend.create(SandboxSpec(run_id="mcp-test", work_id="git", cwd="/repo"))
        session = ToolSession(run)
        ctx = ToolContext(sandbox=sandbox, session=session)
        try:
            made = await sandbox.exec(
                "git init -q . && echo one > a.txt && git add a.txt && "
                "git -c user.name=T -c user.email=t@example.com commit -qm 'the first commit' && echo two > b.txt",
                timeout=60,
            )
            assert made.exit_code == 0, made.stderr
            tools = {tool.name: tool for tool in await toolset.session_tools(session, sandbox)}
            assert {"git_status", "git_log", "git_commit", "git_add"} <= set(tools)
            status = await tools["git_status"].run({"repo_path": "."}, ctx)
            assert "b.txt" in status and "Untracked" in status
            assert "the first commit" in await tools["git_log"].run({"repo_path": "."}, ctx)
            with pytest.raises(ToolError, match="outside the allowed repository"):
                await tools["git_status"].run({"repo_path": "/etc"}, ctx)
            committed = await tools["git_add"].run({"repo_path": ".", "files": ["b.txt"]}, ctx)
            assert "staged" in committed.lower()
            assert (await sandbox.exec("git status --short", timeout=30)).stdout.strip() == "A  b.txt"
        finally:
            await session.aclose()
            await sandbox.close()
            await run.aclose()
            await backend.aclose()

    asyncio.run(main())
