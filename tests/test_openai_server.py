"""The OpenAI-compatible test server, exercised through the real ``openai`` SDK.

Other tests and the benchmarks trust this server to behave like the real API (typed errors,
headers, timeouts) and to report concurrency honestly, so those are the properties checked here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest

from trajkit.testing.openai_server import (
    Fault,
    OpenAITestServer,
    echo_policy,
    fault_every,
    fault_fraction,
    tool_script_policy,
)

MODEL = "test-model"
HELLO = [{"role": "user", "content": "hello"}]
REPO_ROOT = Path(__file__).resolve().parents[1]


def client_for(server: OpenAITestServer, **kwargs: Any) -> openai.OpenAI:
    kwargs.setdefault("api_key", "sk-test")
    return openai.OpenAI(base_url=server.base_url, max_retries=0, **kwargs)


def weather_policy(body: dict[str, Any]) -> dict[str, Any]:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
    }
    return {"content": None, "tool_calls": [call]}


def test_tool_call_round_trips_through_the_sdk() -> None:
    with OpenAITestServer(weather_policy) as server:
        response = client_for(server).chat.completions.create(model=MODEL, messages=HELLO)
        assert server.count == 1
        [record] = server.requests

    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls or []
    assert call.id == "call_1"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo"}
    assert response.model == MODEL
    assert response.usage is not None and response.usage.total_tokens > 0
    assert record.number == 0 and record.status == 200
    assert record.body["messages"] == HELLO
    assert record.headers["authorization"] == "Bearer sk-test"
    assert record.time_answered is not None and record.time_answered >= record.time_received


def test_extra_message_keys_and_overrides_reach_the_raw_json() -> None:
    async def policy(body: dict[str, Any]) -> dict[str, Any]:
        return {
            "content": "42",
            "reasoning_content": "thinking...",
            "reasoning_details": [{"type": "reasoning.text", "text": "thinking..."}],
            "_usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
            "_finish_reason": "length",
        }

    with OpenAITestServer(policy) as server:
        raw = client_for(server).chat.completions.with_raw_response.create(model=MODEL, messages=HELLO)

    payload = raw.http_response.json()
    message = payload["choices"][0]["message"]
    assert message["role"] == "assistant"
    assert message["content"] == "42"
    assert message["reasoning_content"] == "thinking..."
    assert message["reasoning_details"][0]["text"] == "thinking..."
    assert payload["choices"][0]["finish_reason"] == "length"
    assert payload["usage"] == {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    assert raw.parse().choices[0].message.content == "42"


def test_wrong_api_key_is_an_authentication_error() -> None:
    with OpenAITestServer(echo_policy, api_key="sk-right") as server:
        with pytest.raises(openai.AuthenticationError) as caught:
            client_for(server, api_key="sk-wrong").chat.completions.create(model=MODEL, messages=HELLO)
        ok = client_for(server, api_key="sk-right").chat.completions.create(model=MODEL, messages=HELLO)
        statuses = [record.status for record in server.requests]

    assert caught.value.status_code == 401
    assert ok.choices[0].message.content == "ok"
    assert statuses == [401, 200]


def test_unknown_model_is_not_found() -> None:
    with OpenAITestServer(echo_policy, models={MODEL}) as server:
        client = client_for(server)
        with pytest.raises(openai.NotFoundError) as caught:
            client.chat.completions.create(model="nope", messages=HELLO)
        listed = [model.id for model in client.models.list()]

    assert "The model `nope` does not exist" in str(caught.value)
    assert listed == [MODEL]


def test_streaming_and_unknown_routes_get_openai_style_errors() -> None:
    with OpenAITestServer(echo_policy) as server:
        with pytest.raises(openai.BadRequestError):
            client_for(server).chat.completions.create(model=MODEL, messages=HELLO, stream=True)
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(server.base_url + "/embeddings", timeout=5)

    assert caught.value.code == 404
    error = json.loads(caught.value.read())["error"]
    assert {"message", "type", "code"} <= error.keys()


def test_injected_rate_limit_carries_retry_after() -> None:
    faults = fault_every(2, Fault(status=429, headers={"Retry-After": "7"}, message="slow down"))
    with OpenAITestServer(echo_policy, faults=faults) as server:
        client = client_for(server)
        client.chat.completions.create(model=MODEL, messages=HELLO)
        with pytest.raises(openai.RateLimitError) as caught:
            client.chat.completions.create(model=MODEL, messages=HELLO)
        statuses = [record.status for record in server.requests]

    assert caught.value.response.headers["retry-after"] == "7"
    assert "slow down" in str(caught.value)
    assert statuses == [200, 429]


def test_hang_past_the_client_timeout_times_out_and_shutdown_is_prompt() -> None:
    server = OpenAITestServer(echo_policy, faults=lambda number, body: Fault(status=0, hang=30.0)).start()
    try:
        with pytest.raises(openai.APITimeoutError):
            client_for(server, timeout=0.3).chat.completions.create(model=MODEL, messages=HELLO)
    finally:
        started = time.monotonic()
        server.stop()
    assert time.monotonic() - started < 2.0


def test_dropped_connection_is_a_connection_error() -> None:
    with OpenAITestServer(echo_policy, faults=lambda number, body: Fault(close=True)) as server:
        with pytest.raises(openai.APIConnectionError):
            client_for(server).chat.completions.create(model=MODEL, messages=HELLO)
        assert server.requests[0].status == 0


def test_max_in_flight_tracks_concurrent_async_requests() -> None:
    async def scenario() -> tuple[int, int, int]:
        server = OpenAITestServer(echo_policy, latency=0.2)
        async with server.serving():
            client = openai.AsyncOpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0)
            replies = await asyncio.gather(
                *(client.chat.completions.create(model=MODEL, messages=HELLO) for _ in range(50))
            )
            await client.close()
            assert all(reply.choices[0].message.content == "ok" for reply in replies)
            return server.max_in_flight, server.in_flight, server.count

    max_in_flight, in_flight, count = asyncio.run(scenario())
    assert 1 < max_in_flight <= 50
    assert in_flight == 0
    assert count == 50


def test_tool_script_policy_calls_tools_then_answers() -> None:
    with OpenAITestServer(
        tool_script_policy(calls=3, tool="terminal", arguments={"command": "ls"})
    ) as server:
        client = client_for(server)
        messages: list[dict[str, Any]] = list(HELLO)
        call_ids: list[str] = []
        for _ in range(10):
            message = client.chat.completions.create(model=MODEL, messages=messages).choices[0].message
            if not message.tool_calls:
                break
            [call] = message.tool_calls
            assert call.function.name == "terminal"
            assert json.loads(call.function.arguments) == {"command": "ls"}
            call_ids.append(call.id)
            messages.append(message.model_dump(exclude_none=True))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "done"})

    assert len(call_ids) == 3
    assert len(set(call_ids)) == 3
    assert message.content == "done"


def read_response(conn: socket.socket) -> bytes:
    """Read one Content-Length response from a raw socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(body) < length:
        body += conn.recv(65536)
    return head


