"""Model policies for the test server: the scripted agent, speaking the dialects real endpoints speak.

Directives in the prompt choose the behaviour, so one dataset can exercise them all:

- ``[dialect:reasoning]`` (default), ``[dialect:reasoning_content]``, ``[dialect:details]``,
  ``[dialect:think]``, ``[dialect:scratchpad]``: where the reasoning travels;
  ``[dialect:none]``: no reasoning at all.
- ``[hallucinate]``: the first turn calls a tool that was not offered.
- ``[badargs]``: the first turn calls an offered tool with arguments that are not JSON.
- ``[overflow]``: once a tool result is in the conversation, the request is refused as longer
  than the model's context, with OpenAI's 400 ``context_length_exceeded``
  (:data:`CONTEXT_OVERFLOW`).

:class:`GradedPolicy` is another model: one whose pass counts are known before it runs, per model
name, for tests of evaluations (``trajkit compare``).
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trajkit.plugins.scripted_model import scripted_reply, split_task

DIRECTIVE = re.compile(r"\[(dialect:[a-z_]+|hallucinate|badargs|overflow)\]")
CONTEXT_OVERFLOW = {
    "message": "This model's maximum context length is 8192 tokens. However, your messages resulted in "
    "9105 tokens. Please reduce the length of the messages.",
    "type": "invalid_request_error",
    "param": "messages",
    "code": "context_length_exceeded",
}
"""OpenAI's answer (with status 400) to a conversation longer than the model's context."""


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
    if "overflow" in directives and any(m.get("role") == "tool" for m in messages):
        return {"_status": 400, "_error": CONTEXT_OVERFLOW}
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


# -- models of known skill, for evaluations ------------------------------------------------------

TASK = re.compile(r"\[task:([\w.-]+)\]")
ANSWER = re.compile(r"\[answer:([^\]]*)\]")
TOUCH = re.compile(r"\[touch:([\w.-]+)\]")
SOLVE, MISS = "# solve", "# miss"


@dataclass(frozen=True)
class Skill:
    """How one model (the request's ``model``) behaves under :class:`GradedPolicy`."""

    solves: Mapping[str, int]
    """Task -> how many of its sessions succeed: the first ones to start; the later ones fail."""
    tools: bool = True
    """Work through the ``terminal`` tool (one call, then the answer); False: answer at once."""
    bad_call: bool = False
    """Open each session with a ``terminal`` call whose arguments are not JSON (a tool error)."""
    usage: Mapping[str, float] = field(
        default_factory=lambda: {"prompt_tokens": 100, "completion_tokens": 20, "cost": 0.001}
    )
    """The usage every answer reports (prompt and completion tokens, cost)."""
    waits: Mapping[str, int] = field(default_factory=dict)
    """Task -> how many of its sessions start at once; later ones wait for :meth:`GradedPolicy.release`."""


class GradedPolicy:
    """Models whose scores are known before they run, for evaluation tests.

    Prompts carry directives: ``[task:NAME]`` names the task; ``[answer:TEXT]`` is the right final
    answer (an ``answer`` check); ``[touch:FILE]`` means the task is done when FILE exists (a
    ``check`` such as ``test -f FILE``). Of the sessions of a task, in the order they start, the
    first ``solves[task]`` succeed and the others fail (a wrong answer, no file), so however the
    sessions interleave, each task's pass count is exact. Sessions are told apart by their first
    turn; a session retried after a failure counts again.
    """

    def __init__(self, skills: Mapping[str, Skill]) -> None:
        self.skills = dict(skills)
        self.started: Counter[tuple[str, str]] = Counter()
        self.waiting = 0
        self._released = threading.Event()

    def release(self) -> None:
        """Let every waiting session go on."""
        self._released.set()

    async def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        skill = self.skills[body["model"]]
        prompt, since = split_task(body["messages"])
        task = (TASK.findall(prompt) or ["?"])[0]
        answered = [m for m in since if m.get("role") == "assistant"]
        if not answered:
            plan = await self._start(body["model"], task, skill)
        else:
            first_call = (answered[0].get("tool_calls") or [{}])[0]
            plan = SOLVE if SOLVE in str(first_call.get("function", {}).get("arguments")) else MISS
        reply = self._reply(prompt, plan, skill, len(answered))
        reply["_usage"] = {
            **skill.usage,
            "total_tokens": skill.usage["prompt_tokens"] + skill.usage["completion_tokens"],
        }
        return reply

    async def _start(self, model: str, task: str, skill: Skill) -> str:
        number = self.started[model, task]
        self.started[model, task] += 1
        if task in skill.waits and number >= skill.waits[task]:
            self.waiting += 1
            while not self._released.is_set():
                await asyncio.sleep(0.02)
            self.waiting -= 1
        return SOLVE if number < skill.solves.get(task, 0) else MISS

    @staticmethod
    def _reply(prompt: str, plan: str, skill: Skill, turn: int) -> dict[str, Any]:
        answer = (ANSWER.findall(prompt) or ["done"])[0]
        touch = TOUCH.findall(prompt)
        calls: list[str] = []
        if skill.tools:
            if skill.bad_call:
                calls.append("{not json " + plan)
            if touch:
                work = f"touch {touch[0]} {plan}" if plan == SOLVE else f"true {plan}"
            else:
                work = f"echo {answer if plan == SOLVE else 'unsure'} {plan}"
            calls.append(json.dumps({"command": work}))
        if turn < len(calls):
            call = {
                "id": f"call_{turn}",
                "type": "function",
                "function": {"name": "terminal", "arguments": calls[turn]},
            }
            return {"content": None, "reasoning": "Working on it with the shell.", "tool_calls": [call]}
        final = answer if plan == SOLVE else "I am not sure."
        return {"content": final, "reasoning": "That is my answer."}
