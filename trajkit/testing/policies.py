"""Model policies for the test server: the scripted agent, speaking the dialects real endpoints speak.

Directives in the prompt choose the behaviour, so one dataset can exercise them all:

- ``[dialect:reasoning]`` (default), ``[dialect:reasoning_content]``, ``[dialect:details]``,
  ``[dialect:think]``, ``[dialect:scratchpad]``: where the reasoning travels;
  ``[dialect:none]``: no reasoning at all.
- ``[hallucinate]``: the first turn calls a tool that was not offered.
- ``[badargs]``: the first turn calls an offered tool with arguments that are not JSON.
"""

from __future__ import annotations

import re
from typing import Any

from trajkit.plugins.scripted_model import scripted_reply, split_task

DIRECTIVE = re.compile(r"\[(dialect:[a-z_]+|hallucinate|badargs)\]")


def _directives(messages: list[dict[str, Any]]) -> set[str]:
    prompt, _ = split_task(messages)
    return set(DIRECTIVE.findall(prompt))


def _first_turn(messages: list[dict[str, Any]]) -> bool:
    _, since = split_task(messages)
    return not any(m.get("role") == "assistant" for m in since)


def dialect_policy(body: dict[str, Any]) -> dict[str, Any]:
    messages = body["messages"]
    tools = [t["function"]["name"] for t in body.get("tools") or []]
    directives = _directives(messages)
    if _first_turn(messages) and "hallucinate" in directives:
        call = {
            "id": "call_h",
            "type": "function",
            "function": {"name": "web_search", "arguments": '{"q": "x"}'},
        }
        return {"content": None, "reasoning": "I will search the web.", "tool_calls": [call]}
    if _first_turn(messages) and "badargs" in directives and tools:
        call = {"id": "call_b", "type": "function", "function": {"name": tools[0], "arguments": "{not json"}}
        return {"content": None, "reasoning": "Calling a tool.", "tool_calls": [call]}
    reply = scripted_reply(messages, tools)
    reply.pop("role", None)
    reasoning = reply.pop("reasoning")
    dialect = next((d.split(":")[1] for d in directives if d.startswith("dialect:")), "reasoning")
    if dialect == "reasoning":
        reply["reasoning"] = reasoning
    elif dialect == "reasoning_content":
        reply["reasoning_content"] = reasoning
    elif dialect == "details":
        reply["reasoning_details"] = [{"type": "reasoning.text", "text": reasoning}]
    elif dialect == "think":
        reply["content"] = f"<think>{reasoning}</think>{reply.get('content') or ''}"
    elif dialect == "scratchpad":
        reply["content"] = (
            f"<REASONING_SCRATCHPAD>{reasoning}</REASONING_SCRATCHPAD>\n{reply.get('content') or ''}"
        )
    return reply
