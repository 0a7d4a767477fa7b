"""``--model scripted``: an offline, deterministic model for dry runs and tests.

It behaves like a careful agent with whatever tools it is offered: it writes a file, runs a
command, reads the result back, then answers, reasoning at every step. No network, no key.
The same policy serves the project's HTTP test server, so offline and online runs share it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from trajkit import hookimpl
from trajkit.config import RunConfig
from trajkit.model import AssistantMessage, Message, ModelClient, parse_assistant_message


@hookimpl
def trajkit_model_clients() -> list[type[ModelClient]]:
    return [ScriptedModel]


class ScriptedModel(ModelClient):
    name = "scripted"
    takes_params = True
    """Accepted, and they change nothing: a scripted reply has no sampling to set."""
    description = "offline deterministic agent that exercises the offered tools"
    offline = True

    @classmethod
    def from_config(cls, config: RunConfig) -> ScriptedModel:
        return cls()

    async def complete(
        self, messages: list[Message], tools: list[dict[str, Any]], params: Mapping[str, Any] | None = None
    ) -> AssistantMessage:
        reply = scripted_reply(messages, [t["function"]["name"] for t in tools])
        prompt_chars = sum(len(str(m.get("content") or "")) for m in messages)
        usage = {"prompt_tokens": prompt_chars // 4 + 1, "completion_tokens": len(json.dumps(reply)) // 4 + 1}
        finish = "tool_calls" if reply.get("tool_calls") else "stop"
        return parse_assistant_message(reply, usage, finish)


def split_task(messages: list[Message]) -> tuple[str, list[Message]]:
    """The prompt (the last user message) and the conversation since it (prefill comes before)."""
    for position in range(len(messages) - 1, -1, -1):
        if messages[position].get("role") == "user":
            return str(messages[position].get("content") or ""), messages[position + 1 :]
    return "", messages


def _plan(task: str, tools: set[str]) -> list[tuple[str, str, dict[str, Any]]]:
    """(reasoning, tool, arguments) for each step the policy takes with these tools."""
    note = f"Task: {task[:200]}\n"
    steps: list[tuple[str, str, dict[str, Any]]] = []
    if "write_file" in tools:
        steps.append(
            (
                "I'll record the task in a notes file first.",
                "write_file",
                {"path": "notes.txt", "content": note},
            )
        )
    elif "terminal" in tools:
        command = f"printf '%s\\n' {json.dumps(note.strip())} > notes.txt"
        steps.append(
            ("I'll record the task in a notes file with the shell.", "terminal", {"command": command})
        )
    elif "execute_code" in tools:
        code = f"open('notes.txt', 'w').write({note!r})"
        steps.append(("I'll record the task in a notes file from Python.", "execute_code", {"code": code}))
    if "terminal" in tools:
        steps.append(
            ("Let me look at the working directory.", "terminal", {"command": "ls -la && wc -c notes.txt"})
        )
    elif "execute_code" in tools:
        code = "import os\nprint(sorted(os.listdir('.')))"
        steps.append(("Let me list the working directory from Python.", "execute_code", {"code": code}))
    if "read_file" in tools:
        steps.append(("Now I'll read the notes back to check them.", "read_file", {"path": "notes.txt"}))
    elif "search_files" in tools:
        steps.append(("Let me search the notes for the task line.", "search_files", {"pattern": "Task"}))
    return steps


def scripted_reply(messages: list[Message], tool_names: list[str]) -> dict[str, Any]:
    """The next assistant message, in OpenAI wire format, given the conversation so far."""
    task, since = split_task(messages)
    done = sum(1 for m in since if m.get("role") == "assistant")
    steps = _plan(task, set(tool_names))
    if done < len(steps):
        reasoning, tool, arguments = steps[done]
        call = {
            "id": f"call_{done}",
            "type": "function",
            "function": {"name": tool, "arguments": json.dumps(arguments)},
        }
        return {"role": "assistant", "content": "", "reasoning": reasoning, "tool_calls": [call]}
    results = [m for m in since if m.get("role") == "tool"]
    summary = f"I completed the task using {len(results)} tool calls." if results else "I answered directly."
    return {
        "role": "assistant",
        "content": f"{summary} The notes file records: {task[:80]}",
        "reasoning": "Every step succeeded, so I can give the final answer.",
    }
