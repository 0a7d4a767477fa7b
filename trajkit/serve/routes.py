"""The endpoints: POST /v1/chat/completions, GET /v1/models, GET /health."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import orjson
from aiohttp import web

from trajkit.agent import ConversationResult, ToolStatus
from trajkit.model import Message, ModelContextOverflow, ModelError, ToolCall, Usage
from trajkit.sandbox import SandboxError
from trajkit.serve.protocol import (
    ChatRequest,
    ProtocolError,
    completion_body,
    completion_id,
    parse_request,
    split_messages,
    usage_body,
)
from trajkit.serve.security import json_response
from trajkit.serve.service import ServedAgent, tool_label
from trajkit.serve.settings import ServeSettings
from trajkit.serve.stream import EventStream, inline_progress, next_event

log = logging.getLogger("trajkit")

AGENT: web.AppKey[ServedAgent] = web.AppKey("agent", ServedAgent)
SETTINGS: web.AppKey[ServeSettings] = web.AppKey("settings", ServeSettings)
RETRY_AFTER = "2"


class Gate:
    """Chat completions in flight, against ``--max_concurrent``."""

    def __init__(self) -> None:
        self.in_flight = 0


GATE: web.AppKey[Gate] = web.AppKey("gate", Gate)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/health", health)
    app.router.add_get("/v1/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", completions)


async def health(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


async def models(request: web.Request) -> web.Response:
    model = request.app[AGENT].config.model
    data = [{"id": model, "object": "model", "created": 0, "owned_by": "trajkit"}]
    return json_response({"object": "list", "data": data})


async def completions(request: web.Request) -> web.StreamResponse:
    agent, settings = request.app[AGENT], request.app[SETTINGS]
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        raise ProtocolError(400, "the request body is not valid JSON") from None
    chat = parse_request(body, agent.config.model)
    agent.check_request(chat)
    gate = request.app[GATE]
    if gate.in_flight >= settings.max_concurrent:
        raise ProtocolError(
            429, f"the server is at its limit of {settings.max_concurrent} requests at once; retry later",
            kind="rate_limit_error", code="rate_limit_exceeded", headers={"Retry-After": RETRY_AFTER},
        )  # fmt: skip
    gate.in_flight += 1
    try:
        if settings.housekeeping == "on" and chat.housekeeping_task():
            return await _housekeeping(request, agent, chat)
        system, conversation = split_messages(chat)
        if chat.stream:
            return await _stream(request, agent, settings, chat, system, conversation)
        return await _answer(agent, settings, chat, system, conversation)
    finally:
        gate.in_flight -= 1


def failure(agent: ServedAgent, exc: Exception) -> ProtocolError:
    """What the client is told when the session fails: never a secret, never a traceback."""
    text = agent.scrubber.text(str(exc))[:1000]
    if isinstance(exc, TimeoutError):
        limit = agent.settings.request_timeout
        return ProtocolError(
            504, f"the agent did not finish within {limit:g}s", kind="timeout", code="timeout"
        )
    if isinstance(exc, ModelContextOverflow):  # OpenAI's own answer: the client must not retry it
        return ProtocolError(400, text, param="messages", code="context_length_exceeded")
    if isinstance(exc, ModelError):
        return ProtocolError(502, f"the model failed: {text}", kind="upstream_error", code=exc.error_class)
    if isinstance(exc, SandboxError):
        return ProtocolError(503, f"the sandbox failed: {text}", kind="server_error", code=exc.error_class)
    return ProtocolError(500, f"internal error: {type(exc).__name__}", kind="server_error")


def finish_reason(result: ConversationResult) -> str:
    if result.client_tool_calls:
        return "tool_calls"
    return "stop" if result.completed else "length"  # cut off, or out of turns without an answer


def wire_calls(calls: list[ToolCall]) -> list[dict[str, Any]]:
    return [
        {"index": i, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for i, c in enumerate(calls)
    ]


def _usage(usage: Usage) -> dict[str, int]:
    return usage_body(usage.prompt_tokens, usage.completion_tokens)


async def _answer(
    agent: ServedAgent,
    settings: ServeSettings,
    chat: ChatRequest,
    system: str | None,
    conversation: list[Message],
) -> web.Response:
    try:
        async with asyncio.timeout(settings.request_timeout):
            served = await agent.run(chat, system, conversation)
    except (TimeoutError, ModelError, SandboxError) as exc:
        raise failure(agent, exc) from None
    result = served.result
    message: Message = {"role": "assistant", "content": result.final_response or ""}
    if served.reasoning:
        message["reasoning_content"] = "\n\n".join(served.reasoning)
    if result.client_tool_calls:
        message["tool_calls"] = [
            {k: v for k, v in c.items() if k != "index"} for c in wire_calls(result.client_tool_calls)
        ]
        message["content"] = result.final_response or None
    body = completion_body(completion_id(), chat.model, message, finish_reason(result), _usage(result.usage))
    return json_response(body)


async def _stream(
    request: web.Request,
    agent: ServedAgent,
    settings: ServeSettings,
    chat: ChatRequest,
    system: str | None,
    conversation: list[Message],
) -> web.StreamResponse:
    queue: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()

    def on_tool(call: ToolCall, status: ToolStatus) -> None:
        queue.put_nowait(("tool", call, status))

    progress = on_tool if settings.tool_progress != "off" else None
    stream = await EventStream.open(request, completion_id(), chat.model)
    reasoned = False  # whether a turn's reasoning has gone out: the next one starts a paragraph
    await stream.delta({"role": "assistant", "content": ""})
    session = asyncio.create_task(
        agent.run(chat, system, conversation, lambda *texts: queue.put_nowait(("reply", *texts)), progress)
    )
    session.add_done_callback(lambda _: queue.put_nowait(("end",)))
    try:
        async with asyncio.timeout(settings.request_timeout):
            while (event := await next_event(queue, stream, settings.keepalive))[0] != "end":
                reasoned = await _forward(stream, settings, event, reasoned)
            served = await session
    except ConnectionError:
        return stream.response  # the client went away mid-write; the session is cancelled below
    except Exception as exc:  # the headers are gone: the error travels as an event
        if not isinstance(exc, TimeoutError | ModelError | SandboxError):
            log.exception("internal error in a streamed session")
        await stream.error(failure(agent, exc).body())
        return stream.response
    finally:
        if not session.done():  # the client went away, or the time limit: the sandbox closes
            session.cancel()
        with contextlib.suppress(BaseException):
            await session
    result = served.result
    if result.client_tool_calls:
        await stream.delta({"tool_calls": wire_calls(result.client_tool_calls)})
    await stream.delta({}, finish_reason(result))
    if chat.stream_options is not None and chat.stream_options.include_usage:
        await stream.usage(_usage(result.usage))
    await stream.done()
    return stream.response


async def _forward(
    stream: EventStream, settings: ServeSettings, event: tuple[Any, ...], reasoned: bool
) -> bool:
    """Send one session event; returns whether any reasoning has been sent so far. Each turn's
    reasoning after the first opens with a blank line, as the plain answer joins them."""
    if event[0] == "tool":
        call, status = event[1], event[2]
        label = tool_label(call)
        if settings.tool_progress == "inline":
            await stream.delta({"content": inline_progress(call, status, label)})
        else:
            await stream.tool(call, status, label)
        return reasoned
    reasoning, answer = event[1], event[2]
    if reasoning:
        await stream.delta({"reasoning_content": f"\n\n{reasoning}" if reasoned else reasoning})
    if answer:
        await stream.delta({"content": answer})
    return reasoned or bool(reasoning)


async def _housekeeping(request: web.Request, agent: ServedAgent, chat: ChatRequest) -> web.StreamResponse:
    """A chat UI's title, tags or follow-ups: one plain model call, no tools, no sandbox, not recorded."""
    system, conversation = split_messages(chat)
    messages = ([{"role": "system", "content": system}] if system else []) + conversation
    try:
        async with asyncio.timeout(agent.settings.request_timeout):
            reply = await agent.housekeeping(chat, messages)
    except (TimeoutError, ModelError) as exc:
        raise failure(agent, exc) from None
    finish = reply.finish_reason if reply.finish_reason in ("stop", "length") else "stop"
    if not chat.stream:
        message = {"role": "assistant", "content": reply.content}
        return json_response(
            completion_body(completion_id(), chat.model, message, finish, _usage(reply.usage))
        )
    stream = await EventStream.open(request, completion_id(), chat.model)
    await stream.delta({"role": "assistant", "content": ""})
    await stream.delta({"content": reply.content})
    await stream.delta({}, finish)
    if chat.stream_options is not None and chat.stream_options.include_usage:
        await stream.usage(_usage(reply.usage))
    await stream.done()
    return stream.response
