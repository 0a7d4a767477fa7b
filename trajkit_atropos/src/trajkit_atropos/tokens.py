"""A rollout as the tokens a trainer trains on: rendered through the policy's chat template, the
assistant's turns masked in.

Rendering is the export's (:mod:`trajkit.plugins.export.chat_templates`): the conversation is adapted to
what the template takes, rendered by transformers' own renderer, checked (nothing dropped or
mangled), and each assistant turn located as the text the model generates after the generation
prompt (or the template's ``{% generation %}`` blocks), up to and including its end-of-turn
token (the template's line break after that token is not the model's). The text is then tokenized a piece at a
time, cut at the assistant spans: every token lies wholly inside an assistant turn or wholly
outside one, as the policy produced it (its reply tokens follow the prompt's, never merged across
the boundary). Masks follow Atropos: the token id where trained, -100 elsewhere.

atroposlib's own ``tokenize_for_trainer`` is not used: on transformers 5 it receives a
``BatchEncoding`` from ``apply_chat_template`` and fails.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from trajkit.model import Message
from trajkit.plugins.export.chat_templates.adapt import base_messages
from trajkit.plugins.export.chat_templates.export import TemplateExport
from trajkit.plugins.export.chat_templates.source import SPECIAL_TOKENS, ChatTemplate, load_chat_template
from trajkit.record.trajectory import conversations_json

NOT_TRAINED = -100
"""Atropos's mask value for a token the loss ignores."""


class Tokenizer(Protocol):
    """What is needed of a Hugging Face tokenizer (``PreTrainedTokenizerFast``)."""

    def __call__(self, text: list[str], *, add_special_tokens: bool) -> Mapping[str, Any]: ...


class RenderingError(Exception):
    """A rollout the template cannot render faithfully; the message names the reason."""


@dataclass
class Tokenized:
    tokens: list[int]
    masks: list[int]
    text: str
    messages: list[dict[str, Any]]
    """The conversation as OpenAI messages (what Atropos keeps beside the tokens)."""


def policy_template(tokenizer: Any, override: str | None = None) -> ChatTemplate:
    """The chat template to render with: ``override`` (a ``.jinja`` file or a model directory),
    else the tokenizer's own, with the tokenizer's named special tokens as its variables."""
    variables = {
        key: value for key in SPECIAL_TOKENS if isinstance(value := getattr(tokenizer, key, None), str)
    }
    if override:
        return load_chat_template(override, variables=variables)
    try:
        text = tokenizer.get_chat_template(tools=[{"type": "function"}])
    except (ValueError, TypeError) as exc:
        raise RenderingError(
            f"the tokenizer has no chat template ({exc}); give one with --env.chat_template"
        ) from None
    name = str(getattr(tokenizer, "name_or_path", "") or "tokenizer")
    return ChatTemplate(name.rstrip("/").rsplit("/", 1)[-1], name, text, variables)


class Renderer:
    """Rollouts through one template and tokenizer; the template is fitted once (see
    :func:`trajkit.plugins.export.chat_templates.export.fit_template`)."""

    def __init__(self, template: ChatTemplate, tokenizer: Tokenizer) -> None:
        self.template = template
        self.tokenizer = tokenizer
        self.export = TemplateExport(template, {}, "text", split=False)

    def tokenize(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]]) -> Tokenized:
        record = {"conversations": conversations_json(list(messages))}
        result = self.export.process(record, tools)
        if result.row is None:
            raise RenderingError(f"{result.reason}: {result.detail}")
        text: str = result.row["text"]
        spans: list[list[int]] = result.row["assistant_spans"]
        pieces: list[tuple[str, bool]] = []
        cursor = 0
        for start, span_end in spans:
            end = self._generated_end(text, start, span_end)
            if start > cursor:
                pieces.append((text[cursor:start], False))
            if end > start:
                pieces.append((text[start:end], True))
            cursor = max(cursor, end)
        if cursor < len(text):
            pieces.append((text[cursor:], False))
        encoded = self.tokenizer([piece for piece, _ in pieces], add_special_tokens=False)["input_ids"]
        tokens: list[int] = []
        masks: list[int] = []
        for (_, trained), ids in zip(pieces, encoded, strict=True):
            tokens += ids
            masks += ids if trained else [NOT_TRAINED] * len(ids)
        return Tokenized(tokens, masks, text, base_messages(record)[0])

    def _generated_end(self, text: str, start: int, end: int) -> int:
        """Where the policy stopped in a turn's span: after its end-of-turn token, not the
        template's line break that follows it (which the model never produced)."""
        eos = self.template.variables.get("eos_token")
        if not eos:
            return end
        stop = text.rfind(eos, start, end)
        if stop < 0 or text[stop + len(eos) : end].strip():
            return end
        return stop + len(eos)
