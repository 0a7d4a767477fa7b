"""An OpenAI-compatible chat completions server for tests and load benchmarks.

It runs on ``aiohttp.web``: the client side of trajkit speaks HTTP through aiohttp too, but the
two share no parsing code of trajkit's own, so neither can hide the other's misreading of HTTP.
Replies come from a *policy* callable, so a test decides exactly what the "model" says, and
*faults* inject the failures (rate limits, 5xx, hangs, dropped connections) that client retry
logic must survive.

Use it from synchronous tests (``with OpenAITestServer(policy) as srv: srv.base_url``), from
async code (``async with server.serving():``) or as a process for load tests::

    python -m trajkit.testing.openai_server --port 8000 --latency 1.0 --tool-calls 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib
import inspect
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from types import TracebackType
from typing import Any

from aiohttp import web

from trajkit.run.heap import settle_for_sessions
from trajkit.testing.openai_replies import (
    DROPPED,
    Body,
    Fault,
    FaultInjector,
    Latency,
    Policy,
    RecordedRequest,
    Reply,
    completion_response,
    dumps,
    echo_policy,
    error_response,
    fault_every,
    fault_fraction,
    loads,
    tool_script_policy,
)

__all__ = [
    "Body",
    "Fault",
    "FaultInjector",
    "Latency",
    "OpenAITestServer",
    "Policy",
    "RecordedRequest",
    "echo_policy",
    "fault_every",
    "fault_fraction",
    "main",
    "tool_script_policy",
]

COMPLETION_PATHS = frozenset({"/v1/chat/completions", "/chat/completions"})
MODELS_PATHS = frozenset({"/v1/models", "/models"})

_BACKLOG = 4096
_MAX_BODY = 256 << 20  # aiohttp.web's default (1 MiB) is shorter than a long agent conversation
_SHUTDOWN_GRACE = 0.1  # seconds in-flight handlers get at stop: hung requests must not stall it


def _web(reply: Reply) -> web.Response:
    return web.Response(
        status=reply.status, body=reply.body, headers=reply.headers, content_type="application/json"
    )


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop when installed (cheaper per connection), else the default loop."""
    try:
        import uvloop  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


