"""The trajectory record: a superset of the reference record, one JSON object per line.

Every row of a run has the same columns: tool statistics are zero-filled over every tool of the
run, tool-call arguments stay JSON strings, and each turn carries every turn field (null where
it does not apply), so Arrow and ``datasets`` see one schema.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from trajkit.agent import ConversationResult
from trajkit.model import Message, Usage

ROLE_NAMES = {"system": "system", "user": "human", "assistant": "gpt", "tool": "tool"}


class ToolCallRecord(BaseModel):
    id: str
    name: str
    arguments: str
    """The raw JSON string the model produced (kept a string so Arrow sees one type)."""


class Turn(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    from_: Literal["system", "human", "gpt", "tool"] = Field(alias="from")
    value: str
    reasoning: str | None = None
    tool_calls: list[ToolCallRecord] = []
    tool_call_id: str | None = None
    """On tool turns: the id of the call this turn answers."""
    name: str | None = None
    """On tool turns: the tool that was called."""


class ToolStatRecord(BaseModel):
    count: int
    success: int
    failure: int


class UsageRecord(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cost: float | None


class CheckRecord(BaseModel):
    scorer: str
    passed: bool
    value: float
    detail: str


class ScoreRecord(BaseModel):
    passed: bool
    """Every check passed."""
    value: float
    """The mean of the checks' values."""
    checks: list[CheckRecord]


class SandboxRecord(BaseModel):
    backend: str
    image: str | None
    digest: str | None


class TrajectoryRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    work_id: str
    """prompt_id plus the occurrence number among identical rows: the ledger's key."""
    prompt_id: str
    prompt_index: int
    sample: int = 0
    """Which of its row's samples this is (``--samples_per_prompt``); a row's samples share
    ``prompt_index`` and are next to each other in the outputs."""
    conversations: list[Turn]
    metadata: dict[str, Any]
    completed: bool
    partial: bool
    """Ended without a final answer: cut off by max_turns (mid tool turn) or by the token limit."""
    api_calls: int
    toolsets_used: list[str]
    """The offered toolsets of which the model called some tool."""
    toolsets_offered: list[str] = []
    """The toolsets drawn for this prompt from the distribution."""
    tools_offered: list[str]
    tool_schemas_key: str | None = None
    """Names the schemas of the offered tools, as the model saw them, in the run's ``tools.json``
    (None in records of runs made before it, and of served sessions)."""
    tool_stats: dict[str, ToolStatRecord]
    tool_error_counts: dict[str, int]
    invalid_tool_calls: int
    usage: UsageRecord
    duration_s: float
    attempt: int
    finish_reason: str | None
    sandbox: SandboxRecord
    score: ScoreRecord | None = None
    """The row's checks (:mod:`trajkit.scorers`), None when the row carries none."""

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


