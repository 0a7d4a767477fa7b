"""The OpenAI-compatible model client (OpenRouter, OpenAI, vLLM, SGLang, Ollama, ...).

It posts the request as a plain dict and reads the raw JSON back: typed request and response
models cost more CPU per call than the rest of a turn, and the raw JSON keeps the reasoning
fields that each endpoint names differently. Three transports carry the request: trajkit's own
HTTP/1.1 client (the default, the least CPU per request), a bare aiohttp session, and the
``openai`` SDK's own request path; retries and error mapping are the same for all three.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import os
import random
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import orjson

from trajkit import __version__, hookimpl
from trajkit.config import RunConfig
from trajkit.jsonutil import dumps_bytes
from trajkit.model import (
    AssistantMessage,
    Message,
    ModelAuthError,
    ModelClient,
    ModelConfigError,
    ModelError,
    ModelNotFound,
    parse_assistant_message,
)
from trajkit.plugins.http_client import ConnectionPool, HTTPError
from trajkit.ratelimit import RequestLimiter

if TYPE_CHECKING:
    import aiohttp
    import openai

log = logging.getLogger("trajkit")

KEY_VARIABLES = ("OPENROUTER_API_KEY", "OPENAI_API_KEY")


@hookimpl
def trajkit_model_clients() -> list[type[ModelClient]]:
    return [OpenAIClient]


def _loopback(base_url: str) -> bool:
    return (urlparse(base_url).hostname or "") in {"localhost", "127.0.0.1", "::1"}


def resolve_api_key(config: RunConfig) -> str:
    if config.api_key is not None:
        return config.api_key.get_secret_value()
    for variable in KEY_VARIABLES:
        if os.environ.get(variable):
            return os.environ[variable]
    if _loopback(config.base_url):
        return "not-needed"  # local servers (vLLM, Ollama) usually take any key
    raise ModelConfigError(
        f"no API key for {config.base_url}: pass --api_key or set {' or '.join(KEY_VARIABLES)}; "
        "for an offline run without a model endpoint use --model scripted"
    )


def request_extras(config: RunConfig) -> dict[str, Any]:
    """Body fields beyond model/messages/tools: sampling limits, reasoning, provider routing."""
    openrouter = "openrouter.ai" in config.base_url
    extras: dict[str, Any] = {}
    if config.max_tokens is not None:
        extras["max_tokens"] = config.max_tokens
    if config.temperature is not None:
        extras["temperature"] = config.temperature
    if config.reasoning_disabled:
        extras["reasoning" if openrouter else "reasoning_effort"] = (
            {"enabled": False} if openrouter else "none"
        )
    elif config.reasoning_effort is not None:
        if openrouter:
            extras["reasoning"] = {"effort": config.reasoning_effort}
        else:
            extras["reasoning_effort"] = config.reasoning_effort
    provider: dict[str, Any] = {}
    if config.providers_allowed:
        provider["only"] = config.providers_allowed
    if config.providers_ignored:
        provider["ignore"] = config.providers_ignored
    if config.providers_order:
        provider["order"] = config.providers_order
    if config.provider_sort:
        provider["sort"] = config.provider_sort
    if provider:
        extras["provider"] = provider
    if openrouter:
        extras["usage"] = {"include": True}  # OpenRouter then reports the cost of each call
    return extras


RETRYABLE_STATUS = {408, 409, 425, 429}


class OpenAIClient(ModelClient):
    """Retries, timeouts and rate limits are handled here, for the whole run, not by the SDK.

    The SDK's own retries are off: this loop counts every retry, bounds the total time spent
    retrying one request, honours ``Retry-After`` and tells the shared limiter about 429s so the
    whole run slows down instead of each session hammering the endpoint on its own.
    """

    name = "openai"
    description = "any OpenAI-compatible chat completions endpoint (--base_url, --model SLUG)"

    def __init__(
        self,
        transport: Transport,
        model: str,
        extras: dict[str, Any],
        *,
        limiter: RequestLimiter | None = None,
        max_retries: int = 4,
        retry_budget: float = 600.0,
        prices: tuple[float, float] | None = None,
    ) -> None:
        self.transport = transport
        self.model = model
        self.extras = extras
        self.limiter = limiter or RequestLimiter()
        self.max_retries = max_retries
        self.retry_budget = retry_budget
        self.prices = prices
        self.counts: Counter[str] = Counter()
        # Every answer's usage and cost, counted as it arrives: a session that fails later has
        # been paid for all the same, and --max_cost holds the run to what was really spent.
        self.received = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cost = 0.0

    @classmethod
    def from_config(cls, config: RunConfig) -> OpenAIClient:
        transport_class: Callable[..., Transport] = {
            "builtin": BuiltinTransport,
            "aiohttp": AiohttpTransport,
            "sdk": SDKTransport,
        }[config.transport]
        proxy = _proxy_for(config.base_url)
        if transport_class is BuiltinTransport and proxy:
            host = urlparse(config.base_url).hostname  # never the whole URL: it may hold credentials
            log.info("%s is set for %s: model requests go through aiohttp, which uses it", proxy, host)
            transport_class = AiohttpTransport
        transport = transport_class(
            resolve_api_key(config),
            config.base_url,
            timeout=config.request_timeout,
            connections=(config.max_concurrent_requests or config.num_workers) + 8,
        )
        limiter = RequestLimiter(config.max_concurrent_requests, config.max_rpm, config.max_tpm)
        prices = config.prices.get(config.model)
        return cls(
            transport,
            config.model,
            request_extras(config),
            limiter=limiter,
            max_retries=config.max_retries,
            retry_budget=config.retry_budget,
            prices=(prices[0], prices[1]) if prices else None,
        )

    async def complete(self, messages: list[Message], tools: list[dict[str, Any]]) -> AssistantMessage:
        body: dict[str, Any] = {"model": self.model, "messages": messages, **self.extras}
        if tools:
            body["tools"] = tools
        estimate = _estimate_tokens(body) + int(self.extras.get("max_tokens") or 0)
        deadline = time.monotonic() + self.retry_budget
        for attempt in range(self.max_retries + 1):
            self.counts["sent"] += 1
            await self.limiter.acquire(estimate)
            try:
                message = await self._once(body)
            except _Retry as retry:
                await self.limiter.release(success=False)
                self.counts[retry.kind] += 1
                if retry.retry_after is not None and retry.kind == "rate_limited":
                    await self.limiter.throttled(retry.retry_after)
                delay = retry.retry_after if retry.retry_after is not None else _backoff(attempt)
                if attempt == self.max_retries or time.monotonic() + delay > deadline:
                    self.counts["gave_up"] += 1
                    raise ModelError(f"{retry} (gave up after {attempt + 1} attempts)") from None
                self.counts["retries"] += 1
                await asyncio.sleep(delay)
                continue
            except BaseException:
                await self.limiter.release(success=False)
                raise
            await self.limiter.release()
            if self.limiter.max_tpm:
                self.limiter.record_tokens(
                    message.usage.prompt_tokens + message.usage.completion_tokens - estimate
                )
            return message
        raise AssertionError("unreachable")

    async def _once(self, body: dict[str, Any]) -> AssistantMessage:
        message = self._parse(await self.transport.post(body), body)
        if not message.content and not message.tool_calls and not message.reasoning:
            raise _Retry("empty_response", "the endpoint returned an empty message", None)
        return message

    def _priced(self, message: AssistantMessage, body: dict[str, Any]) -> AssistantMessage:
        """Fill in usage the endpoint left out (estimated) and cost from ``prices``; count it."""
        usage = message.usage
        if not usage.prompt_tokens and not usage.completion_tokens:
            self.counts["usage_estimated"] += 1  # the endpoint sent no usage: estimate it
            usage.prompt_tokens = _estimate_tokens(body)
            usage.completion_tokens = (
                len(message.content or "") // 4 + sum(len(c.arguments) for c in message.tool_calls) // 4
            )
        if usage.cost is None and self.prices:
            usage.cost = (
                usage.prompt_tokens * self.prices[0] + usage.completion_tokens * self.prices[1]
            ) / 1e6
        if message.finish_reason == "length":
            self.counts["truncated"] += 1
        self.received += 1
        self.prompt_tokens += usage.prompt_tokens
        self.completion_tokens += usage.completion_tokens
        self.cost += usage.cost or 0.0
        return message

    def _parse(self, raw: bytes, body: dict[str, Any]) -> AssistantMessage:
        try:
            data = orjson.loads(raw)
        except ValueError:
            raise _Retry("bad_response", f"the endpoint returned non-JSON: {raw[:200]!r}", None) from None
        if not isinstance(data, dict):
            raise _Retry("bad_response", "the endpoint returned JSON that is not an object", None)
        if data.get("usage") and not _has_message(data):
            # Answered and billed, but unusable (an error or no choices): paid for all the same.
            self._priced(parse_assistant_message({}, data["usage"]), body)
        if data.get("error"):
            raise _Retry(
                "server_error", f"the endpoint returned an error: {_describe_error(data['error'])}", None
            )
        choices = data.get("choices") or []
        if not choices or not isinstance(choices[0].get("message"), dict):
            raise _Retry("empty_response", "the endpoint returned no choices", None)
        choice = choices[0]
        message = parse_assistant_message(choice["message"], data.get("usage"), choice.get("finish_reason"))
        return self._priced(message, body)  # counted now, even if it turns out empty

    def statistics(self) -> dict[str, Any]:
        return {
            **dict(sorted(self.counts.items())),
            "requests": self.received,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cost": self.cost,
            "throttled": self.limiter.stats.throttled,
            "limiter_wait_s": round(self.limiter.stats.waited_s, 3),
        }

    def spent(self) -> float:
        return self.cost

    async def aclose(self) -> None:
        await self.transport.aclose()


class Transport(ABC):
    """Sends one chat-completions body and returns the raw JSON answer.

    A non-2xx answer goes through :func:`_status_error`, so both transports fail the same way.
    """

    def __init__(self, api_key: str, base_url: str, *, timeout: float, connections: int) -> None:
        self.api_key = api_key
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.connections = connections

    @abstractmethod
    async def post(self, body: dict[str, Any]) -> bytes: ...

    @abstractmethod
    async def aclose(self) -> None: ...


class BuiltinTransport(Transport):
    """trajkit's own keep-alive HTTP/1.1 client (:mod:`trajkit.plugins.http_client`).

    At hundreds of sessions in flight the client's CPU per request bounds the whole run's
    throughput, and this one spends a fraction of aiohttp's (BENCHMARKS.md), so it is the default.
    It connects directly: when a proxy variable applies to the endpoint, the run uses
    :class:`AiohttpTransport` instead.
    """

    pool: ConnectionPool | None = None

    async def post(self, body: dict[str, Any]) -> bytes:
        if self.pool is None:
            self.pool = ConnectionPool(
                self.base_url,
                {"Authorization": f"Bearer {self.api_key}", "User-Agent": f"trajkit/{__version__}"},
                limit=self.connections,
            )
        try:
            response = await self.pool.post("/chat/completions", dumps_bytes(body), timeout=self.timeout)
        except TimeoutError:
            raise _Retry("timeout", "the request timed out", None) from None
        except HTTPError as exc:
            raise _Retry("connection_error", f"connection failed: {exc}", None) from None
        if response.status >= 400:
            raise _status_error(response.status, _error_text(response.body), response.headers)
        return response.body

    async def aclose(self) -> None:
        if self.pool is not None:
            await self.pool.close()


class AiohttpTransport(Transport):
    """A bare aiohttp session (``--transport aiohttp``, and the default behind an HTTP proxy).

    It honours ``HTTP_PROXY``/``HTTPS_PROXY``/``NO_PROXY``. The session is made on first use,
    inside the run's loop.
    """

    session: aiohttp.ClientSession | None = None

    async def post(self, body: dict[str, Any]) -> bytes:
        import aiohttp

        if self.session is None:
            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.connections),
                cookie_jar=aiohttp.DummyCookieJar(),  # an API needs no cookies; the jar costs CPU per request
                trust_env=True,  # proxies from the environment
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                headers={
                    "Authorization": f"Bearer {self.api_key}",
                    "Content-Type": "application/json",
                    "User-Agent": f"trajkit/{__version__}",
                },
            )
        try:
            async with self.session.post(
                f"{self.base_url}/chat/completions", data=dumps_bytes(body)
            ) as response:
                raw = await response.read()
                if response.status >= 400:
                    raise _status_error(response.status, _error_text(raw), response.headers)
                return raw
        except TimeoutError:
            raise _Retry("timeout", "the request timed out", None) from None
        except aiohttp.ClientError as exc:
            raise _Retry(
                "connection_error", f"connection failed: {type(exc).__name__}: {exc}", None
            ) from None

    async def aclose(self) -> None:
        if self.session is not None:
            await self.session.close()


class SDKTransport(Transport):
    """The ``openai`` SDK's own request path (``--transport sdk``), with its retries turned off."""

    client: openai.AsyncOpenAI | None = None

    async def post(self, body: dict[str, Any]) -> bytes:
        import openai

        if self.client is None:
            try:
                import httpx2 as httpx  # the SDK's HTTP layer in openai 3.x
            except ImportError:  # pragma: no cover - older SDKs
                import httpx  # type: ignore[no-redef]
            # The SDK's default pool holds 100 connections: far fewer than the sessions in flight.
            limits = httpx.Limits(
                max_connections=self.connections, max_keepalive_connections=self.connections
            )
            self.client = openai.AsyncOpenAI(
                api_key=self.api_key,
                base_url=self.base_url,
                timeout=self.timeout,
                max_retries=0,
                http_client=openai.DefaultAioHttpClient(timeout=self.timeout, limits=limits),
            )
        try:
            return await self.client.post("/chat/completions", cast_to=bytes, body=body)
        except openai.APIStatusError as exc:
            raise _status_error(exc.status_code, _message(exc), exc.response.headers) from None
        except openai.APITimeoutError:
            raise _Retry("timeout", "the request timed out", None) from None
        except openai.APIConnectionError as exc:
            raise _Retry("connection_error", f"connection failed: {exc}", None) from None

    async def aclose(self) -> None:
        if self.client is not None:
            await self.client.close()