class OpenAITestServer:
    """An OpenAI-compatible ``/v1/chat/completions`` endpoint whose answers come from ``policy``.

    ``models`` are the model names accepted and listed at ``/v1/models``; None accepts any model
    and, having no fixed list, answers ``/v1/models`` with 404 as endpoints without a list do.
    Counters and records are guarded by a lock because tests read them from another thread
    while the server's loop runs in the background.
    """

    def __init__(
        self,
        policy: Policy,
        *,
        latency: Latency = 0.0,
        faults: FaultInjector | None = None,
        api_key: str | None = None,
        models: Collection[str] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        keep_requests: bool = True,
    ) -> None:
        self._policy = policy
        self._keep_requests = keep_requests
        self._latency = latency
        self._faults = faults
        self._api_key = api_key
        self._models = frozenset(models) if models is not None else None
        self._host = host
        self._requested_port = port
        self._port: int | None = None
        self._lock = threading.Lock()
        self._records: list[RecordedRequest] = []
        self._next_number = 0
        self._count = 0
        self._in_flight = 0
        self._max_in_flight = 0
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._thread_loop: asyncio.AbstractEventLoop | None = None
        self._thread_stop: asyncio.Event | None = None

    @property
    def latency(self) -> Latency:
        """Seconds (or a function of the request body giving them) before each answer; a test may
        change it while the server runs, e.g. to let a resumed run finish quickly."""
        return self._latency

    @latency.setter
    def latency(self, value: Latency) -> None:
        self._latency = value

    # -- addresses -------------------------------------------------------------------------

    @property
    def host(self) -> str:
        return self._host

    @property
    def port(self) -> int:
        """The bound port (useful with ``port=0``); only known while serving."""
        if self._port is None:
            raise RuntimeError("server is not running")
        return self._port

    @property
    def base_url(self) -> str:
        """What to pass as the OpenAI client's ``base_url``."""
        host = "127.0.0.1" if self._host in ("", "0.0.0.0") else self._host
        host = "[::1]" if host == "::" else f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}/v1"

    # -- observability ---------------------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        """Snapshot of the completion requests received, in arrival order.

        Only bodies that parse as a JSON object are recorded (and numbered); others get a 400.
        Empty for a server made with ``keep_requests=False`` (the command line's load server).
        """
        with self._lock:
            return [dataclasses.replace(record) for record in self._records]

    @property
    def count(self) -> int:
        """Completion requests finished (answered with any status, or dropped by a fault)."""
        with self._lock:
            return self._count

    @property
    def in_flight(self) -> int:
        """Completion requests being processed right now."""
        with self._lock:
            return self._in_flight

    @property
    def max_in_flight(self) -> int:
        """Most completion requests processed at once since start or ``reset()``."""
        with self._lock:
            return self._max_in_flight

    def reset(self) -> None:
        """Forget records and counters between test phases (call while no request is in flight)."""
        with self._lock:
            self._records.clear()
            self._next_number = 0
            self._count = 0
            self._max_in_flight = self._in_flight

    def _begin(self, body: Body, headers: dict[str, str]) -> RecordedRequest:
        with self._lock:
            record = RecordedRequest(self._next_number, time.monotonic(), None, body, None, headers)
            self._next_number += 1
            if self._keep_requests:
                self._records.append(record)
            self._in_flight += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)
            return record

    def _finish(self, record: RecordedRequest, status: int) -> None:
        """Runs before the response is written, so a client that got its answer sees the counts."""
        with self._lock:
            record.time_answered = time.monotonic()
            record.status = status
            self._in_flight -= 1
            self._count += 1

    # -- lifecycle -------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[OpenAITestServer]:
        """Serve on the running event loop for the duration of the block."""
        await self._open()
        try:
            yield self
        finally:
            await self._close()

    def start(self, timeout: float = 10.0) -> OpenAITestServer:
        """Serve from a background daemon thread with its own event loop; returns once listening."""
        if self._thread is not None:
            raise RuntimeError("server already started")
        ready = threading.Event()
        errors: list[BaseException] = []
        self._thread = threading.Thread(
            target=self._thread_main, args=(ready, errors), name="openai-test-server", daemon=True
        )
        self._thread.start()
        if not ready.wait(timeout):
            raise RuntimeError("server did not start in time")
        if errors:
            self._thread.join()
            self._thread = None
            raise errors[0]
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the background thread, dropping every open connection."""
        thread, loop, stop = self._thread, self._thread_loop, self._thread_stop
        if thread is None:
            return
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                loop.call_soon_threadsafe(stop.set)
        thread.join(timeout)
        if thread.is_alive():
            raise RuntimeError("server thread did not stop in time")
        self._thread = self._thread_loop = self._thread_stop = None

    def __enter__(self) -> OpenAITestServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _thread_main(self, ready: threading.Event, errors: list[BaseException]) -> None:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(self._serve_until_stopped(ready, errors))

    async def _serve_until_stopped(self, ready: threading.Event, errors: list[BaseException]) -> None:
        try:
            await self._open()
        except BaseException as exc:
            errors.append(exc)
            ready.set()
            return
        self._thread_loop = asyncio.get_running_loop()
        self._thread_stop = asyncio.Event()
        ready.set()
        try:
            await self._thread_stop.wait()
        finally:
            await self._close()

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=_MAX_BODY)
        for path in COMPLETION_PATHS:
            app.router.add_post(path, self._handle_completion)
        for path in MODELS_PATHS:
            app.router.add_get(path, self._handle_models)
        app.router.add_route("*", "/{tail:.*}", self._handle_unknown)
        return app

    async def _open(self) -> None:
        if self._runner is not None:
            raise RuntimeError("server already running")
        # No access log: a load server answers thousands of requests a second.
        runner = web.AppRunner(
            self._app(), access_log=None, handle_signals=False, shutdown_timeout=_SHUTDOWN_GRACE
        )
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._requested_port, backlog=_BACKLOG, reuse_address=True)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self._port = runner.addresses[0][1]

    async def _close(self) -> None:
        """Stop accepting, close idle keep-alive connections, cancel handlers still running."""
        runner, self._runner = self._runner, None
        if runner is None:
            return
        await runner.cleanup()
        self._port = None

    # -- HTTP ------------------------------------------------------------------------------

    async def _handle_unknown(self, request: web.Request) -> web.Response:
        return _web(error_response(404, f"Invalid URL ({request.method} {request.path})"))

    async def _handle_models(self, request: web.Request) -> web.Response:
        if self._models is None:
            return await self._handle_unknown(request)
        rejection = self._check_auth(request.headers)
        if rejection is not None:
            return _web(rejection)
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": "trajkit"}
            for name in sorted(self._models)
        ]
        return _web(Reply(200, dumps({"object": "list", "data": data})))

    def _check_auth(self, headers: Mapping[str, str]) -> Reply | None:
        if self._api_key is None:
            return None
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and token.strip() == self._api_key:
            return None
        return error_response(401, "Incorrect API key provided.", code="invalid_api_key")

    async def _handle_completion(self, request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            body = loads(raw)
        except ValueError:
            return _web(error_response(400, "We could not parse the JSON body of your request."))
        if not isinstance(body, dict):
            return _web(error_response(400, "The request body must be a JSON object."))
        record = self._begin(body, {name.lower(): value for name, value in request.headers.items()})
        status = DROPPED
        try:
            response = await self._complete(record.number, body, request.headers, len(raw))
            if response is not None:
                status = response.status
        finally:
            self._finish(record, status)
        if response is None:
            # Dropped unanswered: aborting the transport makes aiohttp write nothing more.
            if request.transport is not None:
                request.transport.abort()
            return web.Response()
        return _web(response)

    async def _complete(self, number: int, body: Body, headers: Mapping[str, str], size: int) -> Reply | None:
        """The answer to one completion request; None means drop the connection without one."""
        rejection = self._reject(body, headers)
        if rejection is not None:
            return rejection
        fault = self._faults(number, body) if self._faults is not None else None
        extra_headers: dict[str, str] = {}
        if fault is not None:
            if fault.hang > 0:
                await asyncio.sleep(fault.hang)
            if fault.close or fault.status == 0:
                return None
            if fault.status >= 400:
                return error_response(fault.status, fault.message, headers=fault.headers)
            extra_headers = dict(fault.headers)
        delay = self._latency(body) if callable(self._latency) else self._latency
        if delay > 0:
            await asyncio.sleep(delay)
        response = await self._run_policy(body, size)
        response.headers = {**extra_headers, **response.headers}
        return response

    def _reject(self, body: Body, headers: Mapping[str, str]) -> Reply | None:
        """The checks the real API makes before generating: key, model, then what we cannot do."""
        unauthorized = self._check_auth(headers)
        if unauthorized is not None:
            return unauthorized
        model = body.get("model")
        if self._models is not None and model not in self._models:
            return error_response(404, f"The model `{model}` does not exist", code="model_not_found")
        if body.get("stream"):
            return error_response(400, "Streaming is not supported by this test server.", code="unsupported")
        return None

    async def _run_policy(self, body: Body, request_size: int) -> Reply:
        try:
            outcome = self._policy(body)
            reply: object = await outcome if inspect.isawaitable(outcome) else outcome
        except Exception as exc:  # a broken policy is a server error, not a dead connection
            return error_response(500, f"policy raised {type(exc).__name__}: {exc}")
        if not isinstance(reply, Mapping):
            return error_response(500, f"policy returned {type(reply).__name__}, expected a dict")
        return completion_response(reply, body, request_size)


# -- command line ----------------------------------------------------------------------------


def _load_policy(spec: str) -> Policy:
    """Resolve ``module:attribute`` (attribute may be dotted) to a policy callable."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"--policy must look like module:function, got {spec!r}")
    target: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"{spec} is not callable")
    policy: Policy = target
    return policy


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m trajkit.testing.openai_server", description="OpenAI-compatible test and load server."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port (see the READY line)")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds to wait before each answer")
    parser.add_argument("--policy", help="module:function answering each request (default: echo_policy)")
    parser.add_argument("--tool-calls", type=int, help="use tool_script_policy with this many tool calls")
    parser.add_argument("--tool", default="terminal", help="tool name for --tool-calls")
    parser.add_argument("--arguments", default='{"command": "true"}', help="JSON arguments for --tool-calls")
    parser.add_argument("--api-key", help="require this bearer token")
    parser.add_argument("--model", action="append", dest="models", help="accepted model name (repeatable)")
    parser.add_argument("--fault-fraction", type=float, default=0.0, help="fraction of requests to fail")
    parser.add_argument("--fault-status", type=int, default=500, help="status of injected faults")
    args = parser.parse_args(argv)
    if args.policy and args.tool_calls is not None:
        parser.error("--policy and --tool-calls are mutually exclusive")
    return args


def _server_from_args(args: argparse.Namespace) -> OpenAITestServer:
    if args.tool_calls is not None:
        policy = tool_script_policy(args.tool_calls, args.tool, args.arguments)
    elif args.policy:
        policy = _load_policy(args.policy)
    else:
        policy = echo_policy
    faults = (
        fault_fraction(args.fault_fraction, Fault(args.fault_status)) if args.fault_fraction > 0 else None
    )
    return OpenAITestServer(
        policy,
        latency=args.latency,
        faults=faults,
        api_key=args.api_key,
        models=args.models,
        host=args.host,
        port=args.port,
        # A load server answers millions of requests: kept, their bodies would grow the heap
        # without bound and make every full garbage collection slower than the last.
        keep_requests=False,
    )


def _raise_fd_limit() -> None:
    """Each client connection is a file descriptor; the default soft limit (often 1024) is too low."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on POSIX
        return
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def _serve_until_signal(server: OpenAITestServer) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with server.serving():
        # What exists now lives until exit, and the collector runs rarely: as in the processes that
        # run sessions, it took a third of this server's CPU under load.
        settle_for_sessions()
        print(f"READY {server.base_url}", flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    """Run the server until SIGTERM or SIGINT; prints ``READY <base_url>`` once listening."""
    args = _parse_args(argv)
    server = _server_from_args(args)
    _raise_fd_limit()
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(_serve_until_signal(server))
    return 0


if __name__ == "__main__":
    sys.exit(main())
