"""The ``terminal`` toolset's behaviour on a backend, shipped so every backend runs the same tests.

Use it beside :class:`trajkit.testing.sandbox_conformance.SandboxConformance`, with the same
harness::

    class TestMyBackendTerminal(TerminalConformance):
        @pytest.fixture
        def harness(self):
            return MyHarness()

The tools are called as a session calls them (a :class:`~trajkit.tools.ToolContext` with a
session of its own), so what is checked is what a model sees: state that carries over between
calls, a shell that survives a timeout, and background processes that are listed, read, written
to, killed, and gone when the session ends.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from trajkit.plugins.toolsets import TERMINAL, TerminalSettings, process, terminal
from trajkit.sandbox import SandboxSpec
from trajkit.testing.sandbox_conformance import BackendHarness, run, survivors
from trajkit.tools import ToolContext, ToolError, ToolRun, ToolSession

POLL_DEADLINE = 30.0


class Terminal:
    """One session's ``terminal`` and ``process`` tools on one sandbox."""

    def __init__(self, context: ToolContext) -> None:
        self.context = context

    async def run(self, command: str, **args: Any) -> dict[str, Any]:
        return json.loads(await terminal({"command": command, **args}, self.context))

    async def process(self, action: str, **args: Any) -> dict[str, Any]:
        return json.loads(await process({"action": action, **args}, self.context))

    async def output_until(self, session_id: str, text: str) -> str:
        """Poll until the output shown so far holds ``text``; all of that output."""
        seen = ""
        deadline = time.monotonic() + POLL_DEADLINE
        while text not in seen:
            assert time.monotonic() < deadline, f"no {text!r} in {seen!r}"
            seen += (await self.process("poll", session_id=session_id))["output"]
            await asyncio.sleep(0.1)
        return seen