def _proxy_for(base_url: str) -> str | None:
    """The name of the proxy variable that applies to ``base_url``, if one does (as aiohttp reads them)."""
    import urllib.request  # when a client is made, not when the plugin is loaded

    url = urlparse(base_url)
    if url.scheme not in urllib.request.getproxies_environment() or urllib.request.proxy_bypass(
        url.hostname or ""
    ):
        return None
    return f"{url.scheme.upper()}_PROXY"


def _status_error(status: int, message: str, headers: Mapping[str, str]) -> Exception:
    """What an error status means for the run: retry, fail the session, or stop the run."""
    if status in (401, 403):
        return ModelAuthError(f"the endpoint refused the credentials ({status}): {message}")
    if status == 404:
        return ModelNotFound(f"{status} from the endpoint: {message}")
    if status in RETRYABLE_STATUS or status >= 500:
        kind = "rate_limited" if status == 429 else "server_error"
        return _Retry(kind, f"{status}: {message}", _retry_after(headers))
    return ModelConfigError(f"{status} from the endpoint: {message}")


def _error_text(raw: bytes) -> str:
    try:
        data = json.loads(raw)
    except ValueError:
        return raw[:500].decode("utf-8", "replace")
    return _describe_error(data.get("error", data)) if isinstance(data, dict) else str(data)[:500]


