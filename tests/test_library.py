"""The agent loop as a library, with the offline model and against the HTTP test server."""

from __future__ import annotations

import pytest

from trajkit.library import Agent
from trajkit.plugins.browser import toolset as browser
from trajkit.testing.openai_server import OpenAITestServer, tool_script_policy


def test_chat_uses_only_the_enabled_toolsets() -> None:
    agent = Agent(model="scripted", enabled_toolsets=["terminal"])
    result = agent.run_conversation("Make a note")
    assert result.completed and result.final_response
    called = [c["function"]["name"] for m in result.messages for c in m.get("tool_calls") or []]
    assert called == ["terminal", "terminal"]
    assert result.tool_stats["terminal"].success == 2
    assert agent.chat("again").startswith("I completed the task")


def test_disabled_toolsets_and_unknown_names() -> None:
    agent = Agent(disabled_toolsets=["terminal", "code", "browser"])
    # web (no search provider) and image_gen (no endpoint) cannot be offered as configured
    assert sorted(agent.tools) == ["patch", "read_file", "search_files", "vision_analyze", "write_file"]
    with pytest.raises(ValueError, match="no installed plugin provides toolset 'spreadsheet'"):
        Agent(enabled_toolsets=["spreadsheet"])
    with pytest.raises(ValueError, match=r"toolset 'fiel' \(did you mean file\?\)"):
        Agent(disabled_toolsets=["fiel"])
    assert sorted(Agent(enabled_toolsets=["file", "code"], disabled_toolsets=["code"]).tools) == [
        "patch",
        "read_file",
        "search_files",
        "write_file",
    ]


def test_a_distribution_is_drawn_per_conversation_over_what_can_be_offered() -> None:
    """The library takes the run's distribution setting like any other; toolsets that cannot be
    offered here are left out of its draw as in a run."""
    with pytest.raises(ValueError, match=r"no search provider is set: pass --web\.search_provider NAME"):
        Agent(distribution="development")  # it draws web, which cannot run without a provider
    searching = {"toolset_options": {"web": {"search_provider": "searxng"}}}
    agent = Agent(
        distribution="development", search_options={"searxng": {"url": "http://localhost:8888"}}, **searching
    )
    assert sorted(toolset.name for toolset in agent.toolsets) == ["file", "terminal", "vision", "web"]
    assert not agent.offer.left_out
    mixed = Agent(distribution="mixed_tasks", **searching)
    no_browser = browser.BROWSER.problem(browser.BrowserSettings()) is not None  # no Chromium here
    assert mixed.offer.left_out.keys() == {"image_gen"} | ({"browser"} if no_browser else set())
    with pytest.raises(ValueError, match="pass one of them"):
        Agent(distribution="development", enabled_toolsets=["file"])


def test_parallel_calls_and_max_turns_against_a_real_endpoint() -> None:
    def parallel(body: dict) -> dict:
        calls = [
            {
                "id": "same",
                "type": "function",
                "function": {"name": "terminal", "arguments": '{"command": "echo a"}'},
            },
            {
                "id": "same",
                "type": "function",
                "function": {"name": "terminal", "arguments": '{"command": "echo b"}'},
            },
        ]
        return {"content": None, "reasoning": "two at once", "tool_calls": calls}

    with OpenAITestServer(parallel) as server:
        agent = Agent(model="m", base_url=server.base_url, enabled_toolsets=["terminal"], max_turns=2)
        result = agent.run_conversation("go")
    assert not result.completed and result.finish_reason == "max_turns"
    assert result.api_calls == 2 and result.tool_stats["terminal"].count == 4
    ids = [c["id"] for m in result.messages for c in m.get("tool_calls") or []]
    answered = [m["tool_call_id"] for m in result.messages if m["role"] == "tool"]
    assert ids == answered and len(set(ids)) == 4, "every call needs a unique id answered once"
    outputs = [m["content"] for m in result.messages if m["role"] == "tool"]
    assert '"output": "a\\n"' in outputs[0] and '"output": "b\\n"' in outputs[1]


def test_tool_script_against_the_server_counts_turns() -> None:
    with OpenAITestServer(tool_script_policy(calls=3, tool="terminal")) as server:
        result = Agent(model="m", base_url=server.base_url, enabled_toolsets=["terminal"]).run_conversation(
            "x"
        )
    assert result.completed and result.api_calls == 4
    assert result.tool_stats["terminal"].success == 3
