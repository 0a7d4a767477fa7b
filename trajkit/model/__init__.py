"""What a model client plugin provides: a chat request in, one assistant message out."""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from trajkit.config.settings import StrictSettings

if TYPE_CHECKING:
    from trajkit.config.run_config import RunConfig

Message = dict[str, Any]
"""One chat message in OpenAI wire format (role, content, tool_calls, tool_call_id, reasoning)."""


class ModelError(RuntimeError):
    """The model call failed after the client's own retries; the session fails with it."""

    error_class = "api_error"
    retryable = True
    """Worth another attempt of the session within this run."""
    stops_run = False
    """Every other session would fail the same way: the run stops instead of failing them one by one."""
    permanent = False
    """No attempt of this prompt can succeed with the run's settings: a later ``--resume`` does not
    run it again either (unless a setting that shapes its sessions changed)."""


class ModelAuthError(ModelError):
    """Credentials were refused: every further call would fail too, so the run stops."""

    error_class = "auth_error"
    retryable = False
    stops_run = True


class ModelConfigError(ModelError):
    """The request can never succeed as configured (unknown model, bad parameters)."""

    error_class = "bad_request"
    retryable = False


class ModelContextOverflow(ModelConfigError):
    """The conversation is longer than the model's context (OpenAI's ``context_length_exceeded``).

    Final for that prompt: the same prompt with the same settings grows the same way.
    """

    error_class = "context_length_exceeded"
    permanent = True


class ModelNotFound(ModelConfigError):
    """The endpoint does not know the model: no prompt of the run can succeed."""

    error_class = "model_not_found"
    stops_run = True


class ModelEndpointError(ModelConfigError):
    """The endpoint cannot serve this run as configured: a malformed URL or key, a redirect, a host
    that cannot be reached or credentials refused when the run starts. One message, the run stops."""

    error_class = "endpoint_error"
    stops_run = True


class ModelUnreachable(ModelError):
    """The endpoint stopped answering mid-run for longer than the client's bound.

    Every session would fail the same way, so the run stops; a later ``--resume`` may succeed.
    """

    error_class = "endpoint_unreachable"
    stops_run = True


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str
    """The raw argument string the model produced; may be invalid JSON."""


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float | None = None

    def add(self, other: Usage) -> None:
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        if other.cost is not None:
            self.cost = (self.cost or 0.0) + other.cost


@dataclass
class AssistantMessage:
    content: str = ""
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    finish_reason: str | None = None


class ModelClient(ABC):
    """Turns a chat request into an assistant message.

    Made once per run by :meth:`from_config` and shared by every session of the run, so it may
    hold connection pools and rate limiters.
    """

    name: ClassVar[str]
    description: ClassVar[str] = ""
    takes_any_model: ClassVar[bool] = False
    """Whether the client serves a ``--model`` that names no client (an endpoint's model slug).
    Exactly one installed client should; ``--model NAME`` of a client's own name picks that one."""
    Settings: ClassVar[type[StrictSettings]] = StrictSettings
    """The client's settings. They are flags and configuration-file keys of their own name
    (``--max_retries``), saved under ``model_options.NAME``; read them in :meth:`from_config`
    with ``config.settings_of(cls)``. None by default."""
    key_variables: ClassVar[tuple[str, ...]] = ()
    """The environment variables the client reads its key from. An executor that runs sessions in
    other processes or on other nodes hands them over (never saving or logging them)."""
    offline: ClassVar[bool] = False
    """Answers without a model behind it (scripted placeholders): fine for a dry run, not data."""
    takes_params: ClassVar[bool] = False
    """Whether :meth:`complete` takes ``params`` (sampling fields); a client that cannot says so,
    and a caller with fields to pass refuses them rather than drop them."""

    @classmethod
    @abstractmethod
    def from_config(cls, config: RunConfig) -> ModelClient:
        """Build the client; raise :class:`ModelConfigError` for a configuration that cannot work."""

    @abstractmethod
    async def complete(
        self, messages: list[Message], tools: list[dict[str, Any]], params: Mapping[str, Any] | None = None
    ) -> AssistantMessage:
        """One model call. Raises :class:`ModelError` once retries are exhausted.

        ``params`` are request fields for this call alone (``max_tokens``, ``temperature``,
        ``top_p``, ``stop``...), over the run's own; clients whose :attr:`takes_params` is false
        ignore them.
        """

    async def check(self) -> None:
        """Called once before the first session (before any sandbox starts).

        A client that talks to an endpoint checks here what would make every session fail
        (a malformed URL or key, an unreachable host, refused credentials, an unknown model) and
        raises :class:`ModelError` with ``stops_run`` set and one message saying what to change.
        The default does nothing: an offline client has nothing to check.
        """

    def statistics(self) -> dict[str, Any]:
        """Counters for ``statistics.json``; empty by default.

        A client that calls a paid endpoint reports at least ``requests`` (model answers
        received), ``prompt_tokens``, ``completion_tokens`` and ``cost`` (0.0 when unknown),
        summed over every answer as it arrives, whatever becomes of its session afterwards.
        """
        return {}

    def spent(self) -> float:
        """What the answers received so far have cost (the run's ``--max_cost`` is held to it).

        Counted as each answer arrives, so sessions that later fail or time out are paid for too.
        0.0 for a client that costs nothing or cannot know.
        """
        return 0.0

    def listen(self, listener: Callable[[], None] | None) -> None:
        """Have ``listener`` called each time the client has counted a model answer (see
        :meth:`answered`): the runner saves what was spent then, so a killed run loses none of it."""
        self._answer_listener = listener

    def answered(self) -> None:
        """Subclasses call this once an answer received is counted in :meth:`statistics` and
        :meth:`spent`. A client that never does has its spend saved as its sessions end instead."""
        listener = getattr(self, "_answer_listener", None)
        if listener is not None:
            listener()

    async def aclose(self) -> None:
        """Release connections at the end of the run."""


