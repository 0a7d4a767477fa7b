"""Tools and toolsets: what the model may call, and how a call runs against the sandbox."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from trajkit.sandbox import Sandbox


class ToolError(Exception):
    """Raised by a tool implementation: the call failed, the message goes back to the model."""


@dataclass
class ToolContext:
    """What a tool implementation gets besides its arguments."""

    sandbox: Sandbox
    timeout: float = 60.0
    output_cap: int = 16 * 1024


ToolFunction = Callable[[dict[str, Any], ToolContext], Awaitable[str]]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    """JSON schema of the arguments object."""
    run: ToolFunction = field(compare=False)

    def schema(self) -> dict[str, Any]:
        """The tool as the OpenAI ``tools`` list expects it."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass(frozen=True)
class Toolset:
    """A named group of tools that a distribution includes or leaves out as a whole."""

    name: str
    description: str
    tools: tuple[Tool, ...]


@dataclass
class ToolOutcome:
    """The result of one tool call as the model sees it, and whether it counts as a failure."""

    content: str
    ok: bool
