"""``trajkit serve`` as a process, through the real ``openai`` SDK and raw HTTP, in front of the
project's OpenAI-compatible test server."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from tests.helpers import read_jsonl, trajkit
from tests.serve_helpers import MODEL, TURN_USAGE, ServeProcess, serve_policy, write_key
from trajkit.testing.openai_server import OpenAITestServer

MODEL_KEY = "sk-model-key-2718281828459"
SERVER_KEY = "trajkit-server-key-1414213562"
ALLOWED = "http://allowed.example"


@pytest.fixture(scope="module")
def model_server() -> Iterator[OpenAITestServer]:
    with OpenAITestServer(serve_policy, api_key=MODEL_KEY, models={MODEL}) as server:
        yield server


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("keys")
    return write_key(tmp / "model.key", MODEL_KEY), write_key(tmp / "server.key", SERVER_KEY)


def start(model_server: OpenAITestServer, keys: tuple[Path, Path], root: Path, *args: str) -> ServeProcess:
    model_key, server_key = keys
    return ServeProcess(
        "--model", MODEL, "--base_url", model_server.base_url, "--api_key_file", str(model_key),
        "--server_key_file", str(server_key), "--sandbox_option", f"local.root={root}",
        "--sandbox_option", "local.isolation=none", *args,
    )  # fmt: skip


@pytest.fixture(scope="module")
def served(
    model_server: OpenAITestServer, keys: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServeProcess, Path, Path]]:
    """One recording server for most tests; the run directory is checked once it has stopped."""
    tmp = tmp_path_factory.mktemp("served")
    run_dir, root = tmp / "runs" / "served", tmp / "sandboxes"
    process = start(
        model_server, keys, root, "--record", str(run_dir), "--cors_origin", ALLOWED, "--keepalive", "0.5"
    )
    yield process, run_dir, root
    process.stop()


def client(process: ServeProcess, **kwargs: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=process.base_url, api_key=SERVER_KEY, max_retries=0, **kwargs)


def model_requests(server: OpenAITestServer, marker: str) -> list[dict[str, Any]]:
    """The bodies the model received for the conversation whose prompt holds ``marker``."""
    return [
        r.body for r in server.requests if any(marker in str(m.get("content")) for m in r.body["messages"])
    ]


# -- the openai SDK, sync and async, streamed and not ----------------------------------------------


def test_sdk_answer_with_usage_summed_over_the_agents_calls(
    served: tuple[ServeProcess, Path, Path], model_server: OpenAITestServer
) -> None:
    process, _, _ = served
    answer = client(process).chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "system", "content": "SYSTEM-FROM-CLIENT"},
            {"role": "user", "content": "Tidy the notes m1 [dialect:reasoning_content]"},
        ],
    )
    calls = model_requests(model_server, "m1")
    assert len(calls) == 4  # write, list, read, answer
    assert all(c["messages"][0] == {"role": "system", "content": "SYSTEM-FROM-CLIENT"} for c in calls)
    assert {t["function"]["name"] for t in calls[0]["tools"]} >= {"terminal", "read_file", "write_file"}
    choice = answer.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.content.startswith("I completed the task using 3 tool calls")
    assert "notes file" in (choice.message.model_extra or {})["reasoning_content"]
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (
        4 * TURN_USAGE["prompt_tokens"],
        4 * TURN_USAGE["completion_tokens"],
    )
    assert answer.usage.total_tokens == 440


def test_sdk_stream_sync(served: tuple[ServeProcess, Path, Path]) -> None:
    process, _, _ = served
    stream = client(process).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Tidy the notes m2"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content.startswith("I completed the task using 3 tool calls")
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.total_tokens == 440


def test_the_simplest_client_loop_reads_the_stream_tool_events_and_all(
    served: tuple[ServeProcess, Path, Path],
) -> None:
    process, _, _ = served
    stream = client(process).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Tidy the notes m7"}], stream=True
    )
    content = "".join(chunk.choices[0].delta.content or "" for chunk in stream)  # no guard on choices
    assert content.startswith("I completed the task using 3 tool calls")


def test_sdk_async_streamed_and_not(served: tuple[ServeProcess, Path, Path]) -> None:
    process, _, _ = served

    async def both() -> tuple[str, str]:
        async with openai.AsyncOpenAI(
            base_url=process.base_url, api_key=SERVER_KEY, max_retries=0
        ) as aclient:
            whole = await aclient.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Tidy the notes m3"}]
            )
            stream = await aclient.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Tidy the notes m3"}], stream=True
            )
            parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
            return whole.choices[0].message.content or "", "".join(parts)

    whole, streamed = asyncio.run(both())
    assert whole == streamed and "Tidy the notes m3" in whole


def test_sampling_fields_reach_every_model_call(
    served: tuple[ServeProcess, Path, Path], model_server: OpenAITestServer
) -> None:
    process, _, _ = served
    client(process).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Tidy the notes m4"}],
        max_tokens=321,
        temperature=0.25,
        top_p=0.5,
        stop=["STOP-HERE"],
    )
    calls = model_requests(model_server, "m4")
    assert calls and all(
        (c["max_tokens"], c["temperature"], c["top_p"], c["stop"]) == (321, 0.25, 0.5, ["STOP-HERE"])
        for c in calls
    )


def test_sampling_fields_on_the_sdk_transport_too(
    model_server: OpenAITestServer, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    config = tmp_path / "serve.toml"
    config.write_text('transport = "sdk"\n')
    with start(model_server, keys, tmp_path / "sbx", "--config", str(config)) as process:
        client(process).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Tidy the notes m8"}], max_tokens=77, seed=5
        )
    calls = model_requests(model_server, "m8")
    assert len(calls) == 4 and all((c["max_tokens"], c["seed"]) == (77, 5) for c in calls)


def test_client_tools_come_back_as_tool_calls_and_the_conversation_goes_on(
    served: tuple[ServeProcess, Path, Path],
) -> None:
    process, _, _ = served
    weather = {
        "type": "function",
        "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}},
    }
    messages: list[Any] = [{"role": "user", "content": "Weather? [client-tool]"}]
    first = client(process).chat.completions.create(model=MODEL, messages=messages, tools=[weather])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls is not None
    call = choice.message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    second = client(process).chat.completions.create(model=MODEL, messages=messages, tools=[weather])
    assert second.choices[0].message.content == "The weather: sunny"
    stream = client(process).chat.completions.create(
        model=MODEL, messages=messages[:1], tools=[weather], stream=True
    )
    chunks = [c.choices[0] for c in stream if c.choices]
    streamed = [d for c in chunks for d in c.delta.tool_calls or ()]
    assert [(d.index, d.function.name if d.function else None) for d in streamed] == [(0, "get_weather")]
    assert [c.finish_reason for c in chunks if c.finish_reason] == ["tool_calls"]


@pytest.mark.parametrize(
    ("change", "status", "param"),
    [
        ({"model": "other-model"}, 404, "model"),
        ({"n": 2}, 400, "n"),
        ({"tool_choice": "required"}, 400, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "terminal"}}]}, 400, "tools"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            400,
            "messages",
        ),
        ({"temperature": 9}, 400, "temperature"),
        (
            {
                "messages": [
                    {"role": "assistant", "tool_calls": [{"id": "a"}]},
                    {"role": "tool", "content": "x"},
                ]
            },
            400,
            "messages.0.tool_calls.0.function",
        ),
    ],
)
def test_fields_that_cannot_be_honoured_are_refused(
    served: tuple[ServeProcess, Path, Path], change: dict[str, Any], status: int, param: str
) -> None:
    process, _, _ = served
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "unknown_field": 1, **change}
    with pytest.raises(openai.APIStatusError) as caught:
        client(process).post("/chat/completions", body=body, cast_to=object)
    assert caught.value.status_code == status
    error = caught.value.body
    assert isinstance(error, dict) and error["param"] == param and error["message"]


def test_models_and_health(served: tuple[ServeProcess, Path, Path]) -> None:
    process, _, _ = served
    assert [m.id for m in client(process).models.list()] == [MODEL]

    async def health() -> tuple[int, Any]:
        async with aiohttp.ClientSession() as session, session.get(f"{process.origin}/health") as response:
            return response.status, await response.json()

    assert asyncio.run(health()) == (200, {"status": "ok"})


# -- raw SSE -----------------------------------------------------------------------------------------


async def raw_post(
    url: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], str]:
    auth = {"Authorization": f"Bearer {SERVER_KEY}"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, json=body, headers={**auth, **(headers or {})}) as response,
    ):
        return response.status, dict(response.headers), await response.text()


def parse_sse(text: str) -> list[tuple[str, Any]]:
    """(kind, payload): ("comment", text), ("event NAME", json), ("data", json or "[DONE]")."""
    events: list[tuple[str, Any]] = []
    for block in text.split("\n\n"):
        if not block:
            continue
        if block.startswith(":"):
            events.append(("comment", block[1:].strip()))
            continue
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        data = fields["data"] if fields["data"] == "[DONE]" else json.loads(fields["data"])
        events.append((f"event {fields['event']}" if "event" in fields else "data", data))
    return events


def test_raw_stream_order_tool_events_and_usage(served: tuple[ServeProcess, Path, Path]) -> None:
    process, _, _ = served
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tidy the notes m5"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    status, headers, text = asyncio.run(raw_post(f"{process.base_url}/chat/completions", body))
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = parse_sse(text)
    kinds = [kind for kind, _ in events]
    assert kinds[0] == "data" and events[0][1]["choices"][0]["delta"]["role"] == "assistant"
    assert events[-1] == ("data", "[DONE]")
    usage = events[-2][1]
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] == 440
    finish = events[-3][1]["choices"][0]
    assert finish["finish_reason"] == "stop" and finish["delta"] == {}
    tools = [payload for kind, payload in events if kind == "event trajkit.tool"]
    assert [(t["tool"], t["status"]) for t in tools] == [
        ("write_file", "running"), ("write_file", "completed"),
        ("terminal", "running"), ("terminal", "completed"),
        ("read_file", "running"), ("read_file", "completed"),
    ]  # fmt: skip
    assert all(t["call_id"] and t["label"].startswith(t["tool"]) for t in tools)
    assert all(t["choices"] == [{"index": 0, "delta": {}, "finish_reason": None}] for t in tools)
    deltas = [p["choices"][0]["delta"] for k, p in events if k == "data" and p != "[DONE]" and p["choices"]]
    reasoning_at = [i for i, d in enumerate(deltas) if "reasoning_content" in d]
    content_at = [i for i, d in enumerate(deltas) if d.get("content")]
    assert len(reasoning_at) == 4 and content_at and max(reasoning_at) < min(content_at)


def test_streamed_reasoning_keeps_the_turns_apart(served: tuple[ServeProcess, Path, Path]) -> None:
    """Each turn's reasoning arrives as it happens; read together, the deltas are what the plain
    answer's ``reasoning_content`` says, turns separated, not run into one another."""
    process, _, _ = served
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tidy the notes m8"}]}
    status, _, text = asyncio.run(raw_post(f"{process.base_url}/chat/completions", body))
    assert status == 200
    whole = json.loads(text)["choices"][0]["message"]["reasoning_content"]
    status, _, text = asyncio.run(raw_post(f"{process.base_url}/chat/completions", {**body, "stream": True}))
    deltas = [
        p["choices"][0]["delta"] for k, p in parse_sse(text) if k == "data" and p != "[DONE]" and p["choices"]
    ]
    streamed = "".join(d.get("reasoning_content", "") for d in deltas)
    assert whole.count("\n\n") >= 3 and streamed == whole


