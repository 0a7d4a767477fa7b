"""A model client answered by its caller: the agent loop's model calls handed out one at a time.

The environment's step interface runs the ordinary agent loop with this client; each model call
waits until the trainer answers it (:meth:`StepClient.answer`), so the loop, its tool calls and
its limits stay those of every other session.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from trajkit.model import AssistantMessage, Message, ModelClient, Usage, parse_assistant_message

if TYPE_CHECKING:
    from trajkit.config.run_config import RunConfig


class StepClient(ModelClient):
    """Hands each request out (:meth:`request`) and returns the answer given to it (:meth:`answer`)."""

    name = "step"
    takes_params = True

    def __init__(self) -> None:
        self.requests: asyncio.Queue[tuple[list[Message], list[dict[str, Any]]]] = asyncio.Queue()
        self.answers: asyncio.Queue[AssistantMessage] = asyncio.Queue()
        self.usage = Usage()

    @classmethod
    def from_config(cls, config: RunConfig) -> StepClient:
        return cls()

    async def complete(
        self, messages: list[Message], tools: list[dict[str, Any]], params: Mapping[str, Any] | None = None
    ) -> AssistantMessage:
        await self.requests.put((list(messages), list(tools)))
        answer = await self.answers.get()
        self.usage.add(answer.usage)
        return answer

    async def request(self) -> tuple[list[Message], list[dict[str, Any]]]:
        """The next model call's messages and tool schemas, once the loop makes it."""
        return await self.requests.get()

    def answer(self, message: AssistantMessage | Mapping[str, Any]) -> None:
        """Answer the pending call with an :class:`AssistantMessage` or a wire-format message
        (``{"role": "assistant", "content": ..., "tool_calls": [...]}``)."""
        if not isinstance(message, AssistantMessage):
            finish = message.get("finish_reason")
            message = parse_assistant_message(dict(message), finish_reason=finish)
        self.answers.put_nowait(message)
