"""``--model scripted``: an offline, deterministic model for dry runs and tests.

It behaves like a careful agent with whatever tools it is offered: it writes a file, runs a
command, reads the result back, searches the web and reads a page it found (or one the prompt
names), opens a page the prompt names in the browser and tries each browser tool on it,
generates an image and looks at it (or at an image the prompt names), then answers,
reasoning at every step. Asked about an image itself (as ``vision_analyze`` asks its model), it
describes the image's format and size. It needs no network and no key, though the web tools it
calls reach theirs. The same policy serves the project's HTTP test server, so offline and online
runs share it.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from trajkit import hookimpl
from trajkit.config.run_config import RunConfig
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


URL = re.compile(r"https?://[^\s\"'<>()\[\]]+")
IMAGE = re.compile(r"(?:https?://[^\s\"'<>()]+|[\w./-]+)\.(?:png|jpe?g|gif|webp)\b", re.IGNORECASE)

Step = tuple[str, str, dict[str, Any]]


def _plan(task: str, tools: set[str], since: Sequence[Message] = ()) -> list[Step]:
    """(reasoning, tool, arguments) for each step the policy takes with these tools; a step that
    needs an earlier step's result comes after it, and is left out when that result lacks what
    it needs (so the steps already taken never move)."""
    results = _results(since)
    return _local_steps(task, tools) + _web_steps(task, tools, results) + _browser_steps(task, tools, results)


def _local_steps(task: str, tools: set[str]) -> list[Step]:
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
    images = _image_parts(messages)
    if images is not None:
        return {"role": "assistant", "content": _describe(images), "reasoning": "I looked at the image."}
    steps = _plan(task, set(tool_names), since)
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


def _results(since: Sequence[Message]) -> dict[str, list[str]]:
    """Tool name -> the results of its calls so far, in order."""
    names = {
        call.get("id"): call.get("function", {}).get("name")
        for message in since
        if message.get("role") == "assistant"
        for call in message.get("tool_calls") or ()
        if isinstance(call, dict)
    }
    found: dict[str, list[str]] = {}
    for message in since:
        if message.get("role") == "tool":
            found.setdefault(str(names.get(message.get("tool_call_id"))), []).append(
                str(message.get("content"))
            )
    return found


def _web_steps(task: str, tools: set[str], results: dict[str, list[str]]) -> list[Step]:
    steps: list[Step] = []
    if "web_search" in tools:
        query = (task.strip().splitlines() or ["the task"])[0][:100]
        steps.append(("Let me search the web for this.", "web_search", {"query": query, "limit": 3}))
    named = [url for url in URL.findall(task) if not IMAGE.fullmatch(url)]
    found = [url for result in results.get("web_search", []) for url in URL.findall(result)]
    if "web_extract" in tools and (named or found):
        steps.append(("I'll read the page.", "web_extract", {"urls": (named or found)[:1]}))
    if "image_generate" in tools:
        prompt = f"An illustration of: {task[:200]}"
        steps.append(
            ("I'll make an image for this.", "image_generate", {"prompt": prompt, "aspect_ratio": "square"})
        )
    image = IMAGE.search(task)
    made = [_path(result) for result in results.get("image_generate", [])]
    source = image.group(0) if image else next((path for path in made if path), None)
    if "vision_analyze" in tools and source:
        steps.append(
            (
                "Let me look at the image.",
                "vision_analyze",
                {"image_url": source, "question": "What does this image show?"},
            )
        )
    return steps


REF = re.compile(r'- (textbox|link|button) "[^"\n]*"[^\n]*\[ref=((?:f\d+)?e\d+)\]')


def _browser_steps(task: str, tools: set[str], results: dict[str, list[str]]) -> list[Step]:
    """Open the page the prompt names, read it, fill its first field, follow its first link, and
    try every other browser tool on the way."""
    named = [url for url in URL.findall(task) if not IMAGE.fullmatch(url)]
    if "browser_navigate" not in tools or not named:
        return []
    steps: list[Step] = [("Let me open the page in the browser.", "browser_navigate", {"url": named[0]})]
    steps.append(("I'll read the whole page.", "browser_snapshot", {"full": True}))
    found: dict[str, str] = {}
    for result in results.get("browser_snapshot", [])[:1]:
        for role, ref in REF.findall(_field(result, "snapshot")):
            found.setdefault(role, ref)
    if "textbox" in found:
        steps.append(
            ("I'll fill in the field.", "browser_type", {"ref": found["textbox"], "text": "trajkit"})
        )
    if "link" in found:
        steps.append(("Let me follow the first link.", "browser_click", {"ref": found["link"]}))
    steps += [
        ("Let me scroll down to see more.", "browser_scroll", {"direction": "down"}),
        ("I'll go back to the first page.", "browser_back", {}),
        ("Moving focus to the next field.", "browser_press", {"key": "Tab"}),
        ("Let me list the page's images.", "browser_get_images", {}),
        ("I'll check the console.", "browser_console", {"expression": "document.title"}),
        (
            "Let me look at the page itself.",
            "browser_vision",
            {"question": "What does this page show?", "annotate": True},
        ),
    ]
    return steps


def _field(result: str, key: str) -> str:
    try:
        value = json.loads(result).get(key)
    except (ValueError, AttributeError):
        return ""
    return value if isinstance(value, str) else ""


def _path(result: str) -> str | None:
    return _field(result, "path") or None


def _image_parts(messages: list[Message]) -> list[str] | None:
    """The image URLs of the last user message when it carries images (a vision question)."""
    for message in reversed(messages):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                urls = [
                    str(part.get("image_url", {}).get("url", ""))
                    for part in content
                    if isinstance(part, dict) and part.get("type") == "image_url"
                ]
                return urls or None
            return None
    return None


def _describe(images: list[str]) -> str:
    """What can be told of each image without looking: its format, size and (PNG) dimensions."""
    parts = []
    for url in images:
        head, _, payload = url.partition(",")
        try:
            data = base64.b64decode(payload, validate=True) if head.endswith(";base64") else b""
        except (binascii.Error, ValueError):
            data = b""
        kind = head.removeprefix("data:").split(";")[0] or "an image"
        size = (
            f"{int.from_bytes(data[16:20], 'big')}x{int.from_bytes(data[20:24], 'big')} "
            if data.startswith(b"\x89PNG") and len(data) >= 24
            else ""
        )
        parts.append(
            f"The image is a {size}{kind} of {len(data)} bytes." if data else f"The image is at {url[:100]}."
        )
    return " ".join(parts)
