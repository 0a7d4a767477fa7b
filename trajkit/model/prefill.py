"""Few-shot messages sent before every session's prompt (``--prefill_messages_file``), checked once.

They are OpenAI chat messages, as a client would send them (the shape of
:class:`trajkit.serve.protocol.ChatMessage`): system, user and assistant turns, and worked
tool-call examples, an assistant turn's ``tool_calls`` each answered by a ``tool`` message naming
its ``tool_call_id`` before the conversation goes on. Anything an endpoint would refuse is refused
here, naming the entry, before any session is paid for.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

ENTRY_HINT = (
    "each entry is an OpenAI chat message: {role: system|user|assistant, content}, an assistant "
    "entry may have tool_calls [{id, type: function, function: {name, arguments: JSON string}}], "
    "each answered by {role: tool, tool_call_id, content}"
)


def check_prefill(messages: Any) -> list[dict[str, Any]]:
    """The messages as given, once each is a valid chat message and every tool call is answered;
    else :class:`ValueError` naming the first wrong entry (1-based)."""
    from trajkit.serve.protocol import ChatMessage

    if not isinstance(messages, list):
        raise ValueError(f"expected a JSON list of messages, got {type(messages).__name__}; {ENTRY_HINT}")
    unanswered: list[str] = []
    seen_ids: set[str] = set()
    for number, entry in enumerate(messages, start=1):
        if not isinstance(entry, dict):
            raise ValueError(f"entry {number}: expected a message object, got {type(entry).__name__}")
        where = f"entry {number} (role {entry.get('role')!r})" if "role" in entry else f"entry {number}"
        try:
            message = ChatMessage.model_validate(entry)
        except ValidationError as exc:
            error = exc.errors()[0]
            field = ".".join(str(part) for part in error["loc"]) or "message"
            raise ValueError(f"{where}: {field}: {error['msg']}; {ENTRY_HINT}") from None
        problem = _problem(message, unanswered, seen_ids)
        if problem:
            raise ValueError(f"{where}: {problem}")
    if unanswered:
        raise ValueError(f"the tool calls {', '.join(unanswered)} are never answered by a tool entry")
    return messages


def _problem(message: Any, unanswered: list[str], seen_ids: set[str]) -> str | None:
    """What is wrong with one message where it stands; updates the calls still to be answered."""
    if message.role == "tool":
        if not message.tool_call_id:
            return "a tool entry needs the tool_call_id of the call it answers"
        if message.tool_call_id not in unanswered:
            return (
                f"tool_call_id {message.tool_call_id!r} answers no open call of the assistant entry before it"
            )
        unanswered.remove(message.tool_call_id)
        return None if message.content is not None else "a tool entry needs content (the call's result)"
    if unanswered:
        return f"the tool calls {', '.join(unanswered)} must be answered by tool entries first"
    if message.role != "assistant":
        if message.tool_calls or message.tool_call_id:
            return "only assistant entries make tool calls and only tool entries answer them"
        return None if message.content is not None else "content is missing"
    if message.content is None and not message.tool_calls:
        return "an assistant entry needs content or tool_calls"
    for call in message.tool_calls or []:
        if call.id in seen_ids:
            return f"tool call id {call.id!r} is used twice"
        seen_ids.add(call.id)
        unanswered.append(call.id)
    return None
