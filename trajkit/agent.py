"""The agent loop: model and tools taking turns against one sandbox, until an answer or max_turns.

The history sent to the model is always well-formed: every tool call is answered by its id, a
call to a tool that was not offered or with unparseable arguments is answered with an error
message (and counted as a failure of that tool, never a success).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from trajkit.model import AssistantMessage, Message, ModelClient, ToolCall, Usage
from trajkit.sandbox import Sandbox, SandboxError, cap_text
from trajkit.tools import Tool, ToolContext, ToolError, ToolOutcome, ToolSession


@dataclass
class ToolStat:
    count: int = 0
    success: int = 0
    failure: int = 0


@dataclass
class ConversationResult:
    final_response: str | None
    messages: list[Message]
    """The history as it is saved: the system prompt the model saw (without the ephemeral part),
    the prompt, then every assistant and tool message. Prefill messages are not in it."""
    api_calls: int
    completed: bool
    """The model gave a final answer within max_turns."""
    usage: Usage
    tool_stats: dict[str, ToolStat] = field(default_factory=dict)
    invalid_tool_calls: int = 0
    """Calls to names that are no tool of the run at all (so have no column in tool_stats)."""
    finish_reason: str | None = None
    client_tool_calls: list[ToolCall] = field(default_factory=list)
    """Calls to :attr:`Session.client_tools` that ended the conversation, for the caller to run."""


ToolStatus = Literal["running", "completed", "failed"]
"""``running`` when a tool call starts, then ``completed`` or ``failed``."""


@dataclass
class Session:
    """Everything one conversation needs besides the prompt."""

    client: ModelClient
    sandbox: Sandbox
    tools: Mapping[str, Tool]
    """The tools offered to this prompt."""
    known_tools: frozenset[str] = frozenset()
    """Every tool of the run, offered or not: calls to these are counted under their own name."""
    system_prompt: str | None = None
    ephemeral_system_prompt: str | None = None
    prefill_messages: Sequence[Message] = ()
    max_turns: int = 10
    tool_timeout: float = 120.0
    tool_output_cap: int = 16 * 1024
    client_tools: Sequence[dict[str, Any]] = ()
    """Schemas of tools the caller runs itself (``trajkit serve``: the tools an API client sends).
    They are offered beside :attr:`tools`; a turn that calls one ends the conversation with those
    calls in :attr:`ConversationResult.client_tool_calls` (calls to the session's own tools in that
    turn are dropped unrun, so the history the caller continues from stays well-formed)."""
    model_params: Mapping[str, Any] | None = None
    """Request fields for every model call of this session (``trajkit serve``: the API request's
    ``max_tokens``, ``temperature``...), over the run's own."""
    on_reply: Callable[[AssistantMessage], None] | None = None
    """Called with every model reply as it arrives (``trajkit serve`` streams from it)."""
    on_tool: Callable[[ToolCall, ToolStatus], None] | None = None
    """Called when a tool call starts (``running``) and when it ends (``completed``/``failed``)."""
    tool_session: ToolSession = field(default_factory=ToolSession)
    """What the tools keep between calls and share with the run; its owner closes it."""