def test_keep_alive_connection_close_and_idle_shutdown() -> None:
    request = (
        b"POST /chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 17\r\n%s\r\n{"model": "test"}'
    )
    server = OpenAITestServer(echo_policy).start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as conn:
            conn.sendall(request % b"" + request % b"Connection: close\r\n")
            received = b""
            while chunk := conn.recv(65536):
                received += chunk
        assert received.count(b"HTTP/1.1 200 OK") == 2
        idle = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        for _ in range(2):  # HTTP/1.1 keeps the connection: a second request goes on the same one
            idle.sendall(request % b"")
            assert b"connection: close" not in read_response(idle).lower()
        assert server.count == 4
    finally:
        started = time.monotonic()
        server.stop()
    assert time.monotonic() - started < 2.0
    with idle, contextlib.suppress(ConnectionResetError):  # hung up on, not waited for
        assert idle.recv(1) == b""


def test_fault_helpers_are_deterministic() -> None:
    fault = Fault()
    every_third = fault_every(3, fault)
    assert [n for n in range(9) if every_third(n, {})] == [2, 5, 8]
    picks = [n for n in range(2000) if fault_fraction(0.25, fault, seed=1)(n, {})]
    assert picks == [n for n in range(2000) if fault_fraction(0.25, fault, seed=1)(n, {})]
    assert 400 < len(picks) < 600
    assert not any(fault_fraction(0.0, fault)(n, {}) for n in range(100))


def test_command_line_server_answers_then_exits_on_sigterm() -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    }
    command = [sys.executable, "-m", "trajkit.testing.openai_server", "--port", "0", "--tool-calls", "1"]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    ) as process:
        try:
            assert process.stdout is not None and process.stderr is not None
            line = process.stdout.readline()
            assert line.startswith("READY http://127.0.0.1:"), line + process.stderr.read()
            client = openai.OpenAI(base_url=line.split()[1], api_key="sk-test", max_retries=0, timeout=5)
            message = client.chat.completions.create(model=MODEL, messages=HELLO).choices[0].message
            assert message.tool_calls and message.tool_calls[0].function.name == "terminal"
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=5) == 0
        finally:
            if process.poll() is None:
                process.kill()