def test_a_conversation_too_long_for_the_model_is_a_400_no_client_retries(
    served: tuple[ServeProcess, Path, Path], model_server: OpenAITestServer
) -> None:
    """OpenAI's 400 ``context_length_exceeded``: the SDK (retrying a 5xx twice by default) gives up
    at once, so one request is one agent session; streamed, the error arrives as OpenAI's SDKs
    raise it."""
    process, _, _ = served
    sdk = openai.OpenAI(base_url=process.base_url, api_key=SERVER_KEY)  # the SDK's default retries
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Tidy o1 [overflow]"}])
    assert refused.value.code == "context_length_exceeded" and refused.value.param == "messages"
    assert "maximum context length" in refused.value.message
    sessions = [body for body in model_requests(model_server, "o1") if len(body["messages"]) == 2]
    assert len(sessions) == 1, "one agent session for one request"

    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tidy o2 [overflow]"}], "stream": True}
    status, _, text = asyncio.run(raw_post(f"{process.base_url}/chat/completions", body))
    assert status == 200  # the headers left before the model's refusal
    error = [payload for kind, payload in parse_sse(text) if kind == "data" and "error" in payload]
    assert [e["error"]["code"] for e in error] == ["context_length_exceeded"]


def test_keepalive_comments_during_a_long_tool_call(
    model_server: OpenAITestServer, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    with start(
        model_server, keys, tmp_path / "sbx", "--keepalive", "0.3", "--request_timeout", "2"
    ) as process:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "[slow] k1"}], "stream": True}
        status, _, text = asyncio.run(raw_post(f"{process.base_url}/chat/completions", body))
    assert status == 200
    events = parse_sse(text)
    assert ("comment", "keepalive") in events
    # the time limit ends the stream with an error the SDKs raise
    error = events[-1][1]
    assert error["error"]["code"] == "timeout"


