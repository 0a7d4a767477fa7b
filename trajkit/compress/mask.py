"""``mask_observations``: older tool results replaced by a placeholder; no model, deterministic.

Tool output is most of an agent's tokens and the part a later turn least depends on verbatim;
masking it kept agents' results on benchmarks while halving cost (REFERENCE §F). Every call keeps
its answer turn, so the trajectory stays valid; only the answer's text shrinks.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field, field_validator

from trajkit.compress.base import Compressor, Outcome, StrictSettings, Turn
from trajkit.compress.turns import TOOL_RESPONSE_BLOCK, role


class MaskSettings(StrictSettings):
    keep_last: int = Field(3, ge=0, description="the last K tool turns are kept whole")
    min_chars: int = Field(200, ge=0, description="tool output shorter than this is left as it is")
    mask_all: bool = Field(
        False,
        description="mask every older tool output, not only as many (oldest first) as the budget needs",
    )
    placeholder: str = Field(
        "Old tool output omitted ({lines} lines, {chars} characters).",
        description="replacement text; {lines} and {chars} say how much was omitted",
    )

    @field_validator("placeholder")
    @classmethod
    def _fields_known(cls, value: str) -> str:
        try:
            value.format(lines=0, chars=0)
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"only {{lines}} and {{chars}} may be used ({exc})") from None
        return value


class MaskObservations(Compressor):
    name = "mask_observations"
    description = "replace older tool results with a placeholder saying how much was omitted"
    Settings = MaskSettings

    settings: MaskSettings

    async def compress(self, turns: list[Turn], budget: int, tokens: int) -> Outcome:
        return self.mask(turns, budget, tokens)

    def mask(self, turns: list[Turn], budget: int, tokens: int) -> Outcome:
        """The synchronous core, also used by ``pipeline``."""
        counter = self.context.counter
        tool_positions = [i for i, turn in enumerate(turns) if role(turn) == "tool"]
        keep = self.settings.keep_last
        older = tool_positions[: len(tool_positions) - keep] if keep else tool_positions
        result = list(turns)
        masked = 0
        for position in older:
            if tokens <= budget and not self.settings.mask_all:
                break
            replaced = self.masked_turn(result[position])
            if replaced is None:
                continue
            tokens += counter.count_turn(replaced) - counter.count_turn(result[position])
            result[position] = replaced
            masked += 1
        notes = []
        if tokens > budget:
            notes.append(
                f"{tokens} tokens after masking {masked} of {len(tool_positions)} tool outputs "
                f"(the last {keep} kept whole)"
            )
        return Outcome(result if masked else list(turns), tokens, notes, masked=masked)

    def masked_turn(self, turn: Turn) -> Turn | None:
        """The turn with its output replaced, or None when there is too little to gain."""
        value = str(turn.get("value") or "")
        if len(value) < self.settings.min_chars:
            return None
        if TOOL_RESPONSE_BLOCK.search(value):
            new_value = TOOL_RESPONSE_BLOCK.sub(lambda m: self._block(m.group(1)), value)
        else:
            new_value = self.placeholder(value)
        if len(new_value) >= len(value):
            return None  # the placeholder would be longer than what it replaces
        return {**turn, "value": new_value}

    def placeholder(self, text: str) -> str:
        return self.settings.placeholder.format(lines=max(1, len(text.splitlines())), chars=len(text))

    def _block(self, inner: str) -> str:
        """A reference-shape ``<tool_response>`` block: its JSON keeps the call's id and name."""
        try:
            data: Any = json.loads(inner)
        except ValueError:
            data = None
        if isinstance(data, dict) and "content" in data:
            text = _text_of(data["content"])
            data = {**data, "content": self.placeholder(text)}
            return f"<tool_response>\n{json.dumps(data, ensure_ascii=False)}\n</tool_response>"
        return f"<tool_response>\n{self.placeholder(inner.strip())}\n</tool_response>"


def _text_of(content: Any) -> str:
    """What a result held, as a reader would count its lines: an object's string fields, joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        strings = [value for value in content.values() if isinstance(value, str)]
        if strings:
            return "\n".join(strings)
    return json.dumps(content, ensure_ascii=False)
