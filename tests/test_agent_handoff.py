"""The agent loop's additions for ``trajkit serve``: a conversation as input, the caller's own tools,
progress callbacks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trajkit.agent import Session, run_conversation
from trajkit.model import AssistantMessage, Message, ModelClient, parse_assistant_message
from trajkit.plugins.local.sandbox import LocalBackend
from trajkit.sandbox import SandboxSpec
from trajkit.tools import Tool

CLIENT_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


class Script(ModelClient):
    """Answers from a list, and keeps what it was sent."""

    name = "script"

    def __init__(self, replies: list[dict[str, Any]]) -> None:
        self.replies = replies
        self.sent: list[tuple[list[Message], list[str]]] = []

    @classmethod
    def from_config(cls, config: Any) -> Script:
        raise NotImplementedError

    async def complete(self, messages: list[Message], tools: list[dict[str, Any]]) -> AssistantMessage:
        self.sent.append(([dict(m) for m in messages], [t["function"]["name"] for t in tools]))
        reply = self.replies[len(self.sent) - 1]
        return parse_assistant_message(reply, {"prompt_tokens": 1, "completion_tokens": 1}, None)


def call(ident: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": ident, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


async def session_with(tmp_path: Path, client: Script, **extra: Any) -> tuple[Session, Any]:
    from trajkit.plugins.toolsets import TERMINAL

    backend = LocalBackend({"root": str(tmp_path / "sbx"), "isolation": "none"})
    sandbox = await backend.create(SandboxSpec(run_id="t", work_id="0"))
    tools: dict[str, Tool] = {t.name: t for t in TERMINAL.tools}
    return Session(
        client=client, sandbox=sandbox, tools=tools, known_tools=frozenset(tools), **extra
    ), sandbox


async def test_a_call_to_a_client_tool_ends_the_turn_and_drops_the_agents_calls_beside_it(
    tmp_path: Path,
) -> None:
    client = Script(
        [
            {"content": "", "tool_calls": [call("a", "terminal", {"command": "echo hi"})]},
            {
                "content": "asking",
                "tool_calls": [call("b", "terminal", {"command": "true"}), call("c", "get_weather", {})],
            },
        ]
    )
    events: list[tuple[str, str]] = []
    replies: list[AssistantMessage] = []
    session, sandbox = await session_with(
        tmp_path,
        client,
        client_tools=[CLIENT_TOOL],
        on_tool=lambda c, s: events.append((c.id, s)),
        on_reply=replies.append,
    )
    try:
        result = await run_conversation(session, [{"role": "user", "content": "weather?"}])
    finally:
        await sandbox.close()
    assert "get_weather" in client.sent[0][1] and "terminal" in client.sent[0][1]
    assert [(c.id, c.name) for c in result.client_tool_calls] == [("c", "get_weather")]
    assert result.finish_reason == "tool_calls" and not result.completed and result.final_response == "asking"
    assert events == [("a", "running"), ("a", "completed")]  # "b" never ran
    assert len(replies) == 2 and [c.name for c in replies[1].tool_calls] == ["get_weather"]
    assert result.messages[-1]["tool_calls"] == [
        {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    ]


async def test_a_conversation_continues_from_its_last_turn_with_fresh_call_ids(tmp_path: Path) -> None:
    history: list[Message] = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [call("call_1_0", "get_weather", {})]},
        {"role": "tool", "tool_call_id": "call_1_0", "content": "sunny"},
    ]
    client = Script(
        [
            {
                "content": "",
                "tool_calls": [{"type": "function", "function": {"name": "terminal", "arguments": "{}"}}],
            },
            {"content": "It is sunny."},
        ]
    )
    statuses: list[str] = []
    session, sandbox = await session_with(tmp_path, client, on_tool=lambda c, s: statuses.append(s))
    try:
        result = await run_conversation(session, history)
    finally:
        await sandbox.close()
    assert client.sent[0][0][-3:] == history
    new_call = result.messages[-3]["tool_calls"][0]
    assert new_call["id"] != "call_1_0"  # an id the conversation already used is never reused
    assert statuses == ["running", "failed"]  # a call without its command fails, and says so
    assert result.completed and result.final_response == "It is sunny."
    assert result.messages[:3] == history