_LEADING_TAG = re.compile(r"\s*<(think|thinking|REASONING_SCRATCHPAD)>", re.IGNORECASE)
"""The opening tag of the reasoning block that tag dialects put first in the content."""


def split_reasoning(content: str) -> tuple[str, str | None]:
    """Move a leading ``<think>``/``<thinking>``/``<REASONING_SCRATCHPAD>`` block out of ``content``.

    Returns the content after the block and the block's text (None when the content does not
    open with one). Only the start of the content is read, where the dialects put the block: the
    same tags anywhere else are text the model wrote (an answer about tags, a quoted template)
    and stay in the content. An unclosed block runs to the end of the content, as a model cut
    off by the length limit leaves it.
    """
    opening = _LEADING_TAG.match(content)
    if opening is None:
        return content, None
    closing = re.compile(f"</{opening.group(1)}>", re.IGNORECASE).search(content, opening.end())
    if closing is None:
        return "", content[opening.end() :].strip() or None
    return content[closing.end() :].strip(), content[opening.end() : closing.start()].strip() or None


def sent_reasoning(message: dict[str, Any]) -> bool:
    """Whether the endpoint sent reasoning in a field of its own (even encrypted): it has then
    parsed the model's output itself, and the content is the answer as written."""
    return any(message.get(key) for key in ("reasoning", "reasoning_content", "reasoning_details"))


def reasoning_from_message(message: dict[str, Any]) -> str | None:
    """Read reasoning from every structured dialect endpoints use.

    ``reasoning`` (OpenRouter), ``reasoning_content`` (DeepSeek, vLLM, SGLang) and
    ``reasoning_details`` (OpenRouter's structured blocks: text, summary, or encrypted).
    """
    for key in ("reasoning", "reasoning_content"):
        value = message.get(key)
        if isinstance(value, str) and value.strip():
            return value
    details = message.get("reasoning_details")
    if isinstance(details, list):
        texts = []
        for detail in details:
            if isinstance(detail, dict):
                text = detail.get("text") or detail.get("summary")
                if isinstance(text, str) and text.strip():
                    texts.append(text)
        if texts:
            return "\n\n".join(texts)
    return None


def parse_assistant_message(
    message: dict[str, Any], usage: dict[str, Any] | None = None, finish_reason: str | None = None
) -> AssistantMessage:
    """Read one wire-format assistant message, whatever the endpoint's dialect.

    Reasoning from the endpoint's own fields, or else from a tag block opening the content
    (:func:`split_reasoning`); tool calls without an id get a stable one, so the history sent back
    is always well-formed.
    """
    content = message.get("content") or ""
    if isinstance(content, list):  # content parts: their text, in order
        content = "".join(str(part.get("text") or "") for part in content if isinstance(part, dict))
    if sent_reasoning(message):
        reasoning = reasoning_from_message(message)
    else:
        content, reasoning = split_reasoning(content)
    calls = []
    for position, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") or {}
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments if arguments is not None else {})
        calls.append(
            ToolCall(call.get("id") or f"call_{position}", str(function.get("name") or ""), arguments)
        )
    usage = usage or {}
    cost = usage.get("cost")
    return AssistantMessage(
        content=content,
        reasoning=reasoning,
        tool_calls=calls,
        usage=Usage(
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            cost=float(cost) if isinstance(cost, int | float) else None,
        ),
        finish_reason=finish_reason,
    )
