"""The model client against a misbehaving endpoint: retries, Retry-After, limits, fatal errors."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.helpers import read_jsonl, trajkit, write_jsonl
from trajkit.testing.openai_server import Fault, OpenAITestServer, RecordedRequest
from trajkit.testing.policies import dialect_policy


def faulty(number: int, body: dict[str, Any]) -> Fault | None:
    """Deterministic by arrival number: 429s with Retry-After, 500s, and requests that hang."""
    if number % 20 == 3:
        return Fault(status=429, headers={"Retry-After": "1"}, message="slow down")
    if number % 10 == 7:
        return Fault(status=500, message="internal hiccup")
    if number % 25 == 11:
        return Fault(status=0, hang=4.0)
    return None


def run_cli(dataset: Path, out: Path, base_url: str, *extra: str) -> Any:
    return trajkit(
        "run", "--dataset_file", str(dataset), "--run_name", "r", "--output_dir", str(out),
        "--model", "m", "--base_url", base_url, "--quiet", *extra,
    )  # fmt: skip


def body_key(request: RecordedRequest) -> str:
    return json.dumps(request.body["messages"], sort_keys=True)


def test_a_faulty_endpoint_still_completes_every_prompt(tmp_path: Path) -> None:
    """On the default transport; the SDK transport shares the retry loop and the error mapping."""
    dataset = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"job {i}"} for i in range(100)])
    server = OpenAITestServer(dialect_policy, faults=faulty)
    with server:
        result = run_cli(
            dataset, tmp_path, server.base_url, "--num_workers", "32", "--request_timeout", "1.5",
            "--max_retries", "8", "--distribution", "file_only",
        )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(read_jsonl(tmp_path / "r" / "trajectories.jsonl")) == 100

    requests = server.requests
    statuses = [r.status for r in requests]
    stats = json.loads((tmp_path / "r" / "statistics.json").read_text())["model_client"]
    assert stats["rate_limited"] == statuses.count(429) > 0
    assert stats["server_error"] == statuses.count(500) > 0
    assert stats["timeout"] > 0
    assert stats["retries"] == stats["rate_limited"] + stats["server_error"] + stats["timeout"]
    assert stats["sent"] == len(requests)
    assert stats["requests"] == statuses.count(200)  # answers received, each counted once
    assert stats["retries"] < 0.5 * stats["requests"], "retries must stay bounded"

    # No retry of a rate-limited request comes earlier than its Retry-After said.
    for position, request in enumerate(requests):
        if request.status != 429:
            continue
        retry = next(r for r in requests[position + 1 :] if body_key(r) == body_key(request))
        assert retry.time_received >= request.time_answered + 0.95


def test_request_limits_hold_across_all_sessions(tmp_path: Path) -> None:
    dataset = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"job {i}"} for i in range(10)])
    server = OpenAITestServer(dialect_policy, latency=0.2)
    with server:
        result = run_cli(
            dataset, tmp_path, server.base_url, "--num_workers", "10", "--max_rpm", "600",
            "--max_concurrent_requests", "3", "--distribution", "file_only",
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert server.max_in_flight <= 3
    starts = sorted(r.time_received for r in server.requests)
    assert len(starts) == 30
    for first in range(len(starts)):
        in_one_second = sum(1 for t in starts[first:] if t < starts[first] + 1.0)
        assert in_one_second <= 10 + 1


@pytest.mark.parametrize("transport", ["aiohttp", "sdk"])
def test_credentials_refused_mid_run_stop_the_run_with_one_message(tmp_path: Path, transport: str) -> None:
    """An endpoint without a model list passes the check; its first 401 stops the run."""
    dataset = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"job {i}"} for i in range(40)])
    with OpenAITestServer(dialect_policy, api_key="right") as server:
        result = run_cli(
            dataset, tmp_path, server.base_url, "--api_key", "wrong", "--num_workers", "4",
            "--transport", transport,
        )  # fmt: skip
        assert server.count <= 4
    assert result.returncode == 1
    assert result.stderr.count("stopping the run") == 1
    assert "refused the credentials (401)" in result.stderr
    failures = read_jsonl(tmp_path / "r" / "failures.jsonl")
    assert 1 <= len(failures) <= 4 and {f["error_class"] for f in failures} == {"auth_error"}
    assert "wrong" not in (tmp_path / "r" / "failures.jsonl").read_text()


@pytest.mark.parametrize("transport", ["aiohttp", "sdk"])
def test_refused_credentials_and_unknown_models_stop_the_run_before_any_session(
    tmp_path: Path, transport: str
) -> None:
    """Both are found by the check's model list: no completion request, no sandbox, one message."""
    dataset = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"job {i}"} for i in range(40)])
    sandboxes = tmp_path / "sandboxes"
    with OpenAITestServer(dialect_policy, api_key="right", models={"real-model", "other"}) as server:
        refused = run_cli(
            dataset, tmp_path / "a", server.base_url, "--api_key", "wrong", "--transport", transport,
            "--sandbox_option", f"local.root={sandboxes}",
        )  # fmt: skip
        unknown = run_cli(
            dataset, tmp_path / "b", server.base_url, "--api_key", "right", "--transport", transport,
            "--sandbox_option", f"local.root={sandboxes}",
        )  # fmt: skip
        assert server.count == 0
    assert not sandboxes.exists()
    assert refused.returncode == unknown.returncode == 2
    assert refused.stderr.count("error:") == 1 and "refused the credentials (401)" in refused.stderr
    assert "wrong" not in refused.stderr
    assert unknown.stderr.count("error:") == 1
    assert "model 'm' is not among the 2 models" in unknown.stderr