class _Retry(Exception):
    def __init__(self, kind: str, message: str, retry_after: float | None) -> None:
        super().__init__(message)
        self.kind = kind
        self.retry_after = retry_after


def _backoff(attempt: int) -> float:
    """Exponential backoff with full jitter: 0.5 s, 1 s, 2 s ... capped at 30 s."""
    return random.uniform(0, min(30.0, 0.5 * 2**attempt)) + 0.1


def _retry_after(headers: Mapping[str, str]) -> float | None:
    try:
        if "retry-after-ms" in headers:
            return float(headers["retry-after-ms"]) / 1000
        if "retry-after" in headers:
            value = headers["retry-after"]
            try:
                return float(value)
            except ValueError:
                when = email.utils.parsedate_to_datetime(value)
                return max(0.0, when.timestamp() - time.time())
    except (ValueError, TypeError):
        return None
    return None


def _estimate_tokens(body: dict[str, Any]) -> int:
    """About four characters a token: enough to pace a tokens-per-minute budget before the call."""
    return sum(len(str(m.get("content") or "")) for m in body["messages"]) // 4 + 1


def _has_message(data: dict[str, Any]) -> bool:
    choices = data.get("choices")
    return bool(choices) and isinstance(choices, list) and isinstance(choices[0], dict) and isinstance(
        choices[0].get("message"), dict
    )


def _describe_error(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error)[:500]
    return str(error)[:500]


def _message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        return _describe_error(body.get("error", body))
    return str(exc.message)[:500]
