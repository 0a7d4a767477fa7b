"""``trajkit serve``'s pieces without a process: request checks, history cleaning, labels."""

from __future__ import annotations

import pytest

from trajkit.config.resolve import resolve
from trajkit.manager import load_plugins
from trajkit.model import ToolCall
from trajkit.plugins.openai.client import OpenAIClient
from trajkit.serve.protocol import ChatRequest, ProtocolError, parse_request, split_messages
from trajkit.serve.service import ServedAgent, tool_label
from trajkit.serve.settings import ServerKeyError, ServeSettings, check_exposure
from trajkit.serve.stream import inline_progress


class NoParams(OpenAIClient):
    """A client that cannot take per-call fields."""

    takes_params = False


def test_sampling_fields_a_client_cannot_apply_are_refused_not_dropped() -> None:
    agent = ServedAgent(
        resolve(host := load_plugins(), {"model": "some/model", "api_key": "sk-unit-test-key"}),
        ServeSettings(),
        host,
    )
    request = ChatRequest.model_validate(
        {"model": "some/model", "messages": [{"role": "user", "content": "x"}]}
    )
    assert agent.check_request(request.model_copy(update={"max_tokens": 5, "top_p": 0.5})) == []
    agent.client_class = NoParams
    assert agent.check_request(request) == []
    with pytest.raises(ProtocolError) as caught:
        agent.check_request(request.model_copy(update={"max_tokens": 5, "top_p": 0.5}))
    assert caught.value.status == 400 and "max_tokens, top_p" in str(caught.value)


def test_inline_progress_is_taken_out_of_history_and_system_messages_join() -> None:
    call = ToolCall("call_1", "terminal", '{"command": "ls -la"}')
    marked = inline_progress(call, "running", tool_label(call)) + inline_progress(call, "completed", "x")
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "one"},
            {"role": "developer", "content": [{"type": "text", "text": "two"}]},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": marked + "The answer."},
            {"role": "user", "content": "again"},
        ],
    }
    system, conversation = split_messages(parse_request(body, "m"))
    assert system == "one\n\ntwo"
    assert conversation == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "The answer."},
        {"role": "user", "content": "again"},
    ]


def test_labels_are_short_and_say_what_a_call_does() -> None:
    assert tool_label(ToolCall("c", "terminal", '{"command": "ls\\n  -la"}')) == "terminal: ls -la"
    assert tool_label(ToolCall("c", "read_file", "{not json")) == "read_file"
    long = tool_label(ToolCall("c", "write_file", '{"path": "' + "a" * 200 + '"}'))
    assert len(long) == 80 and long.endswith("…")


def test_exposure() -> None:
    with pytest.raises(ServerKeyError):
        check_exposure(ServeSettings(host="0.0.0.0"))
    with pytest.raises(ServerKeyError):
        check_exposure(ServeSettings(host="::", server_key="short"))
    assert check_exposure(ServeSettings(host="0.0.0.0", server_key="k" * 32)) is None
    assert "no server key" in (check_exposure(ServeSettings()) or "")
    assert check_exposure(ServeSettings(host="::1", server_key="k" * 32)) is None


def test_a_tool_result_must_say_which_call_it_answers() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}]}
    with pytest.raises(ProtocolError) as caught:
        split_messages(parse_request(body, "m"))
    assert caught.value.status == 400 and "tool_call_id" in str(caught.value)
