"""A misconfigured endpoint stops the run at once with one message, before any sandbox starts."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import read_jsonl, trajkit, write_jsonl
from trajkit.model import ModelNotFound
from trajkit.plugins.openai.endpoint import check_endpoint
from trajkit.testing.openai_server import OpenAITestServer, echo_policy


def run_cli(tmp: Path, base_url: str, *extra: str, env: dict[str, str] | None = None) -> Any:
    tmp.mkdir(parents=True, exist_ok=True)
    dataset = write_jsonl(tmp / "p.jsonl", [{"prompt": f"job {i}"} for i in range(8)])
    return trajkit(
        "run", "--dataset_file", str(dataset), "--run_name", "r", "--output_dir", str(tmp),
        "--model", "m", "--base_url", base_url, "--quiet", "--distribution", "file_only",
        "--sandbox_option", f"local.root={tmp / 'sandboxes'}", "--sandbox_option", "local.isolation=none",
        *extra,
        env=env,
    )  # fmt: skip


@contextmanager
def listener() -> Iterator[tuple[int, list[bytes]]]:
    """A bare TCP listener that records what each connection sends (a connection is a request made)."""
    received: list[bytes] = []
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    received.append(conn.recv(65536))
                except OSError:
                    received.append(b"")

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], received
    finally:
        stop.set()
        thread.join(5)
        server.close()


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def one_error(result: Any) -> str:
    """The run ended with usage's exit code and exactly one message."""
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert "Traceback" not in result.stderr and "attempt" not in result.stderr
    return errors[0]


@pytest.mark.parametrize("transport", ["aiohttp", "sdk"])
def test_an_unreachable_endpoint_fails_at_once_with_one_message(tmp_path: Path, transport: str) -> None:
    port = closed_port()
    result = run_cli(tmp_path, f"http://127.0.0.1:{port}/v1", "--transport", transport)
    assert one_error(result) == f"error: cannot connect to 127.0.0.1:{port}: Connection refused"
    assert not (tmp_path / "sandboxes").exists()


@pytest.mark.parametrize(
    ("key", "what"),
    [("sk-abc\nInjected: yes", "a newline at position 7"), ("sk abc", "whitespace"), ("sk-é", "non-ASCII")],
)
def test_a_key_that_would_break_the_header_is_refused_before_any_request(
    tmp_path: Path, key: str, what: str
) -> None:
    with listener() as (port, received):
        from_flag = run_cli(tmp_path / "flag", f"http://127.0.0.1:{port}/v1", "--api_key", key)
        from_env = run_cli(tmp_path / "env", f"http://127.0.0.1:{port}/v1", env={"OPENAI_API_KEY": key})
    assert received == [], "no connection was made"
    for result in (from_flag, from_env):
        message = one_error(result)
        assert what in message
        assert "Injected" not in result.stderr and "abc" not in result.stderr


@pytest.mark.parametrize(
    ("base_url", "problem"),
    [
        ("ftp://127.0.0.1/v1", "must start with http:// or https://"),
        ("http:///v1", "names no host"),
        ("http://127.0.0.1:port/v1", "is not a URL"),
        ("http://user:hunter2@127.0.0.1 /v1", "whitespace"),
    ],
)
def test_a_malformed_base_url_is_refused(tmp_path: Path, base_url: str, problem: str) -> None:
    message = one_error(run_cli(tmp_path, base_url, "--api_key", "k"))
    assert problem in message and "hunter2" not in message


def test_a_redirecting_endpoint_is_a_configuration_error_naming_the_target(tmp_path: Path) -> None:
    """At the check (the model list redirects): nothing is followed, no sandbox starts."""
    with listener() as (target_port, followed), redirecting(f"http://127.0.0.1:{target_port}/api/v1") as url:
        result = run_cli(tmp_path, url)
    message = one_error(result)
    assert f"a redirect to http://127.0.0.1:{target_port}/api/v1/models" in message
    assert f"set --base_url to http://127.0.0.1:{target_port}/api/v1" in message
    assert followed == []
    assert not (tmp_path / "sandboxes").exists()


def test_a_redirect_of_the_completions_stops_the_run_naming_the_target(tmp_path: Path) -> None:
    """An endpoint without a model list passes the check; its first redirect stops the run."""

    def moved(body: dict[str, Any]) -> dict[str, Any]:
        return {"_status": 308, "_headers": {"Location": "https://elsewhere.test/v2/chat/completions"}}

    with OpenAITestServer(moved) as server:
        result = run_cli(tmp_path, server.base_url, "--num_workers", "4")
        assert server.count <= 4
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stderr.count("stopping the run") == 1
    assert "a redirect to https://elsewhere.test/v2/chat/completions" in result.stderr
    assert {f["error_class"] for f in read_jsonl(tmp_path / "r" / "failures.jsonl")} == {"endpoint_error"}


def test_the_scripted_model_needs_no_network_and_no_key(tmp_path: Path) -> None:
    port = closed_port()
    proxy = {"HTTP_PROXY": f"http://127.0.0.1:{port}", "HTTPS_PROXY": f"http://127.0.0.1:{port}"}
    dataset = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "hello"}])
    result = trajkit(
        "run", "--dataset_file", str(dataset), "--run_name", "r", "--output_dir", str(tmp_path),
        "--model", "scripted", "--base_url", "http://127.0.0.1:1/v1", "--quiet",
        env=proxy,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


@contextmanager
def redirecting(target: str) -> Iterator[str]:
    """An aiohttp.web server answering every request with a 308 to ``target`` + the path after /v1."""
    from aiohttp import web

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPPermanentRedirect(target + request.path.removeprefix("/v1"))

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", redirect)
    ready: list[int] = []
    stopped = threading.Event()

    async def serve() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        ready.append(runner.addresses[0][1])
        while not stopped.is_set():
            await asyncio.sleep(0.05)
        await runner.cleanup()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    while not ready and thread.is_alive():
        stopped.wait(0.01)
    try:
        yield f"http://127.0.0.1:{ready[0]}/v1"
    finally:
        stopped.set()
        thread.join(5)


async def test_the_model_list_takes_tagged_variants_and_names_close_matches() -> None:
    server = OpenAITestServer(echo_policy, models={"llama3:latest", "vendor/model-large", "qwen:7b"})
    async with server.serving():
        for served in ("llama3", "llama3:latest", "vendor/model-large:free", "qwen:14b"):
            await check_endpoint(server.base_url, "k", served)
        with pytest.raises(ModelNotFound) as caught:
            await check_endpoint(server.base_url, "k", "vendor/model-larg")
    assert "not among the 3 models" in str(caught.value)
    assert "close: vendor/model-large" in str(caught.value)
