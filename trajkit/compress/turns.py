"""Conversation structure shared by every strategy: units, protected turns and validity.

Two record shapes are read. trajkit's own turns carry structured ``tool_calls`` on gpt turns and
``tool_call_id`` on tool turns; the reference runner's turns are ``{from, value}`` only, with
``<tool_call>{json}</tool_call>`` blocks in gpt values and ``<tool_response>{json}</tool_response>``
blocks in tool values (parallel results in one tool turn). Both are handled without converting:
a *unit* is a gpt turn with every tool turn that follows it, which keeps a call with its result
and the parallel calls of one turn together in either shape.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from trajkit.compress.base import Turn

TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
TOOL_RESPONSE_BLOCK = re.compile(r"<tool_response>(.*?)</tool_response>", re.DOTALL)
SUMMARY_PREFIX = "[CONTEXT SUMMARY]: "


def role(turn: Turn) -> str:
    return str(turn.get("from") or "")


def units(turns: list[Turn]) -> list[tuple[int, int]]:
    """``[start, end)`` spans that must stay together: a gpt turn with its tool turns, or one turn."""
    spans: list[tuple[int, int]] = []
    position = 0
    while position < len(turns):
        end = position + 1
        if role(turns[position]) == "gpt":
            while end < len(turns) and role(turns[end]) == "tool":
                end += 1
        spans.append((position, end))
        position = end
    return spans


def protected_units(turns: list[Turn], spans: list[tuple[int, int]], keep_last: int) -> set[int]:
    """Indices into ``spans`` that no strategy may summarise.

    The first system, human, gpt and tool turns, each found by its role wherever it is (the
    reference split its protected indices at the conversation's midpoint, which lost the first tool
    turn when it came late), and the units holding the last ``keep_last`` turns. An earlier summary is not protected: the
    next region folds it in, so one summary grows rather than several piling up.
    """
    firsts: dict[str, int] = {}
    for index, turn in enumerate(turns):
        firsts.setdefault(role(turn), index)
    wanted = {firsts[name] for name in ("system", "human", "gpt", "tool") if name in firsts}
    tail_start = max(0, len(turns) - keep_last) if keep_last > 0 else len(turns)
    protected = set()
    for number, (start, end) in enumerate(spans):
        if end > tail_start or any(start <= index < end for index in wanted):
            protected.add(number)
    return protected


def new_turn(like: Turn, from_: str, value: str) -> Turn:
    """A turn with the same keys as ``like``: every turn of a record keeps one schema for Arrow."""
    turn: Turn = {key: [] if isinstance(item, list) else None for key, item in like.items()}
    turn["from"] = from_
    turn["value"] = value
    return turn


def call_ids(turn: Turn) -> list[str] | None:
    """Ids of a gpt turn's structured calls; None when it has none (then its text blocks count)."""
    calls = turn.get("tool_calls")
    if isinstance(calls, list) and calls:
        return [str(call.get("id")) if isinstance(call, dict) else "" for call in calls]
    return None


def problems(turns: list[Turn]) -> list[str]:
    """What makes ``turns`` an invalid trajectory: roles out of order, calls left unanswered."""
    found: list[str] = []
    seen_other = False
    for index, turn in enumerate(turns):
        name = role(turn)
        if name not in {"system", "human", "gpt", "tool"}:
            found.append(f"turn {index}: unknown role {name!r}")
        elif name == "system" and seen_other:
            found.append(f"turn {index}: a system turn after the conversation started")
        elif name == "tool" and (index == 0 or role(turns[index - 1]) not in {"gpt", "tool"}):
            found.append(f"turn {index}: a tool turn that follows no gpt turn")
        seen_other = seen_other or name != "system"
    for start, end in units(turns):
        if role(turns[start]) == "gpt":
            found.extend(_unanswered(turns, start, end))
    return found


def _unanswered(turns: list[Turn], start: int, end: int) -> Iterable[str]:
    results = turns[start + 1 : end]
    ids = call_ids(turns[start])
    if ids is not None:
        answered = {str(turn.get("tool_call_id")) for turn in results}
        structured = all(turn.get("tool_call_id") for turn in results) and results
        if structured:
            missing = [call for call in ids if call not in answered]
            if missing:
                yield f"turn {start}: calls {missing} have no tool result"
            return
        expected = len(ids)
    else:
        expected = len(TOOL_CALL_BLOCK.findall(str(turns[start].get("value") or "")))
    answered_count = sum(max(1, len(TOOL_RESPONSE_BLOCK.findall(str(t.get("value") or "")))) for t in results)
    if expected and answered_count < expected:
        yield f"turn {start}: {expected} tool calls, {answered_count} results"
