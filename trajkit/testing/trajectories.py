"""Synthetic trajectory records for compression tests and benchmarks, in both record shapes.

``trajkit_record`` has trajkit's own turns (structured ``tool_calls``, ``tool_call_id`` on tool
turns, every turn field present); ``reference_record`` has the reference runner's turns
(``{from, value}`` only, ``<tool_call>``/``<tool_response>`` text blocks, parallel results in one
tool turn). Both are deterministic functions of their arguments.
"""

from __future__ import annotations

import json
from typing import Any

SYSTEM = "You are a capable assistant working in a sandboxed environment."


def _turn(kind: str, value: str, **extra: Any) -> dict[str, Any]:
    return {
        "from": kind,
        "value": value,
        "reasoning": None,
        "tool_calls": [],
        "tool_call_id": None,
        "name": None,
        **extra,
    }


def tool_output(index: int, step: int, call: int, lines: int) -> str:
    rows = "".join(f"r{index}.{step}.{call} line {n}: {'x' * 40}\n" for n in range(lines))
    return json.dumps({"exit_code": 0, "output": rows})


def trajkit_record(
    index: int,
    steps: int = 12,
    parallel: int = 2,
    lines: int = 20,
    *,
    answer_first: int = 0,
) -> dict[str, Any]:
    """A record of ``steps`` gpt turns with ``parallel`` calls each, every call answered.

    ``answer_first`` gpt turns without tool calls come before the first tool call, so the first
    tool turn can come late in the conversation.
    """
    turns = [_turn("system", SYSTEM), _turn("human", f"Task {index}: inspect the repository and fix it")]
    for chat in range(answer_first):
        turns.append(_turn("gpt", f"Thinking about the task, part {chat}.", reasoning="Plan first."))
        turns.append(_turn("human", f"Go on ({chat})."))
    for step in range(steps):
        calls = [
            {
                "id": f"call_{step}_{c}",
                "name": "terminal",
                "arguments": json.dumps({"command": f"ls {step} {c}"}),
            }
            for c in range(parallel)
        ]
        turns.append(_turn("gpt", "", reasoning=f"Step {step}: look around.", tool_calls=calls))
        for c, call in enumerate(calls):
            turns.append(
                _turn("tool", tool_output(index, step, c, lines), tool_call_id=call["id"], name="terminal")
            )
    turns.append(_turn("gpt", f"Done with task {index}.", reasoning="All steps succeeded."))
    return _record(index, turns, steps, parallel)


def reference_record(index: int, steps: int = 10, parallel: int = 2, lines: int = 20) -> dict[str, Any]:
    """The reference runner's record: text blocks for calls and results, no structured fields."""
    turns = [
        {"from": "system", "value": SYSTEM + "\n<tools>[...]</tools>"},
        {"from": "human", "value": f"Task {index}: inspect the repository and fix it"},
    ]
    for step in range(steps):
        calls = "".join(
            "<tool_call>\n"
            + json.dumps({"name": "terminal", "arguments": {"command": f"ls {step} {c}"}})
            + "\n</tool_call>\n"
            for c in range(parallel)
        )
        turns.append({"from": "gpt", "value": f"<think>\nStep {step}.\n</think>\n{calls}"})
        results = "\n".join(
            "<tool_response>\n"
            + json.dumps(
                {
                    "tool_call_id": f"call_{step}_{c}",
                    "name": "terminal",
                    "content": json.loads(tool_output(index, step, c, lines)),
                }
            )
            + "\n</tool_response>"
            for c in range(parallel)
        )
        turns.append({"from": "tool", "value": results})
    turns.append({"from": "gpt", "value": f"<think>\nDone.\n</think>\nTask {index} is done."})
    return _record(index, turns, steps, parallel)


def _record(index: int, turns: list[dict[str, Any]], steps: int, parallel: int) -> dict[str, Any]:
    """A finished record of ``turns``: ``steps`` model turns of ``parallel`` terminal calls each, then the answer."""
    return {
        "prompt_index": index,
        "conversations": turns,
        "metadata": {"batch_num": 0, "model": "test/model"},
        "completed": True,
        "partial": False,
        "api_calls": steps + 1,
        "toolsets_used": ["terminal"],
        "tool_stats": {"terminal": {"count": steps * parallel, "success": steps * parallel, "failure": 0}},
        "tool_error_counts": {"terminal": 0},
    }
