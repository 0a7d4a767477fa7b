"""A trajectory as the messages one chat template can take, and a probe copy of them to check the rendering.

The rows start as the ``openai`` writer's messages (arguments as objects, reasoning in
``reasoning_content``, no null keys). A template may need something else; what it needs is a
:class:`Profile`, chosen once per template by rendering a sample conversation (see
:mod:`.export`), and applying it to a row records each change it made, by kind
(:data:`ADAPTATIONS`):

- arguments as the JSON text the model sent, for templates that concatenate them as strings
  (DeepSeek-V3.1, functionary, firefunction);
- tool-call ids mapped to 9 alphanumeric characters, for Mistral's templates, which refuse others;
- the tools under the variable the template reads (firefunction-v2's ``functions``, a JSON string);
- reasoning under the field the template reads (gpt-oss reads ``thinking``);
- with ``--split_parallel_calls``, one turn's parallel calls as consecutive single-call turns, each
  followed by its own result, for templates that render one call a turn. The calls were made
  together, so none depended on another's result: the sequence is an equivalent transcript.

A :class:`Probe` is the same conversation with every piece of text replaced by a unique marker
(``zq<kind><n>qz``), so the checks can count where each piece lands in a rendering without
mistaking one tool result for another that happens to contain the same text.
"""

from __future__ import annotations

import hashlib
import json
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trajkit.plugins.export.writers import openai_message

ADAPTATIONS = {
    "arguments_as_json_strings": "tool-call arguments passed as the JSON text the model sent (the template concatenates them)",
    "tool_call_ids_mapped": "tool-call ids mapped to 9 alphanumeric characters (the template refuses other ids)",
    "tools_as_functions": "the tools passed as `functions`, a JSON string (the variable the template reads)",
    "reasoning_as_thinking": "reasoning passed as `thinking` (the field the template reads)",
    "parallel_calls_split": "parallel tool calls split into one call a turn, each followed by its result",
}
"""Every kind of change an adaptation makes, as the report names them."""

REASONING_FIELDS = {
    "reasoning_content": re.compile(r"reasoning_content"),
    "thinking": re.compile(r"""(\.|\[\s*['"])thinking\b|['"]thinking['"]\s+(not\s+)?in\b"""),
    "reasoning": re.compile(r"""(\.|\[\s*['"])reasoning\b|['"]reasoning['"]\s+(not\s+)?in\b"""),
}
"""Message fields a template may read reasoning from, in the order they are preferred."""
TOOLS_VARIABLES = ("tools", "functions")
"""Variables a template may read the offered tools from: the list, or firefunction's JSON string."""
ALPHANUMERIC = string.ascii_letters + string.digits


@dataclass(frozen=True)
class Profile:
    """What one template needs of the rows."""

    arguments: str = "object"
    """``object``: the decoded arguments; ``string``: the JSON text the model sent."""
    call_ids: str = "kept"
    """``kept``, or ``alnum9``: 9 alphanumeric characters derived from the original id."""
    reasoning_field: str | None = "reasoning_content"
    """The message field the template reads reasoning from; None when it has no place for it."""
    tools_variable: str | None = "tools"
    """Where the template reads the tools; None when it reads none."""


@dataclass
class Adapted:
    """A row's messages for one template and what was changed to get them."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    kwargs: dict[str, Any]
    """Template variables the row needs beyond the tokenizer's (``chat_template_kwargs``)."""
    changes: set[str] = field(default_factory=set)
    raw_arguments: list[str] = field(default_factory=list)
    """Every tool call's arguments as the model sent them, in order."""