def _wire(message: AssistantMessage) -> Message:
    """The assistant message as sent back to the model (no trajkit-only fields)."""
    wire: Message = {"role": "assistant", "content": message.content or (None if message.tool_calls else "")}
    if message.tool_calls:
        wire["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
    return wire


async def run_conversation(session: Session, prompt: str | Sequence[Message]) -> ConversationResult:
    """Run the agent on ``prompt``: a user message, or a whole conversation so far (user, assistant
    and tool messages, no system message: that is the session's) whose last turn it continues."""
    sent_system = "\n\n".join(p for p in (session.system_prompt, session.ephemeral_system_prompt) if p)
    head: list[Message] = [{"role": "system", "content": sent_system}] if sent_system else []
    head += list(session.prefill_messages)
    saved: list[Message] = (
        [{"role": "system", "content": session.system_prompt}] if session.system_prompt else []
    )
    opening: list[Message] = (
        [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    )
    history: list[Message] = list(opening)  # what is both sent and saved
    saved_history: list[Message] = list(opening)
    schemas = [tool.schema() for tool in session.tools.values()] + list(session.client_tools)
    client_names = {t["function"]["name"] for t in session.client_tools}
    call_ids = {
        c["id"] for m in opening for c in m.get("tool_calls") or () if isinstance(c, dict) and "id" in c
    }
    result = ConversationResult(
        None, saved, 0, False, Usage(), {name: ToolStat() for name in session.known_tools}
    )

    while result.api_calls < session.max_turns:
        reply = await _ask(session, head + history, schemas)
        result.api_calls += 1
        result.usage.add(reply.usage)
        result.finish_reason = reply.finish_reason
        _dedupe_call_ids(reply.tool_calls, result.api_calls, call_ids)
        handed = [call for call in reply.tool_calls if call.name in client_names]
        if handed:
            reply.tool_calls = handed
        if session.on_reply is not None:
            session.on_reply(reply)
        history.append(_wire(reply))
        saved_history.append({**_wire(reply), "reasoning": reply.reasoning})
        if not reply.tool_calls:
            result.final_response = reply.content
            result.completed = reply.finish_reason != "length"  # an answer cut off is not complete
            break
        if handed:  # the caller runs these and continues the conversation itself
            result.final_response = reply.content
            result.client_tool_calls = handed
            result.finish_reason = "tool_calls"
            break
        for call, outcome in await _run_calls(session, reply.tool_calls):
            _count(result, session, call.name, outcome.ok)
            tool_message = {"role": "tool", "tool_call_id": call.id, "content": outcome.content}
            history.append(tool_message)
            saved_history.append({**tool_message, "name": call.name})
    else:
        result.finish_reason = "max_turns"
    result.messages = saved + saved_history
    return result


async def _ask(session: Session, messages: list[Message], schemas: list[dict[str, Any]]) -> AssistantMessage:
    """One model call, with the session's request fields when it has any."""
    if session.model_params:
        return await session.client.complete(messages, schemas, session.model_params)
    # the two-argument call every client takes, those written before params too
    return await session.client.complete(messages, schemas)


async def _run_calls(session: Session, calls: list[ToolCall]) -> list[tuple[ToolCall, ToolOutcome]]:
    """Every call of one model turn with its outcome, in the order the model made them; the
    calls of a turn run concurrently."""
    if len(calls) == 1:  # the common case, without gather's task per call
        return [(calls[0], await _call_tool(session, calls[0]))]
    outcomes = await asyncio.gather(*(_call_tool(session, call) for call in calls))
    return list(zip(calls, outcomes, strict=True))


def _dedupe_call_ids(calls: list[ToolCall], turn: int, seen: set[str]) -> None:
    """Some providers repeat or omit ids; every call of the conversation needs an id of its own."""
    for position, call in enumerate(calls):
        if not call.id or call.id in seen:
            call.id = f"call_{turn}_{position}"
        seen.add(call.id)


def _count(result: ConversationResult, session: Session, name: str, ok: bool) -> None:
    stat = result.tool_stats.get(name)
    if stat is None:
        if name not in session.tools and name not in session.known_tools:
            result.invalid_tool_calls += 1
            return
        stat = result.tool_stats[name] = ToolStat()
    stat.count += 1
    if ok:
        stat.success += 1
    else:
        stat.failure += 1


async def _call_tool(session: Session, call: ToolCall) -> ToolOutcome:
    if session.on_tool is None:
        return await _run_tool(session, call)
    session.on_tool(call, "running")
    outcome = await _run_tool(session, call)
    session.on_tool(call, "completed" if outcome.ok else "failed")
    return outcome


async def _run_tool(session: Session, call: ToolCall) -> ToolOutcome:
    tool = session.tools.get(call.name)
    if tool is None:
        offered = ", ".join(sorted(session.tools)) or "none"
        return ToolOutcome(
            f"Error: tool '{call.name}' is not available. Available tools: {offered}.", ok=False
        )
    try:
        arguments: Any = json.loads(call.arguments) if call.arguments.strip() else {}
    except ValueError as exc:
        return ToolOutcome(f"Error: arguments are not valid JSON ({exc}); send a JSON object.", ok=False)
    if not isinstance(arguments, dict):
        return ToolOutcome("Error: arguments must be a JSON object.", ok=False)
    context = ToolContext(
        session.sandbox, session.tool_timeout, session.tool_output_cap, session.tool_session
    )
    try:
        content = await tool.run(arguments, context)
    except ToolError as exc:
        return ToolOutcome(cap_text(f"Error: {exc}", session.tool_output_cap), ok=False)
    except SandboxError:
        raise  # the sandbox itself is broken: the session fails and is retried
    except Exception as exc:  # a bug in one tool must not end the session: the model is told
        return ToolOutcome(f"Error: {call.name} failed: {type(exc).__name__}: {exc}", ok=False)
    return ToolOutcome(cap_text(content, session.tool_output_cap), ok=True)
