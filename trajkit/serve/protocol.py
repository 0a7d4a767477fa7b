"""The OpenAI chat completions protocol as ``trajkit serve`` speaks it: requests validated with
pydantic at the boundary, responses, stream chunks and error envelopes built as OpenAI shapes them.

Every request field is honoured or refused with a 400 that names it; fields the protocol does not
know are ignored, as OpenAI-compatible servers do.
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from trajkit.model import Message

INLINE_MARK = re.compile(r'<details type="trajkit\.tool"[^>]*>.*?</details>\n?', re.DOTALL)
"""Inline tool progress (``--tool_progress inline``): written into content so that chat UIs show it,
and taken out again of any history a client sends back, so the model never sees (nor imitates) it."""

FORWARDED = ("temperature", "top_p", "stop", "seed", "presence_penalty", "frequency_penalty")
"""Sampling fields passed to the model on every call of the session."""


class ProtocolError(Exception):
    """A request the server refuses, as an OpenAI error envelope."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        kind: str = "",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers
        self.param = param
        self.code = code
        self.kind = kind or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict[str, Any]:
        return error_body(str(self), self.kind, param=self.param, code=self.code)


def error_body(
    message: str, kind: str, *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class CalledFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str
    arguments: str


class ToolCallIn(BaseModel):
    """A tool call of an earlier assistant turn, as a client sends the conversation back."""

    model_config = ConfigDict(extra="ignore")

    id: str
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def text(self) -> str:
        """The content as text: text parts joined; any other part (images, audio) is refused."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        texts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ProtocolError(
                    400,
                    f"content parts of type {part.get('type')!r} are not supported; send text",
                    param="messages",
                )
            texts.append(part["text"])
        return "".join(texts)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


class ToolSchema(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function"]
    function: dict[str, Any]

    @field_validator("function")
    @classmethod
    def _named(cls, function: dict[str, Any]) -> dict[str, Any]:
        name = function.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
            raise ValueError("each tool needs a function name of letters, digits, '_' or '-'")
        return function


class ChatRequest(BaseModel):
    """The fields of a chat completion request that trajkit reads; others are ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    n: int = 1
    tools: list[ToolSchema] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    logprobs: bool | None = None
    metadata: dict[str, Any] | None = None

    def model_params(self) -> dict[str, Any]:
        """What goes to the model on each of the session's calls."""
        params = {name: getattr(self, name) for name in FORWARDED if getattr(self, name) is not None}
        limit = self.max_completion_tokens or self.max_tokens
        if limit is not None:
            params["max_tokens"] = limit
        return params

    def housekeeping_task(self) -> str | None:
        """Open WebUI marks its title, tag and follow-up requests with ``metadata.task``."""
        task = (self.metadata or {}).get("task")
        return task if isinstance(task, str) and task else None


def parse_request(body: Any, served_model: str) -> ChatRequest:
    if not isinstance(body, dict):
        raise ProtocolError(400, "the request body must be a JSON object")
    try:
        request = ChatRequest.model_validate(body)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        raise ProtocolError(400, f"{where}: {error['msg']}", param=where) from None
    if request.model != served_model:
        raise ProtocolError(
            404, f"the model `{request.model}` is not served here (this server serves `{served_model}`)",
            param="model", code="model_not_found",
        )  # fmt: skip
    _refuse_unsupported(request)
    return request


def _refuse_unsupported(request: ChatRequest) -> None:
    """What the agent cannot honour is refused, never silently dropped."""
    if request.n != 1:
        raise ProtocolError(400, "n must be 1: the agent gives one answer per request", param="n")
    if request.logprobs:
        raise ProtocolError(400, "logprobs are not available from the agent", param="logprobs")
    if request.response_format and request.response_format.get("type") not in (None, "text"):
        raise ProtocolError(400, "response_format other than text is not supported", param="response_format")
    if request.tool_choice not in (None, "auto"):
        raise ProtocolError(
            400, "tool_choice: only 'auto' is supported (the agent chooses its tools)", param="tool_choice"
        )
    if isinstance(request.stop, list) and len(request.stop) > 4:
        raise ProtocolError(400, "stop: at most 4 sequences", param="stop")
    if request.messages[-1].role not in ("user", "tool"):
        raise ProtocolError(
            400, "the last message must come from the user or be a tool result", param="messages"
        )


def split_messages(request: ChatRequest) -> tuple[str | None, list[Message]]:
    """The system prompt (system and developer messages joined) and the conversation in wire format,
    with inline tool progress taken out of assistant turns."""
    system = [m.text() for m in request.messages if m.role in ("system", "developer")]
    conversation: list[Message] = []
    for message in request.messages:
        if message.role in ("system", "developer"):
            continue
        wire: Message = {"role": message.role, "content": message.text()}
        if message.role == "assistant":
            wire["content"] = INLINE_MARK.sub("", wire["content"]) or None
            if message.tool_calls:
                wire["tool_calls"] = [call.model_dump() for call in message.tool_calls]
            elif wire["content"] is None:
                wire["content"] = ""
        if message.role == "tool":
            if not message.tool_call_id:
                raise ProtocolError(400, "a tool message needs the tool_call_id it answers", param="messages")
            wire["tool_call_id"] = message.tool_call_id
        conversation.append(wire)
    return ("\n\n".join(p for p in system if p) or None), conversation


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex[:24]}"


def usage_body(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_body(
    ident: str, model: str, message: Message, finish_reason: str, usage: dict[str, int]
) -> dict[str, Any]:
    return {
        "id": ident,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}],
        "usage": usage,
    }


def chunk_body(
    ident: str, model: str, delta: dict[str, Any] | None, finish_reason: str | None = None
) -> dict[str, Any]:
    """A ``chat.completion.chunk``; ``delta`` None gives the usage chunk's empty ``choices``."""
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish_reason}]
    return {
        "id": ident,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
    }
