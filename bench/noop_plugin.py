"""A benchmark plugin: a tool that does nothing, so a run measures the harness alone.

Registers the toolset ``noop`` (one tool ``noop`` that answers "ok" without touching the
sandbox) and the distribution ``noop_only`` that offers it alone. The benchmarks copy this file into a temporary site directory next to a
``.dist-info`` whose entry points name it, so ``trajkit`` finds it like any installed plugin.
"""

from __future__ import annotations

from typing import Any

from trajkit import hookimpl
from trajkit.tools import Tool, ToolContext, Toolset
from trajkit.tools.distributions import Distribution


async def noop(args: dict[str, Any], ctx: ToolContext) -> str:
    return "ok"


NOOP = Toolset(
    "noop",
    "a tool that does nothing (benchmarks)",
    (Tool("noop", "Do nothing and answer ok.", {"type": "object", "properties": {}}, noop),),
)


@hookimpl
def trajkit_toolsets() -> list[Toolset]:
    return [NOOP]


@hookimpl
def trajkit_distributions() -> list[Distribution]:
    return [Distribution("noop_only", "the benchmark's no-op tool alone", {"noop": 1.0})]
