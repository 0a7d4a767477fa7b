"""``summary`` and ``pipeline``: the reference compressor done right, and masking followed by it.

``summary`` protects the first system, human, gpt and tool turns (found by role, wherever they are)
and the last ``keep_last`` turns, and replaces the earliest stretch of unprotected units that saves
enough with one ``[CONTEXT SUMMARY]: ...`` human turn written by a model. Regions are whole units
(a gpt turn with all its tool results), so no call is parted from its result and the parallel
calls of one turn stay together. It repeats, folding the previous summary into the next region,
until the record fits or nothing more can be gained, and then says why.
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import Field, field_validator

from trajkit.compress.base import CompressionContext, Compressor, Outcome, StrictSettings, Turn
from trajkit.compress.mask import MaskObservations, MaskSettings
from trajkit.compress.turns import SUMMARY_PREFIX, new_turn, protected_units, units

DEFAULT_PROMPT = (
    "You condense part of an AI agent's working session so that the session can continue without "
    "it. The excerpt below is the middle of the session: the task and the latest turns are kept "
    "elsewhere. Write at most about {summary_tokens} tokens of plain text under these headings: "
    "Progress (what was attempted and what came of it), Facts found (file names, values, errors, "
    "command results the agent may need again), State (what exists now), Open (what was still "
    "undecided). Keep names and numbers exact. No preamble."
)


class SummarySettings(StrictSettings):
    keep_last: int = Field(4, ge=0, description="the last N turns are never summarised")
    summary_tokens: int = Field(750, ge=16, description="target length of one summary, in tokens")
    max_summaries: int = Field(3, ge=1, description="summaries per record at most")
    turn_chars: int = Field(
        4000, ge=200, description="characters of each turn shown to the summariser (head and tail)"
    )
    prompt: str = Field(
        DEFAULT_PROMPT, description="system prompt of the summary request; {summary_tokens} is filled in"
    )

    @field_validator("prompt")
    @classmethod
    def _fields_known(cls, value: str) -> str:
        try:
            value.format(summary_tokens=0)
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"only {{summary_tokens}} may be used ({exc})") from None
        return value


class Summary(Compressor):
    name = "summary"
    description = "summarise a middle region with a model into one [CONTEXT SUMMARY] turn"
    Settings = SummarySettings
    uses_model = True

    settings: SummarySettings

    async def compress(self, turns: list[Turn], budget: int, tokens: int) -> Outcome:
        return await summarise(turns, budget, tokens, self.settings, self.context)


async def summarise(
    turns: list[Turn], budget: int, tokens: int, settings: SummarySettings, context: CompressionContext
) -> Outcome:
    if context.summarize is None:
        raise RuntimeError("the summary strategy needs a model (no summariser was set up)")
    counter = context.counter
    outcome = Outcome(list(turns), tokens)
    while outcome.tokens > budget:
        if outcome.summaries >= settings.max_summaries:
            outcome.notes.append(
                f"{outcome.tokens} tokens after {outcome.summaries} summaries (max_summaries)"
            )
            break
        region = choose_region(outcome.turns, outcome.tokens - budget, settings, counter.count)
        if region is None:
            outcome.notes.append(
                f"{outcome.tokens} tokens: what is left to summarise is too small to gain anything "
                f"(the protected turns and the last {settings.keep_last} are kept)"
            )
            break
        start, end = region
        prompt = settings.prompt.format(summary_tokens=settings.summary_tokens)
        result = await context.summarize(outcome.turns[start:end], prompt, settings.turn_chars)
        summary = new_turn(outcome.turns[start], "human", SUMMARY_PREFIX + result.text.strip())
        saved = counter.count(outcome.turns[start:end]) - counter.count_turn(summary)
        outcome.requests += result.requests
        outcome.cost += result.cost
        outcome.summary_model = result.model
        if saved <= 0:
            outcome.notes.append(f"{outcome.tokens} tokens: the summary was no shorter than its region")
            break
        outcome.turns[start:end] = [summary]
        outcome.tokens -= saved
        outcome.summaries += 1
    return outcome


def choose_region(
    turns: list[Turn], excess: int, settings: SummarySettings, count: Callable[[list[Turn]], int]
) -> tuple[int, int] | None:
    """``[start, end)`` of the shortest run of whole unprotected units, earliest first, that saves
    ``excess`` tokens once replaced by a summary; a whole run when none does; None when no run
    is longer than a summary."""
    spans = units(turns)
    protected = protected_units(turns, spans, settings.keep_last)
    for first, last in _free_runs(len(spans), protected):
        taken = 0
        for number in range(first, last):
            start, end = spans[number]
            taken += count(turns[start:end])
            if taken - settings.summary_tokens >= excess:
                return spans[first][0], end
        if taken > settings.summary_tokens:
            return spans[first][0], spans[last - 1][1]
    return None


def _free_runs(total: int, protected: set[int]) -> list[tuple[int, int]]:
    runs, start = [], None
    for number in range(total + 1):
        free = number < total and number not in protected
        if free and start is None:
            start = number
        elif not free and start is not None:
            runs.append((start, number))
            start = None
    return runs


class PipelineSettings(StrictSettings):
    mask: MaskSettings = Field(default_factory=MaskSettings, description="the masking step")
    summary: SummarySettings = Field(default_factory=SummarySettings, description="the summary step")


class Pipeline(Compressor):
    name = "pipeline"
    description = "mask_observations first, then summary for what is still over budget"
    Settings = PipelineSettings
    uses_model = True

    settings: PipelineSettings

    def __init__(self, settings: StrictSettings, context: CompressionContext) -> None:
        super().__init__(settings, context)
        self.masking = MaskObservations(self.settings.mask, context)

    async def compress(self, turns: list[Turn], budget: int, tokens: int) -> Outcome:
        masked = self.masking.mask(turns, budget, tokens)
        if masked.tokens <= budget:
            return masked
        outcome = await summarise(masked.turns, budget, masked.tokens, self.settings.summary, self.context)
        outcome.masked = masked.masked
        return outcome