def test_an_unknown_model_found_mid_run_fails_fast(tmp_path: Path) -> None:
    """The same model list at /models would have caught it; here only the completions say so."""

    def no_such_model(body: dict[str, Any]) -> dict[str, Any]:
        return {
            "_status": 404,
            "_error": {"message": "The model `m` does not exist", "code": "model_not_found"},
        }

    dataset = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"job {i}"} for i in range(40)])
    with OpenAITestServer(no_such_model) as server:
        result = run_cli(dataset, tmp_path, server.base_url, "--num_workers", "4")
        assert server.count <= 4
    assert result.returncode == 1
    assert "model_not_found" in result.stderr and "does not exist" in result.stderr


def test_cost_from_the_endpoint_and_max_cost(tmp_path: Path) -> None:
    def priced(body: dict[str, Any]) -> dict[str, Any]:
        return {**dialect_policy(body), "_usage": {"prompt_tokens": 10, "completion_tokens": 5, "cost": 0.01}}

    dataset = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"job {i}"} for i in range(20)])
    with OpenAITestServer(priced) as server:
        result = run_cli(dataset, tmp_path, server.base_url, "--num_workers", "1", "--max_cost", "0.1")
    assert result.returncode == 1
    assert "--max_cost 0.1 reached" in result.stderr
    stats = json.loads((tmp_path / "r" / "statistics.json").read_text())
    assert 0.1 <= stats["cost"] <= 0.1 + 0.04 + 1e-9
    assert stats["pending"] == 20 - stats["done"]
    records = read_jsonl(tmp_path / "r" / "trajectories.jsonl")
    assert all(r["usage"]["cost"] == 0.01 * r["api_calls"] for r in records)