def base_messages(record: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """The ``openai`` writer's messages of a record, and each call's raw arguments text in order."""
    turns = record["conversations"]
    raw = [call["arguments"] for turn in turns for call in turn.get("tool_calls") or []]
    return [openai_message(turn) for turn in turns], raw


def adapt(
    record: Mapping[str, Any],
    tools: Sequence[Mapping[str, Any]],
    profile: Profile,
    variables: Mapping[str, Any],
    split: bool = False,
) -> Adapted:
    """The record's messages as ``profile`` says the template needs them; ``split`` turns
    parallel calls into single-call turns (a row that cannot be split faithfully is left whole)."""
    messages, raw = base_messages(record)
    adapted = Adapted(messages, [dict(t) for t in tools], dict(variables), raw_arguments=raw)
    if profile.arguments == "string":
        _arguments_as_text(adapted)
    if profile.call_ids == "alnum9":
        _map_call_ids(adapted)
    if profile.reasoning_field not in (None, "reasoning_content"):
        field_name = str(profile.reasoning_field)
        for message in adapted.messages:
            if "reasoning_content" in message:
                message[field_name] = message.pop("reasoning_content")
                adapted.changes.add(f"reasoning_as_{field_name}")
    if profile.tools_variable not in (None, "tools") and adapted.tools:
        adapted.kwargs[str(profile.tools_variable)] = tools_text(adapted.tools)
        adapted.changes.add(f"tools_as_{profile.tools_variable}")
    if split and has_parallel_calls(adapted.messages):
        sequential = split_parallel_calls(adapted.messages)
        if sequential is not None:
            adapted.messages = sequential
            adapted.changes.add("parallel_calls_split")
    return adapted


def tools_text(tools: Sequence[Mapping[str, Any]]) -> str:
    """The tools as firefunction-v2's ``functions`` variable: its model card's JSON of the specs."""
    return json.dumps([t.get("function", t) for t in tools], ensure_ascii=False, indent=4)


def _calls(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [call for m in messages for call in m.get("tool_calls") or []]


def _arguments_as_text(adapted: Adapted) -> None:
    for call, text in zip(_calls(adapted.messages), adapted.raw_arguments, strict=True):
        function = call["function"]
        if not isinstance(function["arguments"], str):
            function["arguments"] = text
            adapted.changes.add("arguments_as_json_strings")


def short_id(original: str, taken: set[str]) -> str:
    """9 alphanumeric characters derived from ``original``, distinct from ``taken``."""
    digest = hashlib.sha256(original.encode()).digest()
    number = int.from_bytes(digest, "big")
    while True:
        chars = []
        for _ in range(9):
            number, index = divmod(number, len(ALPHANUMERIC))
            chars.append(ALPHANUMERIC[index])
        candidate = "".join(chars)
        if candidate not in taken:
            return candidate
        number = int.from_bytes(hashlib.sha256(digest + candidate.encode()).digest(), "big")


def _map_call_ids(adapted: Adapted) -> None:
    mapping: dict[str, str] = {}
    for call in _calls(adapted.messages):
        original = str(call.get("id") or "")
        if len(original) == 9 and original.isalnum() and original not in mapping.values():
            mapping[original] = original
        else:
            mapping[original] = short_id(original, set(mapping.values()))
            adapted.changes.add("tool_call_ids_mapped")
        call["id"] = mapping[original]
    for message in adapted.messages:
        if message["role"] == "tool" and "tool_call_id" in message:
            message["tool_call_id"] = mapping.get(message["tool_call_id"], message["tool_call_id"])


def has_parallel_calls(messages: Sequence[Mapping[str, Any]]) -> bool:
    return any(len(m.get("tool_calls") or []) > 1 for m in messages)


def split_parallel_calls(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """Each multi-call turn as single-call turns, each followed by its own result; None when a
    turn's results do not answer its calls one to one (then no split is faithful)."""
    out: list[dict[str, Any]] = []
    index = 0
    while index < len(messages):
        message = messages[index]
        calls = message.get("tool_calls") or []
        if len(calls) < 2:
            out.append(message)
            index += 1
            continue
        results = []
        for following in messages[index + 1 :]:
            if following["role"] != "tool":
                break
            results.append(following)
        by_id = {r.get("tool_call_id"): r for r in results}
        if len(results) != len(calls) or set(by_id) != {c["id"] for c in calls}:
            return None
        for position, call in enumerate(calls):
            head = {k: v for k, v in message.items() if k != "tool_calls"} if position == 0 else {}
            out.append(
                {**head, "role": "assistant", "content": head.get("content", ""), "tool_calls": [call]}
            )
            out.append(by_id[call["id"]])
        index += 1 + len(results)
    return out


# -- the probe ----------------------------------------------------------------------------------


def marker(kind: str, number: int) -> str:
    return f"zq{kind}{number}qz"


@dataclass
class Probe:
    """A row's adapted messages with every piece of text replaced by a unique marker."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    kwargs: dict[str, Any]
    pieces: dict[str, tuple[str, str]] = field(default_factory=dict)
    """marker -> (kind, what it stands for), e.g. ``("tool_call", "call 2 (terminal)")``."""
    arguments: dict[str, Any] = field(default_factory=dict)
    """tool-call marker -> the probe's arguments value (to recognise how it was encoded)."""


def probe(adapted: Adapted, profile: Profile) -> Probe:
    """The adapted conversation with markers in place of its text (structure, names, ids and
    emptiness kept, so the template takes the same branches)."""
    result = Probe([], [], dict(adapted.kwargs))
    counts: dict[str, int] = {}

    def mark(kind: str, what: str) -> str:
        counts[kind] = counts.get(kind, 0) + 1
        text = marker(kind, counts[kind])
        result.pieces[text] = (kind, what)
        return text

    for message in adapted.messages:
        copy = dict(message)
        role = message["role"]
        if message.get("content"):
            kind = {"system": "system", "user": "user", "assistant": "content", "tool": "result"}.get(
                role, role
            )
            copy["content"] = mark(kind, f"{role} message")
        if profile.reasoning_field and message.get(profile.reasoning_field):
            copy[profile.reasoning_field] = mark("reasoning", "an assistant turn's reasoning")
        if message.get("tool_calls"):
            copy["tool_calls"] = [_probe_call(call, mark, result) for call in message["tool_calls"]]
        result.messages.append(copy)
    for tool in adapted.tools:
        function = dict(tool.get("function") or {})
        function["description"] = mark("tool", f"tool {function.get('name')!r}")
        result.tools.append({**tool, "function": function})
    if profile.tools_variable not in (None, "tools") and result.tools:
        result.kwargs[str(profile.tools_variable)] = tools_text(result.tools)
    return result


def _probe_call(call: Mapping[str, Any], mark: Any, result: Probe) -> dict[str, Any]:
    function = call["function"]
    name = function["name"]
    text = mark("call", f"a call of {name}")
    arguments: Any = text
    decoded = json.loads(function["arguments"]) if _is_json_object_text(function["arguments"]) else None
    if isinstance(function["arguments"], dict) or isinstance(decoded, dict):
        arguments = {f"zqkey{text[2:-2]}qz": text}
        result.arguments[text] = arguments
        if isinstance(function["arguments"], str):
            arguments = json.dumps(arguments)
    return {**call, "function": {**function, "arguments": arguments}}


def _is_json_object_text(value: Any) -> bool:
    if not isinstance(value, str) or not value.lstrip().startswith("{"):
        return False
    try:
        return isinstance(json.loads(value), dict)
    except ValueError:
        return False