class TerminalConformance:
    """What the terminal toolset does on every backend. Subclasses provide a ``harness`` fixture."""

    @asynccontextmanager
    async def terminal(self, harness: BackendHarness, **settings: Any) -> AsyncIterator[Terminal]:
        backend = harness.make_backend()
        spec = SandboxSpec(run_id=f"terminal-{uuid.uuid4().hex[:8]}", work_id="w0", image=harness.image)
        if harness.image:
            await backend.verify_image(harness.image)
        sandbox = await backend.create(spec)
        session = ToolSession(ToolRun(settings={TERMINAL.name: TerminalSettings(**settings)}))
        try:
            yield Terminal(ToolContext(sandbox, timeout=60.0, output_cap=16 * 1024, session=session))
        finally:
            await session.aclose()
            await sandbox.close()
            await backend.aclose()

    def test_directory_and_exported_variables_carry_over(self, harness: BackendHarness) -> None:
        async def body() -> None:
            async with self.terminal(harness) as term:
                await term.run("mkdir -p sub/deeper")
                assert (await term.run("cd sub && export A=1 && B=2"))["exit_code"] == 0
                carried = await term.run('pwd; echo "$A"; echo "${B:-unset}"')
                cwd = term.context.sandbox.cwd.rstrip("/")
                assert carried["output"] == f"{cwd}/sub\n1\nunset\n"
                # A directory for one call, and a call that ends with `exit`.
                assert (await term.run("pwd", workdir="/"))["output"] == "/\n"
                ended = await term.run("cd deeper; export C=3; exit 7")
                assert ended["exit_code"] == 7
                assert (await term.run('pwd; echo "$A$C"'))["output"] == f"{cwd}/sub/deeper\n13\n"

        run(body)

    def test_the_shells_messages_are_the_commands_own(self, harness: BackendHarness) -> None:
        """Nothing trajkit runs around a command shows in what the model reads: errors give the
        command's own line numbers and quote its own text."""

        async def body() -> None:
            async with self.terminal(harness) as term:
                missing = await term.run("true; trajkit_no_such_command")
                assert missing["exit_code"] == 127
                # bash: "line 1: X", dash: "1: eval: X"; BusyBox numbers an eval's lines its own way
                # ("eval: line 0" for the first, "line 1" for the second)
                assert re.search(r"(\b1: (eval: )?|line 0: )trajkit_no_such_command", missing["output"]), (
                    missing
                )
                broken = await term.run("if then")
                assert broken["exit_code"] == 2 and "then" in broken["output"]
                later = await term.run("true\ntrajkit_no_such_command")
                assert re.search(
                    r"(\b2: (eval: )?|eval: line [01]: )trajkit_no_such_command", later["output"]
                ), later
                for result in (missing, broken, later):
                    assert "__tk" not in result["output"] and "trajkit-terminal" not in result["output"]
                    assert not re.search(r"\b([3-9]|\d\d+): ", result["output"]), result

        run(body)

    def test_a_timeout_kills_the_command_and_keeps_the_shell(self, harness: BackendHarness) -> None:
        marker = str(random.randint(10_000, 99_999))

        async def body() -> None:
            async with self.terminal(harness) as term:
                await term.run("mkdir -p kept && cd kept && export KEPT=yes")
                started = time.monotonic()
                with pytest.raises(ToolError, match="timed out after 1s"):
                    await term.run(f"echo partial; sleep {marker}1 & sleep {marker}2", timeout=1)
                assert time.monotonic() - started < 20
                after = await term.run('basename "$PWD"; echo "$KEPT"')
                assert after["output"] == "kept\nyes\n"
                assert await survivors(term.context.sandbox, marker) == []

        run(body)

    def test_one_shot_calls_when_the_state_is_off(self, harness: BackendHarness) -> None:
        async def body() -> None:
            async with self.terminal(harness, persistent=False) as term:
                await term.run("mkdir -p sub && cd sub && export A=1")
                fresh = await term.run('pwd; echo "${A:-unset}"')
                assert fresh["output"] == f"{term.context.sandbox.cwd}\nunset\n"

        run(body)

    def test_a_background_process_is_listed_read_written_and_closed(self, harness: BackendHarness) -> None:
        async def body() -> None:
            async with self.terminal(harness) as term:
                await term.run("export GREETING=hello")
                command = 'echo "up $GREETING"; while read -r line; do echo "got $line"; done; echo eof'
                started = await term.run(command, background=True)
                sid = started["session_id"]
                assert started["status"] == "running"
                listed = (await term.process("list"))["processes"]
                assert [(p["session_id"], p["status"]) for p in listed] == [(sid, "running")]
                assert "up hello" in await term.output_until(sid, "up hello")
                await term.process("submit", session_id=sid[:8], data="one")
                await term.process("write", session_id=sid, data="two\n")
                assert "got two" in await term.output_until(sid, "got two")
                await term.process("close", session_id=sid)
                ended = await term.process("wait", session_id=sid, timeout=30)
                assert (ended["status"], ended["exit_code"]) == ("exited", 0)
                log = await term.process("log", session_id=sid)
                assert log["output"] == "up hello\ngot one\ngot two\neof\n"
                assert (await term.process("log", session_id=sid, offset=1, limit=1))["output"] == "got one\n"

        run(body)

    def test_background_processes_are_killed_and_end_with_the_session(self, harness: BackendHarness) -> None:
        marker = str(random.randint(10_000, 99_999))

        async def body() -> None:
            async with self.terminal(harness) as term:
                killed = (await term.run(f"sleep {marker}1", background=True))["session_id"]
                (await term.run(f"sleep {marker}2 & sleep {marker}3", background=True))["session_id"]
                waited = await term.process("wait", session_id=killed, timeout=1)
                assert waited["status"] == "running"
                assert (await term.process("kill", session_id=killed))["status"] == "exited"
                left = await survivors(term.context.sandbox, marker)
                assert not any(f"sleep {marker}1" in line for line in left), left
                assert any(f"sleep {marker}3" in line for line in left), left
                with pytest.raises(ToolError, match="no background process"):
                    await term.process("poll", session_id="proc_nosuch")
                await term.context.session.aclose()  # the session ends: its processes with it
                assert await survivors(term.context.sandbox, marker) == []

        run(body)

    def test_a_background_processs_output_is_kept_within_bounds(self, harness: BackendHarness) -> None:
        async def body() -> None:
            async with self.terminal(harness) as term:
                sid = (
                    await term.run("echo FIRST; yes 0123456789 | head -c 3000000; echo LAST", background=True)
                )["session_id"]
                ended = await term.process("wait", session_id=sid, timeout=60)
                assert ended["status"] == "exited"
                assert ended["output"].startswith("FIRST\n") and ended["output"].endswith("LAST\n")
                assert "bytes truncated" in ended["output"]
                assert len(ended["output"]) < 20 * 1024

        run(body)
