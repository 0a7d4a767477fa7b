"""A trajkit filter plugin: reject trajectories in which the model made fewer than N tool calls.

A session that answers straight away teaches a tool-calling model nothing about tools; this
filter keeps such rows out of the training set. It is opt-in (``--filter min_tool_calls``),
because whether a direct answer is wrong depends on the prompts.
"""

from __future__ import annotations

import os

from pydantic import Field

from trajkit import hookimpl
from trajkit.config.settings import StrictSettings
from trajkit.manager import PluginError
from trajkit.record.filters import Record, TrajectoryFilter

ENV_MINIMUM = "TRAJKIT_MIN_TOOL_CALLS"
DEFAULT_MINIMUM = 2


@hookimpl
def trajkit_filters() -> list[type[TrajectoryFilter]]:
    return [MinToolCalls]


class MinToolCalls(TrajectoryFilter):
    """Rejects a trajectory with fewer tool calls than the minimum.

    Every call the model made counts, whether or not the tool succeeded: a failed call followed by
    a recovery is exactly the behaviour worth training on. The merge re-applies filters on every
    invocation, so resume a run with the same minimum.
    """

    name = "min_tool_calls"
    description = (
        f"fewer than N tool calls (--min_tool_calls.minimum, ${ENV_MINIMUM}, default {DEFAULT_MINIMUM})"
    )
    enabled_by_default = False

    class Settings(StrictSettings):
        minimum: int = Field(default_factory=lambda: configured_minimum(), ge=0)
        """Tool calls a trajectory needs at least (default: $TRAJKIT_MIN_TOOL_CALLS, else 2)."""

    def check(self, record: Record) -> str | None:
        minimum = self.settings.minimum
        calls = sum(len(turn["tool_calls"]) for turn in record["conversations"] if turn["from"] == "gpt")
        if calls < minimum:
            return f"{calls} tool call{'' if calls == 1 else 's'}, fewer than {minimum}"
        return None


def configured_minimum() -> int:
    """The minimum from the environment, or the default; a malformed value is an error, not ignored."""
    raw = os.environ.get(ENV_MINIMUM, "").strip()
    if not raw:
        return DEFAULT_MINIMUM
    try:
        return int(raw)
    except ValueError:
        raise PluginError(f"${ENV_MINIMUM}={raw!r} is not a whole number") from None
