"""The trajectory record: a superset of the reference record, one JSON object per line.

Every row of a run has the same columns: tool statistics are zero-filled over every tool of the
run, tool-call arguments stay JSON strings, and each turn carries every turn field (null where
it does not apply), so Arrow and ``datasets`` see one schema.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from trajkit.agent import ConversationResult
from trajkit.model import Message

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
    conversations: list[Turn]
    metadata: dict[str, Any]
    completed: bool
    partial: bool
    api_calls: int
    toolsets_used: list[str]
    tools_offered: list[str]
    tool_stats: dict[str, ToolStatRecord]
    tool_error_counts: dict[str, int]
    invalid_tool_calls: int
    usage: UsageRecord
    duration_s: float
    attempt: int
    finish_reason: str | None
    sandbox: SandboxRecord

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