class ForwardProxy:
    """A plain-HTTP forward proxy: absolute-form requests in, origin-form to the target, answers back."""

    def __init__(self) -> None:
        self.targets: list[str] = []
        self.port = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> ForwardProxy:
        server = self.loop.run_until_complete(asyncio.start_server(self.handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                request_line, *lines = head.decode("latin-1").split("\r\n")[:-2]
                method, target, version = request_line.split(" ")
                self.targets.append(target)
                url = urlsplit(target)
                body = await reader.readexactly(_content_length(lines))
                if upstream is None:
                    upstream = await asyncio.open_connection(url.hostname, url.port)
                kept = [line for line in lines if not line.lower().startswith(("proxy-", "connection:"))]
                request = "\r\n".join([f"{method} {url.path} {version}", *kept, "", ""])
                upstream[1].write(request.encode("latin-1") + body)
                answer = await upstream[0].readuntil(b"\r\n\r\n")
                _, *answer_lines = answer.decode("latin-1").split("\r\n")[:-2]
                writer.write(answer + await upstream[0].readexactly(_content_length(answer_lines)))
                await writer.drain()
        finally:
            writer.close()
            if upstream is not None:
                upstream[1].close()


def _content_length(lines: list[str]) -> int:
    for line in lines:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            return int(value)
    return 0


@pytest.mark.parametrize("bypass", [False, True])
def test_a_proxy_from_the_environment_carries_the_requests(tmp_path: Path, bypass: bool) -> None:
    """aiohttp reads HTTP_PROXY/NO_PROXY: the check and every completion go through the proxy."""
    dataset = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"job {i}"} for i in range(5)])
    server = OpenAITestServer(dialect_policy)
    with server, ForwardProxy() as proxy:
        endpoint, models = f"{server.base_url}/chat/completions", f"{server.base_url}/models"
        env = {"HTTP_PROXY": f"http://127.0.0.1:{proxy.port}", "NO_PROXY": "127.0.0.1" if bypass else ""}
        result = trajkit(
            "run", "--dataset_file", str(dataset), "--run_name", "r", "--output_dir", str(tmp_path),
            "--model", "m", "--base_url", server.base_url, "--distribution", "file_only",
            env=env,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(read_jsonl(tmp_path / "r" / "trajectories.jsonl")) == 5
    if bypass:
        assert proxy.targets == []
    else:
        completions = [target for target in proxy.targets if target == endpoint]
        assert len(completions) == len(server.requests) >= 10
        assert set(proxy.targets) == {endpoint, models}


def test_cost_counts_answers_of_sessions_that_fail_later(tmp_path: Path) -> None:
    """Two paid turns, then a refusal: the session fails, and its two answers are still counted."""

    def paid_then_refused(body: dict[str, Any]) -> dict[str, Any]:
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        if turn == 2:
            return {"_status": 400, "_error": "context length exceeded"}
        usage = {"prompt_tokens": 100, "completion_tokens": 20, "cost": 0.25}
        return {**dialect_policy(body), "_usage": usage}

    dataset = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"job {i}"} for i in range(6)])
    with OpenAITestServer(paid_then_refused) as server:
        result = run_cli(
            dataset, tmp_path, server.base_url, "--num_workers", "3", "--max_attempts", "1",
            "--distribution", "file_only",
        )  # fmt: skip
    assert result.returncode == 1, result.stderr[-3000:]
    stats = json.loads((tmp_path / "r" / "statistics.json").read_text())
    assert (stats["pending"], stats["failed_for_good"]) == (0, 6)  # the context overflowed: final
    client = stats["model_client"]
    assert client["requests"] == 12 and client["sent"] == 18
    assert (client["prompt_tokens"], client["completion_tokens"]) == (1200, 240)
    assert client["cost"] == pytest.approx(3.0)


def test_an_empty_answer_is_retried_and_still_paid_for(tmp_path: Path) -> None:
    calls: list[int] = []

    def empty_first(body: dict[str, Any]) -> dict[str, Any]:
        calls.append(1)
        usage = {"prompt_tokens": 10, "completion_tokens": 0, "cost": 0.5}
        return {"content": "", "_usage": usage} if len(calls) == 1 else dialect_policy(body)

    dataset = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "job"}])
    with OpenAITestServer(empty_first) as server:
        result = run_cli(dataset, tmp_path, server.base_url, "--distribution", "file_only")
    assert result.returncode == 0, result.stderr[-3000:]
    client = json.loads((tmp_path / "r" / "statistics.json").read_text())["model_client"]
    assert client["empty_response"] == 1 and client["retries"] == 1
    assert client["requests"] == client["sent"] == len(calls)
    assert client["cost"] == pytest.approx(0.5)