# -- safety ------------------------------------------------------------------------------------------


def test_a_key_is_required_and_compared_exactly(served: tuple[ServeProcess, Path, Path]) -> None:
    process, _, _ = served
    for key in ("wrong", SERVER_KEY + "x", SERVER_KEY[:-1]):
        with pytest.raises(openai.AuthenticationError) as caught:
            openai.OpenAI(base_url=process.base_url, api_key=key, max_retries=0).models.list()
        assert caught.value.status_code == 401
        assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "invalid_api_key"
        assert SERVER_KEY not in json.dumps(caught.value.body)
    status, _, text = asyncio.run(
        raw_post(f"{process.base_url}/chat/completions", {}, headers={"Authorization": ""})
    )
    assert status == 401 and json.loads(text)["error"]["type"] == "invalid_request_error"


def test_cors(served: tuple[ServeProcess, Path, Path]) -> None:
    process, _, _ = served
    url = f"{process.base_url}/chat/completions"

    async def preflight(origin: str) -> tuple[int, dict[str, str]]:
        headers = {
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        }
        async with aiohttp.ClientSession() as session, session.options(url, headers=headers) as response:
            return response.status, dict(response.headers)

    status, headers = asyncio.run(preflight(ALLOWED))
    assert status == 204 and headers["Access-Control-Allow-Origin"] == ALLOWED
    assert "Authorization" in headers["Access-Control-Allow-Headers"] and headers["Vary"] == "Origin"
    status, headers = asyncio.run(preflight(ALLOWED + ":8080"))  # exact match only
    assert status == 403 and "Access-Control-Allow-Origin" not in headers
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi m6"}]}
    status, headers, _ = asyncio.run(raw_post(url, body, headers={"Origin": ALLOWED}))
    assert status == 200 and headers["Access-Control-Allow-Origin"] == ALLOWED and headers["Vary"] == "Origin"
    status, headers, _ = asyncio.run(raw_post(url, body, headers={"Origin": "http://evil.example"}))
    assert status == 403 and "Access-Control-Allow-Origin" not in headers
    status, headers, _ = asyncio.run(raw_post(url, body))  # no Origin: not a browser page, CORS has no say
    assert status == 200 and "Access-Control-Allow-Origin" not in headers


