"""The built-in filters: the reference ones on by default (no-reasoning, hallucinated-tool), partial
(on by default), and passed and no-tool-calls (opt-in: ``--filter passed``, ``--filter no_tool_calls``)."""

from __future__ import annotations

from pydantic import Field

from trajkit import hookimpl
from trajkit.config.settings import StrictSettings
from trajkit.record.filters import Record, TrajectoryFilter


@hookimpl
def trajkit_filters() -> list[type[TrajectoryFilter]]:
    return [NoReasoning, HallucinatedTool, Partial, Passed, NoToolCalls]


class NoReasoning(TrajectoryFilter):
    """Rejects a trajectory in which no assistant turn carries reasoning, in any dialect.

    Reasoning is normalised when the model's answer is read (native fields, ``<think>`` and
    ``<REASONING_SCRATCHPAD>`` are all moved into the turn's ``reasoning`` field), so one field
    is enough here.
    """

    name = "no_reasoning"
    description = "no assistant turn carries reasoning"

    def check(self, record: Record) -> str | None:
        turns = [t for t in record["conversations"] if t["from"] == "gpt"]
        if not turns:
            return "no assistant turn"
        if not any(t.get("reasoning") for t in turns):
            return f"none of {len(turns)} assistant turns carries reasoning"
        return None


class HallucinatedTool(TrajectoryFilter):
    """Rejects a trajectory that calls a tool that was not offered to that prompt."""

    name = "hallucinated_tool"
    description = "a call to a tool that was not offered to the prompt"

    def check(self, record: Record) -> str | None:
        offered = set(record["tools_offered"])
        called = [c["name"] for t in record["conversations"] if t["from"] == "gpt" for c in t["tool_calls"]]
        unknown = sorted({name for name in called if name not in offered})
        if unknown:
            return f"called tools not offered: {', '.join(unknown)}"
        return None


def tool_calls_made(record: Record) -> int:
    """How many tool calls the assistant turns of a trajectory make (offered tools or not)."""
    return sum(len(t.get("tool_calls") or ()) for t in record["conversations"] if t["from"] == "gpt")


class NoToolCalls(TrajectoryFilter):
    """Rejects a trajectory in which the model never calls a tool: for tool-calling data it shows
    nothing to learn, whatever its answer. Off by default; the statistics count such trajectories
    (``without_tool_calls``) whether or not it is on."""

    name = "no_tool_calls"
    description = "the model never called a tool"
    enabled_by_default = False

    def check(self, record: Record) -> str | None:
        if tool_calls_made(record):
            return None
        turns = sum(1 for t in record["conversations"] if t["from"] == "gpt")
        return f"none of {turns} assistant turns calls a tool"


class Partial(TrajectoryFilter):
    """Rejects a trajectory that ended without a final answer: cut off by ``max_turns`` (its last
    turn a tool call or its result), by the model's token limit, or otherwise mid tool turn."""

    name = "partial"
    description = "ended without a final answer (max_turns reached mid tool turn, or cut off)"

    def check(self, record: Record) -> str | None:
        if not record["partial"]:
            return None
        turns = record["conversations"]
        last = turns[-1]["from"] if turns else None
        where = {"tool": "after a tool result", "gpt": "on an assistant turn"}.get(last or "", "")
        finish = record.get("finish_reason")
        if finish == "max_turns":
            return f"max_turns reached after {record['api_calls']} model calls, {where}".rstrip(", ")
        if finish == "length":
            return "the last answer was cut off by the token limit"
        return f"ended without a final answer (finish reason {finish!r}) {where}".rstrip()


class PassedSettings(StrictSettings):
    keep_unscored: bool = Field(
        False, description="Keep trajectories whose row carries no check (only failed checks are rejected)."
    )


class Passed(TrajectoryFilter):
    """Rejects a trajectory that failed its row's checks (the record's ``score``, see
    :mod:`trajkit.record.scorers`), and one whose row has no check unless ``keep_unscored``."""

    name = "passed"
    description = "keep only trajectories that passed their row's checks"
    enabled_by_default = False
    Settings = PassedSettings
    settings: PassedSettings

    def check(self, record: Record) -> str | None:
        score = record.get("score")
        if not score:
            return None if self.settings.keep_unscored else "not scored: the row has no check"
        if score["passed"]:
            return None
        failed = [c for c in score["checks"] if not c["passed"]]
        said = "; ".join(
            f"{c['scorer']}: {c['detail'].splitlines()[0] if c['detail'] else 'failed'}" for c in failed
        )
        return f"failed its check ({said[:200]})"
