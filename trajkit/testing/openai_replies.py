"""What the OpenAI-compatible test server answers: faults to inject, policies, response bodies.

Kept apart from the HTTP serving in :mod:`trajkit.testing.openai_server`, which re-exports the
public names, so each module does one thing.
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson

Body = dict[str, Any]
Policy = Callable[[Body], Mapping[str, Any] | Awaitable[Mapping[str, Any]]]
"""Gets the parsed request body, returns the assistant message (plus optional ``_`` control keys)."""
Latency = float | Callable[[Body], float]
"""Seconds to wait before answering, fixed or computed from the request body."""

DROPPED = 0
"""RecordedRequest.status of a request whose connection was dropped unanswered."""


@dataclasses.dataclass(frozen=True)
class Fault:
    """A failure to inject instead of the normal answer.

    ``hang`` delays first (to exceed client timeouts). Then: ``close`` or ``status == 0`` drops
    the connection without an answer; a ``status`` >= 400 answers an OpenAI-style error with
    ``message`` and ``headers`` (e.g. ``Retry-After``); any other status answers normally, late.
    """

    status: int = 500
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    message: str = "injected fault"
    hang: float = 0.0
    close: bool = False


FaultInjector = Callable[[int, Body], Fault | None]
"""Gets the request number (from 0, arrival order) and body; returns the fault to inject, if any."""


@dataclasses.dataclass(slots=True)
class RecordedRequest:
    """One completion request as the server saw it; times are ``time.monotonic()`` seconds.

    ``headers`` are the request headers (lower-case names). ``status`` and ``time_answered`` are
    None while the request is in flight; ``status`` is 0 if the connection was dropped unanswered.
    """

    number: int
    time_received: float
    time_answered: float | None
    body: Body
    status: int | None
    headers: dict[str, str]


def fault_every(n: int, fault: Fault) -> FaultInjector:
    """Inject ``fault`` into every ``n``-th request (numbers n-1, 2n-1, ...), for exact retry counts."""
    if n < 1:
        raise ValueError("n must be >= 1")

    def inject(number: int, body: Body) -> Fault | None:
        return fault if (number + 1) % n == 0 else None

    return inject


def fault_fraction(fraction: float, fault: Fault, seed: int = 0) -> FaultInjector:
    """Inject ``fault`` into about ``fraction`` of requests, chosen by request number so runs repeat."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError("fraction must be between 0 and 1")

    def inject(number: int, body: Body) -> Fault | None:
        return fault if random.Random(seed * 1_000_003 + number).random() < fraction else None

    return inject


def echo_policy(body: Body) -> dict[str, Any]:
    """Answer every request with the text "ok": the cheapest possible model, for load tests."""
    return {"content": "ok"}


def tool_script_policy(
    calls: int = 3,
    tool: str = "terminal",
    arguments: str | Mapping[str, Any] = '{"command": "true"}',
    final: str = "done",
) -> Policy:
    """Build a policy that asks for ``calls`` tool calls, one per turn, then answers ``final``.

    The turn is found by counting the assistant messages already in the request, so the policy
    is stateless and any number of conversations can run through one server at once.
    """
    encoded = arguments if isinstance(arguments, str) else json.dumps(arguments)

    def policy(body: Body) -> dict[str, Any]:
        turn = sum(
            1 for m in body.get("messages") or () if isinstance(m, dict) and m.get("role") == "assistant"
        )
        if turn >= calls:
            return {"content": final}
        call = {
            "id": f"call_{turn}_{uuid.uuid4().hex[:12]}",
            "type": "function",
            "function": {"name": tool, "arguments": encoded},
        }
        return {"content": None, "tool_calls": [call]}

    return policy


def dumps(value: object) -> bytes:
    """orjson (a trajkit dependency): response encoding dominates the server's CPU under load."""
    return orjson.dumps(value)


def loads(data: bytes) -> Any:
    """Parse JSON; every failure is a ValueError (orjson's error is one) so callers answer 400."""
    return orjson.loads(data)


@dataclasses.dataclass(slots=True)
class Reply:
    status: int
    body: bytes
    headers: dict[str, str] = dataclasses.field(default_factory=dict)


def error_response(
    status: int,
    message: str,
    *,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> Reply:
    """Build the ``{"error": {...}}`` body the OpenAI SDK turns into typed exceptions."""
    error = {"message": message, "type": _error_type(status), "param": None, "code": code}
    return Reply(status, dumps({"error": error}), dict(headers or {}))


def _error_type(status: int) -> str:
    """The ``type`` the real API uses for a status class."""
    if status >= 500:
        return "server_error"
    return "requests" if status == 429 else "invalid_request_error"


def _estimate_usage(request_size: int, message: Mapping[str, Any]) -> dict[str, int]:
    """Rough token counts (4 bytes a token) so clients that track usage see plausible numbers."""
    prompt = max(1, request_size // 4)
    completion = max(1, len(dumps({k: v for k, v in message.items() if k != "role"})) // 4)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def completion_response(reply: Mapping[str, Any], body: Body, request_size: int) -> Reply:
    """Wrap a policy's assistant message into a ``chat.completion``, or the error it asks for."""
    headers = {str(k): str(v) for k, v in (reply.get("_headers") or {}).items()}
    status = int(reply.get("_status") or 200)
    error = reply.get("_error")
    if error is not None or status >= 400:
        status = status if status >= 400 else 500
        response = error_response(status, str(error or f"policy answered {status}"), headers=headers)
        if isinstance(error, Mapping):  # a full error object: keep the default fields it leaves out
            default = {"message": "policy error", "type": _error_type(status), "param": None, "code": None}
            response.body = dumps({"error": {**default, **error}})
        return response
    message: dict[str, Any] = {"role": "assistant", "content": None}
    message.update((k, v) for k, v in reply.items() if not k.startswith("_"))
    finish_reason = reply.get("_finish_reason") or ("tool_calls" if message.get("tool_calls") else "stop")
    payload = {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "unknown"),
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}],
        "usage": reply.get("_usage") or _estimate_usage(request_size, message),
    }
    return Reply(status, dumps(payload), headers)