def test_body_size_limit(model_server: OpenAITestServer, keys: tuple[Path, Path], tmp_path: Path) -> None:
    with start(model_server, keys, tmp_path / "sbx", "--max_body_bytes", "2048") as process:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "x" * 5000}]}
        status, _, text = asyncio.run(raw_post(f"{process.base_url}/chat/completions", body))
    assert status == 413 and json.loads(text)["error"]["message"].startswith("the request body is too large")


def sandboxes(root: Path) -> list[str]:
    """The sandboxes' directories in ``root`` (an unconfined one's ``NAME.tmp`` beside it not counted)."""
    return [name for name in entries(root) if not name.endswith(".tmp")]


def entries(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def wait_until_empty(root: Path, seconds: float = 5.0) -> list[str]:
    deadline = time.monotonic() + seconds
    while entries(root) and time.monotonic() < deadline:
        time.sleep(0.05)
    return entries(root)


def test_concurrency_cap_and_time_limit(
    model_server: OpenAITestServer, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    root = tmp_path / "sbx"
    with start(model_server, keys, root, "--max_concurrent", "1", "--request_timeout", "3") as process:
        url = f"{process.base_url}/chat/completions"

        async def two() -> tuple[tuple[int, dict[str, str], str], tuple[int, dict[str, str], str]]:
            slow = asyncio.create_task(
                raw_post(url, {"model": MODEL, "messages": [{"role": "user", "content": "[slow] c1"}]})
            )
            while not sandboxes(root):  # the first request holds the only place
                await asyncio.sleep(0.05)
            second = await raw_post(
                url, {"model": MODEL, "messages": [{"role": "user", "content": "quick c2"}]}
            )
            return await slow, second

        (slow_status, _, slow_text), (status, headers, text) = asyncio.run(two())
        assert status == 429 and headers["Retry-After"] == "2"
        assert json.loads(text)["error"]["type"] == "rate_limit_error"
        assert slow_status == 504 and json.loads(slow_text)["error"]["code"] == "timeout"
        assert wait_until_empty(root) == []
        quick = client(process).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "c3"}]
        )
        assert quick.choices[0].finish_reason == "stop"  # the place is free again


