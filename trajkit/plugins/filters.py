"""The reference quality filters, on by default: no-reasoning and hallucinated-tool."""

from __future__ import annotations

from trajkit import hookimpl
from trajkit.filters import Record, TrajectoryFilter


@hookimpl
def trajkit_filters() -> list[type[TrajectoryFilter]]:
    return [NoReasoning, HallucinatedTool]


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