def conversation_turns(messages: list[Message]) -> list[Turn]:
    turns = []
    for message in messages:
        calls = [
            ToolCallRecord(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"])
            for c in message.get("tool_calls") or []
        ]
        turns.append(
            Turn(
                from_=ROLE_NAMES[message["role"]],
                value=message.get("content") or "",
                reasoning=message.get("reasoning"),
                tool_calls=calls,
                tool_call_id=message.get("tool_call_id"),
                name=message.get("name"),
            )
        )
    return turns


def tool_columns(
    result: ConversationResult, run_tools: list[str]
) -> tuple[dict[str, ToolStatRecord], dict[str, int]]:
    """tool_stats and tool_error_counts, zero-filled over every tool of the run."""
    stats = {}
    for name in run_tools:
        stat = result.tool_stats.get(name)
        stats[name] = ToolStatRecord(
            count=stat.count if stat else 0,
            success=stat.success if stat else 0,
            failure=stat.failure if stat else 0,
        )
    return stats, {name: stat.failure for name, stat in stats.items()}


def trajectory_record(
    result: ConversationResult,
    run_tools: Sequence[str],
    *,
    work_id: str,
    prompt_id: str,
    prompt_index: int,
    metadata: dict[str, Any],
    toolsets_used: list[str],
    tools_offered: list[str],
    duration_s: float,
    attempt: int,
    backend: str,
    image: str | None,
    digest: str | None,
    tool_schemas_key: str | None = None,
    sample: int = 0,
    toolsets_offered: list[str] | None = None,
    score: dict[str, Any] | None = None,
) -> TrajectoryRecord:
    """A finished session's record, built and validated through the models."""
    tool_stats, tool_errors = tool_columns(result, list(run_tools))
    usage = result.usage
    return TrajectoryRecord(
        work_id=work_id,
        prompt_id=prompt_id,
        prompt_index=prompt_index,
        sample=sample,
        conversations=conversation_turns(result.messages),
        metadata=metadata,
        completed=result.completed,
        partial=not result.completed,
        api_calls=result.api_calls,
        toolsets_used=toolsets_used,
        toolsets_offered=toolsets_used if toolsets_offered is None else toolsets_offered,
        tools_offered=tools_offered,
        tool_schemas_key=tool_schemas_key,
        tool_stats=tool_stats,
        tool_error_counts=tool_errors,
        invalid_tool_calls=result.invalid_tool_calls,
        usage=UsageRecord(
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            total_tokens=usage.prompt_tokens + usage.completion_tokens,
            cost=usage.cost,
        ),
        duration_s=duration_s,
        attempt=attempt,
        finish_reason=result.finish_reason,
        sandbox=SandboxRecord(backend=backend, image=image, digest=digest),
        score=None if score is None else ScoreRecord.model_validate(score),
    )


_OPTIONAL_STR = frozenset({str, type(None)})
_JSON_SCALAR = frozenset({str, int, bool, type(None)})
_NOT_PLAIN = object()


def record_json(
    result: ConversationResult,
    run_tools: Sequence[str],
    *,
    work_id: str,
    prompt_id: str,
    prompt_index: int,
    metadata: dict[str, Any],
    toolsets_used: list[str],
    tools_offered: list[str],
    duration_s: float,
    attempt: int,
    backend: str,
    image: str | None,
    digest: str | None,
    tool_schemas_key: str | None = None,
    sample: int = 0,
    toolsets_offered: list[str] | None = None,
    score: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``trajectory_record(...).to_json_dict()`` for the same arguments, without building the models.

    Assembled as JSON directly (several times cheaper, and this runs on the event loop for every
    trajectory). A value from outside trajkit's own counting (messages, usage, tool names, the
    dataset's fields, the digest) that is not already what the model would give (an int cost, a
    NaN among the dataset's fields...) sends the record through :class:`TrajectoryRecord`, which
    coerces or rejects it; ``tests/test_records.py`` holds the two paths to the same output.
    """
    conversations, plain = _conversations_json(result.messages)
    tool_stats = _tool_stats_json(result, run_tools)
    metadata_json, score_json = _plain_copy(metadata), _plain_copy(score)
    offered = toolsets_used if toolsets_offered is None else toolsets_offered
    names = [*tool_stats, *tools_offered, *toolsets_used, *offered]
    plain = plain and metadata_json is not _NOT_PLAIN and _plain_score(score_json)
    plain = plain and _plain_scalars(result, duration_s, digest, tool_schemas_key, names)
    record = {
        "work_id": work_id,
        "prompt_id": prompt_id,
        "prompt_index": prompt_index,
        "sample": sample,
        "conversations": conversations,
        "metadata": metadata_json if plain else metadata,
        "completed": result.completed,
        "partial": not result.completed,
        "api_calls": result.api_calls,
        "toolsets_used": list(toolsets_used),
        "toolsets_offered": list(offered),
        "tools_offered": list(tools_offered),
        "tool_schemas_key": tool_schemas_key,
        "tool_stats": tool_stats,
        "tool_error_counts": {tool: stat["failure"] for tool, stat in tool_stats.items()},
        "invalid_tool_calls": result.invalid_tool_calls,
        "usage": _usage_json(result.usage),
        "duration_s": duration_s,
        "attempt": attempt,
        "finish_reason": result.finish_reason,
        "sandbox": {"backend": backend, "image": image, "digest": digest},
        "score": score_json if plain else score,
    }
    if plain:
        return record
    return TrajectoryRecord.model_validate(record).to_json_dict()


_SCORE_KEYS = ("passed", "value", "checks")
_CHECK_KEYS = ("scorer", "passed", "value", "detail")


def _plain_score(score: Any) -> bool:
    """Whether a score (as :func:`trajkit.scorers.score_session` gives it) is already what the
    model's dump gives: keys in the model's order, values of their JSON types."""
    if score is None:
        return True
    if score is _NOT_PLAIN or type(score) is not dict or tuple(score) != _SCORE_KEYS:
        return False
    checks = score["checks"]
    return (
        type(score["passed"]) is bool
        and type(score["value"]) is float
        and type(checks) is list
        and all(
            type(c) is dict
            and tuple(c) == _CHECK_KEYS
            and type(c["scorer"]) is str
            and type(c["passed"]) is bool
            and type(c["value"]) is float
            and type(c["detail"]) is str
            for c in checks
        )
    )


def _conversations_json(messages: list[Message]) -> tuple[list[dict[str, Any]], bool]:
    """The turns as JSON, and whether every value already had its JSON type."""
    plain = True
    conversations = []
    for message in messages:
        value = message.get("content") or ""
        reasoning = message.get("reasoning")
        tool_call_id = message.get("tool_call_id")
        name = message.get("name")
        calls = []
        for call in message.get("tool_calls") or ():
            function = call["function"]
            call_id, call_name, arguments = call["id"], function["name"], function["arguments"]
            plain = plain and type(call_id) is str and type(call_name) is str and type(arguments) is str
            calls.append({"id": call_id, "name": call_name, "arguments": arguments})
        plain = (
            plain
            and type(value) is str
            and type(reasoning) in _OPTIONAL_STR
            and type(tool_call_id) in _OPTIONAL_STR
            and type(name) in _OPTIONAL_STR
        )
        conversations.append(
            {
                "from": ROLE_NAMES[message["role"]],
                "value": value,
                "reasoning": reasoning,
                "tool_calls": calls,
                "tool_call_id": tool_call_id,
                "name": name,
            }
        )
    return conversations, plain


def _tool_stats_json(result: ConversationResult, run_tools: Sequence[str]) -> dict[str, dict[str, int]]:
    """tool_stats as JSON, zero-filled over every tool of the run."""
    stats = result.tool_stats
    tool_stats = {}
    for tool in run_tools:
        stat = stats.get(tool)
        tool_stats[tool] = (
            {"count": stat.count, "success": stat.success, "failure": stat.failure}
            if stat
            else {"count": 0, "success": 0, "failure": 0}
        )
    return tool_stats


def _usage_json(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "cost": usage.cost,
    }


def _plain_scalars(
    result: ConversationResult,
    duration_s: float,
    digest: str | None,
    tool_schemas_key: str | None,
    names: list[Any],
) -> bool:
    """Whether the values from outside trajkit's own counting already have their JSON types
    (``names``: the tools and toolsets, which must be strings)."""
    usage = result.usage
    cost = usage.cost
    return (
        type(usage.prompt_tokens) is int
        and type(usage.completion_tokens) is int
        and (cost is None or (type(cost) is float and math.isfinite(cost)))
        and type(duration_s) is float
        and math.isfinite(duration_s)
        and type(result.finish_reason) in _OPTIONAL_STR
        and type(digest) in _OPTIONAL_STR
        and type(tool_schemas_key) in _OPTIONAL_STR
        and all(type(name) is str for name in names)
    )


def _plain_copy(value: Any) -> Any:
    """A copy of JSON data as the model's ``mode="json"`` dump gives it, or ``_NOT_PLAIN`` when
    the dump would change something (non-finite floats, tuples, non-string keys, other types)."""
    kind = type(value)
    if kind in _JSON_SCALAR:
        return value
    if kind is float:
        return value if math.isfinite(value) else _NOT_PLAIN
    if kind is dict:
        copied = {}
        for key, item in value.items():
            item = _plain_copy(item)
            if type(key) is not str or item is _NOT_PLAIN:
                return _NOT_PLAIN
            copied[key] = item
        return copied
    if kind is list:
        items = [_plain_copy(item) for item in value]
        return _NOT_PLAIN if any(item is _NOT_PLAIN for item in items) else items
    return _NOT_PLAIN