def test_a_client_leaving_mid_stream_cancels_the_session_and_its_sandbox(
    model_server: OpenAITestServer, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    root = tmp_path / "sbx"
    with start(model_server, keys, root) as process:

        async def leave() -> list[str]:
            body = {"model": MODEL, "messages": [{"role": "user", "content": "[slow] d1"}], "stream": True}
            headers = {"Authorization": f"Bearer {SERVER_KEY}"}
            async with aiohttp.ClientSession() as session:
                response = await session.post(
                    f"{process.base_url}/chat/completions", json=body, headers=headers
                )
                async for line in response.content:
                    if b'"status":"running"' in line:
                        break
                during = sandboxes(root)
                response.close()  # the client goes away while `sleep 30` runs
            return during

        during = asyncio.run(leave())
        assert len(during) == 1
        assert wait_until_empty(root) == []
        assert process.process.poll() is None  # the server goes on


def test_a_client_leaving_a_plain_request_cancels_it_too(
    model_server: OpenAITestServer, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    root = tmp_path / "sbx"
    with start(model_server, keys, root) as process:

        async def leave() -> list[str]:
            body = {"model": MODEL, "messages": [{"role": "user", "content": "[slow] d2"}]}
            headers = {"Authorization": f"Bearer {SERVER_KEY}"}
            async with aiohttp.ClientSession() as session:
                request = asyncio.create_task(
                    session.post(f"{process.base_url}/chat/completions", json=body, headers=headers)
                )
                while not sandboxes(root):
                    await asyncio.sleep(0.05)
                during = sandboxes(root)
                request.cancel()  # the connection closes with the request unanswered
                await asyncio.gather(request, return_exceptions=True)
            return during

        assert len(asyncio.run(leave())) == 1
        assert wait_until_empty(root) == []


def test_inline_progress_is_marked_and_never_reaches_the_model(
    model_server: OpenAITestServer, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    with start(model_server, keys, tmp_path / "sbx", "--tool_progress", "inline") as process:
        messages: list[Any] = [{"role": "user", "content": "Tidy the notes i1"}]
        stream = client(process).chat.completions.create(model=MODEL, messages=messages, stream=True)
        content = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert content.count('<details type="trajkit.tool"') == 6
        messages += [{"role": "assistant", "content": content}, {"role": "user", "content": "Again i2"}]
        client(process).chat.completions.create(model=MODEL, messages=messages)
    sent = model_requests(model_server, "i2")
    assert sent and all("trajkit.tool" not in json.dumps(body["messages"]) for body in sent)
    assert any(
        m.get("content", "").startswith("I completed")
        for m in sent[0]["messages"]
        if m["role"] == "assistant"
    )


def test_housekeeping_is_one_plain_model_call(
    served: tuple[ServeProcess, Path, Path], model_server: OpenAITestServer
) -> None:
    process, _, _ = served
    answer = client(process).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Title for this chat h1"}],
        extra_body={"metadata": {"task": "title_generation"}},
    )
    calls = model_requests(model_server, "h1")
    assert len(calls) == 1 and "tools" not in calls[0]
    assert answer.choices[0].message.content and answer.usage is not None and answer.usage.total_tokens == 110


def test_no_key_on_a_public_address_is_refused(tmp_path: Path) -> None:
    result = trajkit("serve", "--host", "0.0.0.0", "--port", "0")
    assert result.returncode == 2 and "refusing to listen on 0.0.0.0 without a key" in result.stderr


# -- recording -------------------------------------------------------------------------------------


def test_recorded_sessions_are_a_run_directory(
    served: tuple[ServeProcess, Path, Path], tmp_path: Path
) -> None:
    process, run_dir, root = served
    client(process).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": f"Keep this secret {SERVER_KEY} r1"}]
    )
    assert process.stop() == 0, process.stderr
    assert entries(root) == []
    ledger = [r for path in sorted(run_dir.glob("batch_*.jsonl")) for r in read_jsonl(path)]
    assert ledger and all(r["metadata"]["served"] for r in ledger)
    text = json.dumps(ledger)
    assert SERVER_KEY not in text and MODEL_KEY not in text and "[REDACTED]" in text
    assert all(r["usage"]["total_tokens"] == 110 * r["api_calls"] for r in ledger)
    housekeeping = [r for r in ledger if "h1" in json.dumps(r["conversations"])]
    assert housekeeping == []  # a chat UI's own requests are not trajectories
    saved = json.loads((run_dir / "tools.json").read_text())  # what each session was offered
    for record in ledger:
        offered = [schema["function"]["name"] for schema in saved[record["tool_schemas_key"]]]
        assert offered == record["tools_offered"]
        assert set(record["toolsets_used"]) <= set(record["toolsets_offered"])
    kept = read_jsonl(run_dir / "trajectories.jsonl")
    rejected = read_jsonl(run_dir / "rejected.jsonl")
    assert len(kept) + len(rejected) == len(ledger)
    status = trajkit("status", str(run_dir))
    assert status.returncode == 0 and f"finished_records   {len(ledger)}" in status.stdout
    stats = trajkit("stats", str(run_dir))
    assert stats.returncode == 0 and "served" in stats.stdout, stats.stderr
    out = tmp_path / "served.openai.jsonl"
    exported = trajkit("export", str(run_dir), "--format", "openai", "--out", str(out))
    assert exported.returncode == 0, exported.stderr
    rows = read_jsonl(out)
    assert len(rows) == len(kept) and all(row["messages"][0]["role"] == "system" for row in rows)
    compressed = tmp_path / "compressed.jsonl"
    result = trajkit("compress", str(run_dir), "--out", str(compressed), "--max_tokens", "200")
    assert result.returncode == 0, result.stderr
    assert len(read_jsonl(compressed)) == len(kept)


def test_a_recording_server_merges_as_it_goes_and_holds_the_run_directory(
    model_server: OpenAITestServer, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    config = tmp_path / "serve.toml"
    config.write_text("merge_interval = 0.2\nbatch_size = 1\n")
    run_dir = tmp_path / "live"
    with start(
        model_server, keys, tmp_path / "sbx", "--config", str(config), "--record", str(run_dir)
    ) as process:
        for i in range(2):
            client(process).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": f"live {i}"}]
            )
        deadline = time.monotonic() + 30
        while (
            len(
                read_jsonl(run_dir / "trajectories.jsonl")
                if (run_dir / "trajectories.jsonl").exists()
                else []
            )
            < 2
        ):
            assert time.monotonic() < deadline, "no merge while serving"
            time.sleep(0.1)
        exported = trajkit("export", str(run_dir), "--format", "hermes", "--out", str(tmp_path / "h.jsonl"))
        assert exported.returncode == 0 and len(read_jsonl(tmp_path / "h.jsonl")) == 2
        dataset = tmp_path / "prompts.jsonl"
        dataset.write_text('{"prompt": "x"}\n')
        batch = trajkit(
            "run",
            "--dataset_file",
            str(dataset),
            "--run_name",
            "live",
            "--output_dir",
            str(tmp_path),
            "--resume",
        )
        assert batch.returncode == 75 and "in use by another trajkit invocation" in batch.stderr
        client(process).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "live 0"}])
    assert process.process.returncode == 0
    ledger = [r for path in sorted(run_dir.glob("batch_*.jsonl")) for r in read_jsonl(path)]
    assert len(ledger) == 3 and len({r["work_id"] for r in ledger}) == 3
    assert sorted(
        r["prompt_index"]
        for r in read_jsonl(run_dir / "trajectories.jsonl") + read_jsonl(run_dir / "rejected.jsonl")
    ) == [0, 1, 2]
    same = [r for r in ledger if r["prompt_id"] == ledger[0]["prompt_id"]]
    assert [r["work_id"].rsplit(".", 1)[1] for r in same] == ["0", "1"]  # one conversation served twice
