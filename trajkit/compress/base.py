"""What a compressor plugin and a token counter plugin provide.

Each class declares its settings as a pydantic model (``Settings``), the one place their defaults
live; ``trajkit compress --option KEY=VALUE`` (and ``--tokenizer_option``) are validated against it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from trajkit.config.settings import StrictSettings

Turn = dict[str, Any]
"""One ShareGPT turn as found in the record: ``from``, ``value`` and whatever else it carries."""


class TokenCounter(ABC):
    """Counts the tokens a conversation takes in a trainer's context."""

    name: ClassVar[str]
    description: ClassVar[str] = ""
    Settings: ClassVar[type[StrictSettings]] = StrictSettings
    accepts_source: ClassVar[bool] = False
    """``--tokenizer VALUE`` that names no counter selects a counter that accepts a ``source``
    setting (a file or a model id); exactly one registered counter should."""

    def __init__(self, settings: StrictSettings) -> None:
        self.settings = settings

    @property
    def turn_overhead(self) -> int:
        """Tokens the chat template adds around each turn (role markers, separators); 0 if unknown."""
        return 0

    @abstractmethod
    def count_text(self, text: str) -> int:
        """Tokens of ``text`` alone."""

    def describe(self) -> str:
        """A short name for the metadata, e.g. ``estimate`` or ``hf:path/to/tokenizer.json``."""
        return self.name

    def count_turn(self, turn: Turn) -> int:
        return self.count_text(turn_text(turn)) + self.turn_overhead

    def count(self, turns: list[Turn]) -> int:
        return sum(self.count_turn(turn) for turn in turns)


def turn_text(turn: Turn) -> str:
    """Everything of a turn a trainer renders: value, reasoning and structured tool calls."""
    parts = [str(turn.get("value") or "")]
    reasoning = turn.get("reasoning")
    if reasoning:
        parts.append(str(reasoning))
    for call in turn.get("tool_calls") or ():
        if isinstance(call, Mapping):
            parts.append(f"{call.get('name') or ''} {call.get('arguments') or ''}")
    return "\n".join(parts) if len(parts) > 1 else parts[0]


@dataclass
class SummaryResult:
    text: str
    model: str
    cost: float = 0.0
    requests: int = 0
    """Model requests paid for this summary: 0 when it came from the cache."""


Summarize = Callable[[list[Turn], str, int], Awaitable[SummaryResult]]
"""``summarize(region, prompt, turn_chars)``: the region's summary, asked for with ``prompt`` as the
system message and each turn of the region shown up to ``turn_chars`` characters."""


@dataclass
class CompressionContext:
    """What a compressor gets to work with: the token counter, and a summariser when one is set up."""

    counter: TokenCounter
    summarize: Summarize | None = None


@dataclass
class Outcome:
    """What one compression of one conversation produced."""

    turns: list[Turn]
    tokens: int
    notes: list[str] = field(default_factory=list)
    """Why the result is still over budget, or what was skipped; a person reads these."""
    summaries: int = 0
    masked: int = 0
    requests: int = 0
    cost: float = 0.0
    summary_model: str | None = None


class Compressor(ABC):
    """Shrinks a conversation to a token budget, keeping each gpt turn with its tool results.

    Made once per invocation from its validated settings; :meth:`compress` is called for each
    record over budget, possibly many at once on one event loop, so keep per-record state local.
    """

    name: ClassVar[str]
    description: ClassVar[str] = ""
    Settings: ClassVar[type[StrictSettings]] = StrictSettings
    uses_model: ClassVar[bool] = False
    """True when :meth:`compress` needs ``context.summarize`` (the command then builds a client)."""

    def __init__(self, settings: StrictSettings, context: CompressionContext) -> None:
        self.settings = settings
        self.context = context

    @abstractmethod
    async def compress(self, turns: list[Turn], budget: int, tokens: int) -> Outcome:
        """Return ``turns`` shrunk to at most ``budget`` tokens where possible.

        :param turns: the record's conversation (never modified in place).
        :param budget: the token budget.
        :param tokens: what ``turns`` count now, as the context's counter counts them.
        :raises Exception: any failure; the record is then written unchanged and flagged.
        """
