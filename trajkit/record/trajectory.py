"""The trajectory record: a superset of the reference record, one JSON object per line.

Every row of a run has the same columns: tool statistics are zero-filled over every tool of the
run, tool-call arguments stay JSON strings, and each turn carries every turn field (null where
it does not apply), so Arrow and ``datasets`` see one schema.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.config import JsonDict

if TYPE_CHECKING:
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


CARRIED: JsonDict = {"carried": True}
"""A field the derived formats (hermes, openai, chat-template exports) carry beside the conversation."""


class TrajectoryRecord(BaseModel):
    """One finished session: the one definition of the record's shape. The ledger's check, the
    derived formats' fields, the Parquet and Hugging Face schemas and the manual's table are made
    from it (:mod:`trajkit.record.schema`)."""

    model_config = ConfigDict(extra="forbid")

    work_id: str = Field(json_schema_extra=CARRIED)
    """``prompt_id`` plus the occurrence number among identical rows: the ledger's key."""
    prompt_id: str = Field(json_schema_extra=CARRIED)
    """The content hash of the row."""
    prompt_index: int = Field(json_schema_extra=CARRIED)
    """The row's position in the dataset (0-based)."""
    sample: int = Field(0, json_schema_extra=CARRIED)
    """Which of its row's samples this is (``--samples_per_prompt``, 0-based); a row's samples share
    ``prompt_index`` and are next to each other in the outputs."""
    conversations: list[Turn]
    """ShareGPT turns; gpt turns carry their tool calls (arguments as the JSON string the model
    sent) and reasoning, tool turns the call they answer."""
    metadata: dict[str, Any] = Field(json_schema_extra=CARRIED)
    """``batch_num``, ``timestamp``, ``model`` and the row's own extra fields."""
    completed: bool = Field(json_schema_extra=CARRIED)
    """The model gave a final answer within ``max_turns`` (which says nothing of whether it did
    the task: see ``score``)."""
    partial: bool = Field(json_schema_extra=CARRIED)
    """Ended without a final answer: cut off by max_turns (mid tool turn) or by the token limit."""
    api_calls: int = Field(json_schema_extra=CARRIED)
    """Model calls made."""
    toolsets_used: list[str]
    """The offered toolsets of which the model called some tool."""
    toolsets_offered: list[str] = Field([], json_schema_extra={"default_from": "toolsets_used"})
    """The toolsets drawn for this prompt from the distribution."""
    tools_offered: list[str]
    """The tools of the offered toolsets."""
    tool_schemas_key: str | None = None
    """Names the schemas of the offered tools, as the model saw them, in the run's ``tools.json``
    (null in records of runs made before it, and of served sessions)."""
    tool_stats: dict[str, ToolStatRecord] = Field(json_schema_extra={"keyed_by": "tool"})
    """Per tool calls, successes and failures, zero-filled over every tool of the run so every
    row has the same schema."""
    tool_error_counts: dict[str, int] = Field(json_schema_extra={"keyed_by": "tool", "value_name": "count"})
    """Per tool failures (as in ``tool_stats``)."""
    invalid_tool_calls: int = Field(json_schema_extra=CARRIED)
    """Calls to names that are no tool of the run at all."""
    usage: UsageRecord
    """Prompt, completion and total tokens; the cost when the endpoint reports it."""
    duration_s: float = Field(json_schema_extra=CARRIED)
    """Seconds the session took."""
    attempt: int = Field(json_schema_extra=CARRIED)
    """Which attempt at the work item this was."""
    finish_reason: str | None = Field(json_schema_extra=CARRIED)
    """The model's last finish reason."""
    sandbox: SandboxRecord
    """The backend, the image and the image's digest."""
    score: ScoreRecord | None = Field(None, json_schema_extra=CARRIED)
    """The row's checks (:mod:`trajkit.record.scorers`), null when the row carries none."""

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


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
    """A finished session's record, as JSON: what ``TrajectoryRecord(...).to_json_dict()`` gives.

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
    return through_models(record)


def through_models(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` validated and dumped by :class:`TrajectoryRecord` (coerced, or refused)."""
    return TrajectoryRecord.model_validate(record).to_json_dict()


_SCORE_KEYS = ("passed", "value", "checks")
_CHECK_KEYS = ("scorer", "passed", "value", "detail")


def _plain_score(score: Any) -> bool:
    """Whether a score (as :func:`trajkit.record.scorers.score_session` gives it) is already what the
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


def conversations_json(messages: list[Message]) -> list[dict[str, Any]]:
    """A conversation's messages as the record's ShareGPT ``conversations`` turns."""
    return _conversations_json(messages)[0]


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
