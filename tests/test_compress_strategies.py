"""Compression strategies in process: regions, protected turns, masking, validity, settings."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from trajkit import hookimpl
from trajkit.compress.base import CompressionContext, SummaryResult
from trajkit.compress.counters import EstimateCounter
from trajkit.compress.mask import MaskObservations, MaskSettings
from trajkit.compress.summary import Pipeline, PipelineSettings, Summary, SummarySettings
from trajkit.compress.turns import SUMMARY_PREFIX, TOOL_RESPONSE_BLOCK, problems, units
from trajkit.config.settings import OptionError, build_settings, parse_pairs
from trajkit.manager import PluginError, load_plugins
from trajkit.testing.trajectories import reference_record, trajkit_record


def counter() -> EstimateCounter:
    return EstimateCounter(EstimateCounter.Settings())


class RecordingSummariser:
    """Stands in for the model in unit tests: remembers every region it was asked to summarise."""

    def __init__(self) -> None:
        self.regions: list[list[dict[str, Any]]] = []

    async def __call__(self, region: list[dict[str, Any]], prompt: str, turn_chars: int) -> SummaryResult:
        self.regions.append(region)
        return SummaryResult(text=f"{len(region)} turns condensed.", model="m", requests=1)


def summarise(turns: list[dict[str, Any]], budget: int, **settings: Any) -> tuple[Any, RecordingSummariser]:
    summariser = RecordingSummariser()
    strategy = Summary(SummarySettings(**settings), CompressionContext(counter(), summariser))
    tokens = counter().count(turns)
    return asyncio.run(strategy.compress(turns, budget, tokens)), summariser


def test_summary_regions_keep_parallel_calls_with_their_results() -> None:
    turns = trajkit_record(0, steps=20, parallel=3)["conversations"]
    outcome, summariser = summarise(turns, 2500, summary_tokens=50, max_summaries=5)
    assert outcome.tokens <= 2500 and outcome.summaries >= 1
    assert problems(outcome.turns) == []
    for region in summariser.regions:
        assert region[0]["from"] in {"gpt", "human"}  # a region starts at a unit, never at a result
        called = {c["id"] for t in region if t["from"] == "gpt" for c in t["tool_calls"]}
        answered = {t["tool_call_id"] for t in region if t["from"] == "tool"}
        assert called == answered  # every call in the region has its results with it, and only those
    summaries = [t for t in outcome.turns if t["value"].startswith(SUMMARY_PREFIX)]
    assert [t["from"] for t in summaries] == ["human"]  # later rounds fold the earlier summary in
    assert set(summaries[0]) == set(turns[0])  # the same turn fields: one schema for Arrow
    assert outcome.turns[-4:] == turns[-4:]


def test_first_tool_turn_late_in_the_conversation_is_protected() -> None:
    """The reference split its protected indices at the midpoint and lost a late first tool turn."""
    record = trajkit_record(1, steps=10, parallel=2, answer_first=8)
    turns = record["conversations"]
    first_tool = next(i for i, t in enumerate(turns) if t["from"] == "tool")
    assert first_tool > len(turns) // 2 - 10  # well past the head the reference protected
    outcome, summariser = summarise(turns, 1500, summary_tokens=40, keep_last=2, max_summaries=5)
    kept = outcome.turns
    for index in (0, 1, 2, first_tool - 1, first_tool, first_tool + 1):
        assert turns[index] in kept, index  # system, human, first gpt, and the first tool unit whole
    for region in summariser.regions:
        assert turns[first_tool] not in region
    assert problems(kept) == []


def test_summary_says_why_when_protected_turns_alone_are_over_budget() -> None:
    turns = trajkit_record(2, steps=3, parallel=1)["conversations"]
    outcome, summariser = summarise(turns, 50, keep_last=4)
    assert outcome.tokens > 50 and outcome.turns == turns
    assert "too small to gain anything" in outcome.notes[0]
    assert summariser.regions == []


def test_masking_keeps_the_last_results_and_says_what_was_omitted() -> None:
    turns = trajkit_record(3, steps=8, parallel=2, lines=30)["conversations"]
    strategy = MaskObservations(MaskSettings(keep_last=3, mask_all=True), CompressionContext(counter()))
    outcome = strategy.mask(turns, 10**6, counter().count(turns))
    tools = [i for i, t in enumerate(turns) if t["from"] == "tool"]
    for index in tools[:-3]:
        original = turns[index]["value"]
        assert outcome.turns[index]["value"] == (
            f"Old tool output omitted ({original.count(chr(10)) + 1} lines, {len(original)} characters)."
        )
        assert outcome.turns[index]["tool_call_id"] == turns[index]["tool_call_id"]
    for index in tools[-3:]:
        assert outcome.turns[index] == turns[index]
    assert outcome.masked == len(tools) - 3 and problems(outcome.turns) == []
    again = strategy.mask(turns, 10**6, counter().count(turns))
    assert again.turns == outcome.turns  # deterministic


def test_masking_stops_once_under_budget_oldest_first() -> None:
    turns = trajkit_record(4, steps=8, parallel=1, lines=30)["conversations"]
    tokens = counter().count(turns)
    strategy = MaskObservations(MaskSettings(keep_last=1), CompressionContext(counter()))
    outcome = strategy.mask(turns, tokens - 600, tokens)
    masked = [i for i, (a, b) in enumerate(zip(turns, outcome.turns, strict=True)) if a != b]
    tools = [i for i, t in enumerate(turns) if t["from"] == "tool"]
    assert masked == tools[: len(masked)] and 0 < len(masked) < len(tools) - 1
    assert outcome.tokens <= tokens - 600 and outcome.tokens == counter().count(outcome.turns)


def test_reference_shape_masking_keeps_the_response_wrapper_and_call_ids() -> None:
    turns = reference_record(5, steps=6, parallel=2)["conversations"]
    strategy = MaskObservations(MaskSettings(keep_last=1, mask_all=True), CompressionContext(counter()))
    outcome = strategy.mask(turns, 10**6, counter().count(turns))
    first_tool = next(t for t in outcome.turns if t["from"] == "tool")
    blocks = [json.loads(b) for b in TOOL_RESPONSE_BLOCK.findall(first_tool["value"])]
    assert [b["tool_call_id"] for b in blocks] == ["call_0_0", "call_0_1"]
    assert all(b["content"].startswith("Old tool output omitted") for b in blocks)
    assert problems(outcome.turns) == [] and set(first_tool) == {"from", "value"}


def test_pipeline_masks_first_and_summarises_only_what_is_still_over() -> None:
    turns = trajkit_record(6, steps=16, parallel=2, lines=30)["conversations"]
    tokens = counter().count(turns)
    summariser = RecordingSummariser()
    settings = PipelineSettings(summary=SummarySettings(summary_tokens=30))
    pipeline = Pipeline(settings, CompressionContext(counter(), summariser))
    loose = asyncio.run(pipeline.compress(turns, tokens // 2, tokens))
    assert loose.masked > 0 and loose.summaries == 0 and summariser.regions == []
    masked_only = MaskObservations(settings.mask, CompressionContext(counter())).mask(turns, 1100, tokens)
    assert masked_only.tokens > 1100  # masking alone cannot reach this budget
    tight = asyncio.run(pipeline.compress(turns, 1100, tokens))
    assert tight.masked > 0 and tight.summaries >= 1 and tight.tokens <= 1100
    assert problems(tight.turns) == []


def test_validity_checks_catch_unanswered_calls_and_misplaced_turns() -> None:
    turns = trajkit_record(7, steps=2, parallel=2)["conversations"]
    assert problems(turns) == []
    missing = [t for t in turns if t.get("tool_call_id") != "call_1_1"]
    assert problems(missing) == ["turn 5: calls ['call_1_1'] have no tool result"]
    reference = reference_record(7, steps=2, parallel=2)["conversations"]
    cut = [*reference[:3], {"from": "tool", "value": reference[3]["value"].split("\n</tool_response>")[0]}]
    assert problems(cut) == ["turn 2: 2 tool calls, 1 results"]
    assert problems([turns[0], turns[3]]) == ["turn 1: a tool turn that follows no gpt turn"]
    assert [end - start for start, end in units(turns)] == [1, 1, 3, 3, 1]


def test_options_are_validated_against_the_strategy_settings() -> None:
    data = parse_pairs(["mask.keep_last=5", "summary.summary_tokens=100"], "--option")
    settings = build_settings(PipelineSettings, data, "strategy 'pipeline'", "--option")
    assert isinstance(settings, PipelineSettings)
    assert settings.mask.keep_last == 5 and settings.summary.summary_tokens == 100
    with pytest.raises(OptionError) as bad:
        build_settings(
            SummarySettings, parse_pairs(["keep_last=many"], "--option"), "strategy 'summary'", "--option"
        )
    assert "--option keep_last=many: strategy 'summary' expects keep_last to be int >= 0" in str(bad.value)
    with pytest.raises(OptionError, match=r"has no setting 'mask.keep'.*keep_last, mask_all"):
        build_settings(
            PipelineSettings, parse_pairs(["mask.keep=1"], "--option"), "strategy 'pipeline'", "--option"
        )
    with pytest.raises(OptionError, match=r"placeholder.*only \{lines\} and \{chars\}"):
        build_settings(
            MaskSettings, {"placeholder": "{tokens} gone"}, "strategy 'mask_observations'", "--option"
        )


def test_compressors_and_token_counters_register_through_hooks() -> None:
    host = load_plugins(entry_points=False)
    assert set(host.compressors) == {"summary", "mask_observations", "pipeline"}
    assert set(host.token_counters) == {"estimate", "hf"}

    class Shadow(MaskObservations):
        name = "summary"

    class Plugin:
        @hookimpl
        def trajkit_compressors(self) -> list[type[MaskObservations]]:
            return [Shadow]

        @hookimpl
        def trajkit_token_counters(self) -> list[type[EstimateCounter]]:
            return [EstimateCounter]

    host = load_plugins(entry_points=False, extra=[("shadow", Plugin())])
    with pytest.raises(PluginError, match=r"compressor 'summary' is registered twice: by trajkit\.plugins"):
        _ = host.compressors
    with pytest.raises(PluginError, match=r"token counter 'estimate' is registered twice"):
        _ = host.token_counters
