"""A third-party toolset with settings, run-wide resources and per-session state: its settings are
flags and configuration keys like any plugin's, it is started once per run, its tools keep state
between calls of one session only, and what it opened is closed, sessions before the run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import plugin_env, read_jsonl, trajkit, write_jsonl

TALLY_PLUGIN = '''
    import json
    import os

    from pydantic import Field

    from trajkit import hookimpl
    from trajkit.tools.distributions import Distribution
    from trajkit.model import AssistantMessage, ModelClient, ToolCall
    from trajkit.config.settings import StrictSettings
    from trajkit.tools import Tool, Toolset, ToolsetError

    EVENTS = os.environ["TALLY_EVENTS"]


    def event(text):
        with open(EVENTS, "a") as handle:
            handle.write(text + "\\n")


    class TallySettings(StrictSettings):
        step: int = Field(1, ge=1)
        """How much every call adds."""
        fail_start: bool = False
        """Refuse to start (for the test of a toolset that cannot start)."""


    async def tally(args, ctx):
        shared = ctx.session.run.resources["tally"]
        shared["calls"] += 1
        state = ctx.session.state.get("tally")
        if state is None:
            state = ctx.session.state["tally"] = {"total": 0}
            async def closed():
                event(f"session-closed total={state['total']} sandbox-open={not ctx.sandbox.closed}")
            ctx.session.on_close(closed)
        state["total"] += ctx.session.run.settings_of(TALLY).step
        return json.dumps({"total": state["total"], "run_calls": shared["calls"]})


    class TallyToolset(Toolset):
        Settings = TallySettings

        async def start(self, run):
            settings = run.settings_of(self)
            if settings.fail_start:
                raise ToolsetError("tally: the counter service is down")
            event("run-started")
            run.resources[self.name] = {"calls": 0}
            async def closed():
                event(f"run-closed calls={run.resources[self.name]['calls']}")
            run.on_close(closed)


    TALLY = TallyToolset(
        "tally", "count things", (Tool("tally", "Add to the total.", {"type": "object"}, tally),)
    )


    class TallyModel(ModelClient):
        name = "tallier"
        description = "calls tally twice, then answers with what it saw"

        @classmethod
        def from_config(cls, config):
            return cls()

        async def complete(self, messages, tools, params=None):
            results = [m["content"] for m in messages if m["role"] == "tool"]
            if len(results) < 2:
                return AssistantMessage(
                    reasoning="count", tool_calls=[ToolCall(f"c{len(results)}", "tally", "{}")]
                )
            return AssistantMessage(content=" | ".join(results), reasoning="done")


    @hookimpl
    def trajkit_toolsets():
        return [TALLY]


    @hookimpl
    def trajkit_distributions():
        return [Distribution("tally_only", "the tally toolset", {"tally": 1.0})]


    @hookimpl
    def trajkit_model_clients():
        return [TallyModel]
'''


@pytest.fixture
def tally(tmp_path: Path) -> dict[str, str]:
    return {**plugin_env(tmp_path, "tally", TALLY_PLUGIN), "TALLY_EVENTS": str(tmp_path / "events.txt")}


def run_tally(tmp_path: Path, env: dict[str, str], *flags: str) -> tuple[int, str]:
    dataset = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "count"}, {"prompt": "count again"}])
    result = trajkit(
        "run", "--dataset_file", str(dataset), "--run_name", "t", "--output_dir", str(tmp_path),
        "--model", "tallier", "--distribution", "tally_only", "--num_workers", "1", "--quiet", *flags,
        env=env, subprocess=True,
    )  # fmt: skip
    return result.returncode, result.stderr


def test_toolset_settings_state_and_lifecycle(tmp_path: Path, tally: dict[str, str]) -> None:
    code, stderr = run_tally(tmp_path, tally, "--tally.step", "5")
    assert code == 0, stderr
    answers = [json.loads(f"[{r['conversations'][-1]['value'].replace(' | ', ',')}]") for r in
               read_jsonl(tmp_path / "t" / "trajectories.jsonl")]  # fmt: skip
    # per session: the total starts again; per run: the calls go on counting across sessions
    assert sorted(tuple(result["total"] for result in answer) for answer in answers) == [(5, 10), (5, 10)]
    assert sorted(result["run_calls"] for answer in answers for result in answer) == [1, 2, 3, 4]
    events = (tmp_path / "events.txt").read_text().splitlines()
    assert events == [
        "run-started",
        "session-closed total=10 sandbox-open=True",
        "session-closed total=10 sandbox-open=True",
        "run-closed calls=4",
    ]
    saved = json.loads((tmp_path / "t" / "run.json").read_text())["config"]
    assert saved["toolset_options"]["tally"]["step"] == 5


def test_toolset_settings_come_from_the_configuration_file_too(tmp_path: Path, tally: dict[str, str]) -> None:
    config = tmp_path / "run.toml"
    config.write_text("[toolset_options.tally]\nstep = 3\n")
    code, stderr = run_tally(tmp_path, tally, "--config", str(config))
    assert code == 0, stderr
    [first, _] = read_jsonl(tmp_path / "t" / "trajectories.jsonl")
    assert '"total": 6' in first["conversations"][-1]["value"]

    config.write_text("[toolset_options.tally]\nstep = 0\n")
    code, stderr = run_tally(tmp_path, tally, "--config", str(config), "--overwrite")
    assert code == 2
    assert "toolset_options.tally.step=0: toolset 'tally' expects step to be int >= 1" in stderr


def test_a_toolset_that_cannot_start_stops_the_run_before_any_session(
    tmp_path: Path, tally: dict[str, str]
) -> None:
    code, stderr = run_tally(tmp_path, tally, "--tally.fail_start")
    assert code == 2, stderr
    assert "tally: the counter service is down" in stderr
    assert not (tmp_path / "events.txt").exists()
    assert not (tmp_path / "t" / "trajectories.jsonl").exists() or not read_jsonl(
        tmp_path / "t" / "trajectories.jsonl"
    )


def test_tools_learnt_per_session_are_offered_and_a_toolset_that_cannot_is_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``Toolset.session_tools``: each drawn toolset is asked in the session, with its sandbox; a
    ``ToolsetError`` leaves that toolset out (said with the work id), a name another toolset
    has is left out, any other error is the session's."""
    import asyncio
    import logging
    from dataclasses import dataclass
    from typing import Any

    from trajkit.tools import Tool, ToolSession, Toolset, ToolsetError, flat_tools, session_tools

    async def answer(args: dict[str, Any], ctx: Any) -> str:
        return "ok"

    def tool(name: str) -> Tool:
        return Tool(name, "", {"type": "object"}, answer)

    @dataclass(frozen=True)
    class Learnt(Toolset):
        failure: str = ""

        async def session_tools(self, session: ToolSession, sandbox: Any) -> tuple[Tool, ...]:
            session.state[self.name] = sandbox
            if self.failure == "toolset":
                raise ToolsetError("its server did not start")
            if self.failure == "bug":
                raise RuntimeError("a bug")
            return (tool(f"{sandbox}_tool"), tool("shared_name"))

    plain = Toolset("plain", "", (tool("shared_name"), tool("plain_tool")))
    learnt, broken = Learnt("learnt", "", ()), Learnt("broken", "", (), failure="toolset")
    session = ToolSession()

    with caplog.at_level(logging.WARNING, logger="trajkit"):
        offered = asyncio.run(session_tools([plain, broken, learnt], session, "box", "w-7"))
    assert {name: list(tools) for name, tools in offered.items()} == {
        "plain": ["shared_name", "plain_tool"],
        "learnt": ["box_tool"],  # its shared_name is plain's
    }
    assert list(flat_tools(offered)) == ["shared_name", "plain_tool", "box_tool"]
    assert session.state == {"broken": "box", "learnt": "box"}
    said = [record.getMessage() for record in caplog.records]
    assert "w-7: broken offers no tools in this session: its server did not start" in said
    assert "w-7: learnt: tool 'shared_name' left out: another toolset has it" in said
    with pytest.raises(RuntimeError, match="a bug"):
        asyncio.run(session_tools([Learnt("buggy", "", (), failure="bug")], ToolSession(), "box"))
    assert asyncio.run(plain.listed_tools()) == (plain.tools, None)
