"""Server-sent events for a streamed chat completion, in the order OpenAI's clients expect.

A role chunk; reasoning deltas (``reasoning_content``) as each model turn arrives; the answer's
content; for the client's own tools a ``tool_calls`` delta; a finish chunk with the real
``finish_reason``; with ``stream_options.include_usage`` a usage chunk whose ``choices`` is empty;
``data: [DONE]``. Between them, tool progress as ``event: trajkit.tool`` (or, inline, as marked
content) and a keepalive comment whenever the stream has been silent for a while.

A tool event's data is itself a chunk whose one choice has an empty delta (plus ``call_id``,
``tool``, ``status`` and ``label``): a parser that skips named events never sees it, and one that
does not (the Python SDK yields every event's data) gets a chunk with nothing to show, like the
finish chunk, so even ``chunk.choices[0].delta.content`` in a client's loop keeps working.
"""

from __future__ import annotations

import asyncio
import html
from typing import Any

import orjson
from aiohttp import web

from trajkit.agent import ToolStatus
from trajkit.model import ToolCall
from trajkit.serve.protocol import chunk_body

TOOL_EVENT = "trajkit.tool"
HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # proxies (nginx) must pass each event on as it comes
}


class EventStream:
    """One streamed completion's SSE writer."""

    def __init__(self, response: web.StreamResponse, ident: str, model: str) -> None:
        self.response = response
        self.ident = ident
        self.model = model

    @classmethod
    async def open(cls, request: web.Request, ident: str, model: str) -> EventStream:
        response = web.StreamResponse(headers=HEADERS)
        response.enable_chunked_encoding()
        await response.prepare(request)
        return cls(response, ident, model)

    async def _write(self, text: bytes) -> None:
        await self.response.write(text)

    async def data(self, body: dict[str, Any]) -> None:
        await self._write(b"data: " + orjson.dumps(body) + b"\n\n")

    async def delta(self, delta: dict[str, Any], finish_reason: str | None = None) -> None:
        await self.data(chunk_body(self.ident, self.model, delta, finish_reason))

    async def usage(self, usage: dict[str, int]) -> None:
        await self.data({**chunk_body(self.ident, self.model, None), "usage": usage})

    async def tool(self, call: ToolCall, status: ToolStatus, label: str) -> None:
        body = {**chunk_body(self.ident, self.model, {}), "call_id": call.id, "tool": call.name}
        body.update(status=status, label=label)
        await self._write(f"event: {TOOL_EVENT}\n".encode() + b"data: " + orjson.dumps(body) + b"\n\n")

    async def keepalive(self) -> None:
        await self._write(b": keepalive\n\n")

    async def error(self, body: dict[str, Any]) -> None:
        """An error after the headers have gone: OpenAI's SDKs raise it from the data."""
        await self.data(body)

    async def done(self) -> None:
        await self._write(b"data: [DONE]\n\n")
        await self.response.write_eof()


def inline_progress(call: ToolCall, status: ToolStatus, label: str) -> str:
    """Tool progress as content, marked so the server takes it out of history sent back
    (:data:`trajkit.serve.protocol.INLINE_MARK`); chat UIs render it as a collapsed line."""
    return (
        f'<details type="trajkit.tool" id="{html.escape(call.id)}" status="{status}">'
        f"<summary>{html.escape(label)} ({status})</summary></details>\n"
    )


async def next_event(
    queue: asyncio.Queue[tuple[Any, ...]], stream: EventStream, keepalive: float
) -> tuple[Any, ...]:
    """The session's next event; a keepalive comment goes out for each silent ``keepalive`` seconds."""
    while True:
        try:
            return await asyncio.wait_for(queue.get(), keepalive)
        except TimeoutError:
            await stream.keepalive()
