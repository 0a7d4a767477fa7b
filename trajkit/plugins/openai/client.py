"""The OpenAI-compatible model client (OpenRouter, OpenAI, vLLM, SGLang, Ollama, ...).

It posts the request as a plain dict and reads the raw JSON back: typed request and response
models cost more CPU per call than the rest of a turn, and the raw JSON keeps the reasoning
fields that each endpoint names differently. Two transports carry the request
(:mod:`trajkit.plugins.openai.transport`): aiohttp, the default, and the ``openai`` SDK's own
path; retries (tenacity, with the project's backoff policy), error mapping, rate limits and the
accounting are the same for both.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import orjson

from trajkit import hookimpl
from trajkit.config.run_config import RunConfig
from trajkit.model import (
    AssistantMessage,
    Message,
    ModelClient,
    ModelConfigError,
    ModelError,
    Usage,
    parse_assistant_message,
)
from trajkit.model.outage import ConnectionGuard
from trajkit.model.ratelimit import RequestLimiter, new_limiter
from trajkit.model.retry import REQUEST_BACKOFF, backoff_delay
from trajkit.plugins.openai.endpoint import (
    check_endpoint,
    host_of,
    public,
    validate_api_key,
    validate_base_url,
)
from trajkit.plugins.openai.settings import OpenAISettings
from trajkit.plugins.openai.transport import (
    AiohttpTransport,
    Retry,
    SDKTransport,
    Transport,
    answer_error,
)

if TYPE_CHECKING:
    import tenacity

log = logging.getLogger("trajkit")

KEY_VARIABLES = ("OPENROUTER_API_KEY", "OPENAI_API_KEY")


@hookimpl
def trajkit_model_clients() -> list[type[ModelClient]]:
    return [OpenAIClient]


def _loopback(base_url: str) -> bool:
    return (urlparse(base_url).hostname or "") in {"localhost", "127.0.0.1", "::1"}


def resolve_api_key(config: OpenAISettings) -> str:
    if config.api_key is not None:
        return config.api_key.get_secret_value()
    for variable in KEY_VARIABLES:
        if os.environ.get(variable):
            return os.environ[variable]
    if _loopback(config.base_url):
        return "not-needed"  # local servers (vLLM, Ollama) usually take any key
    raise ModelConfigError(
        f"no API key for {public(config.base_url)}: pass --api_key or set {' or '.join(KEY_VARIABLES)} "
        "(a run directory never keeps a key: a resume needs it again); "
        "for an offline run without a model endpoint use --model scripted"
    )


def request_extras(config: OpenAISettings) -> dict[str, Any]:
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


def make_transport(config: OpenAISettings, api_key: str, sessions: int) -> Transport:
    """``--transport``: ``aiohttp`` (default) or ``sdk``; ``builtin`` (the retired hand-written client) is
    taken as ``aiohttp`` with a warning, so existing commands and configuration files keep working."""
    transport = config.transport
    if transport == "builtin":
        log.warning("--transport builtin is retired: model requests go through aiohttp (--transport aiohttp)")
        transport = "aiohttp"
    transport_class = SDKTransport if transport == "sdk" else AiohttpTransport
    return transport_class(
        api_key,
        config.base_url,
        timeout=config.request_timeout,
        connections=(config.max_concurrent_requests or sessions) + 8,
    )


@dataclass(slots=True)
class _Request:
    """One model request across its retries."""

    body: dict[str, Any]
    estimate: int
    started: float = field(default_factory=time.monotonic)
    waited: float = 0.0
    """Seconds spent in the run's own waits (limiter, outage): not part of the retry budget."""
    probe: bool = False
    failed: Retry | None = None
    backed_off: int = 0
    """Waits chosen by the backoff policy so far (not those an answer's Retry-After named)."""
    """The first attempt's failure, handed to tenacity's loop."""


class OpenAIClient(ModelClient):
    """Retries, timeouts and rate limits are handled here, for the whole run, not by the SDK.

    Every retry is counted, the total time one request spends retrying is bounded (the run's own
    waits left out), ``Retry-After`` is honoured, and the shared limiter hears of every 429 so
    the whole run slows down when they persist.
    """

    name = "openai"
    key_variables = KEY_VARIABLES
    Settings = OpenAISettings
    takes_any_model = True
    takes_params = True
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
        self.guard = ConnectionGuard(host_of(transport.base_url), bound=retry_budget)
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
        self._retrying: Any = None
        """tenacity's loop, made at the first failure: most runs' first requests succeed, and
        importing it and building the loop cost a cold start about 7 ms before the first request."""

    @classmethod
    def from_config(cls, config: RunConfig) -> OpenAIClient:
        settings: OpenAISettings = config.settings_of(cls)
        validate_base_url(settings.base_url)
        api_key = resolve_api_key(settings)
        validate_api_key(api_key)
        prices = settings.prices.get(config.model)
        return cls(
            make_transport(settings, api_key, config.num_workers),
            config.model,
            request_extras(settings),
            limiter=new_limiter(settings.max_concurrent_requests, settings.max_rpm, settings.max_tpm),
            max_retries=settings.max_retries,
            retry_budget=settings.retry_budget,
            prices=(prices[0], prices[1]) if prices else None,
        )

    async def check(self) -> None:
        await check_endpoint(self.transport.base_url, self.transport.api_key, self.model)

    async def complete(
        self, messages: list[Message], tools: list[dict[str, Any]], params: Mapping[str, Any] | None = None
    ) -> AssistantMessage:
        body: dict[str, Any] = {"model": self.model, "messages": messages, **self.extras, **(params or {})}
        if tools:
            body["tools"] = tools
        request = _Request(body, _estimate_tokens(body) + int(body.get("max_tokens") or 0))
        try:
            # Most requests succeed at once: only then is tenacity's bookkeeping (about 40 us a
            # call, a tenth of the rest of a turn) left out.
            message = await self._attempt(request)
        except Retry as failure:
            request.failed = failure
            message = await self._retried(request)
        if self.limiter.max_tpm:
            self.limiter.record_tokens(
                message.usage.prompt_tokens + message.usage.completion_tokens - request.estimate
            )
        return message

    async def _retried(self, request: _Request) -> AssistantMessage:
        """The retries of a request whose first attempt failed (tenacity counts that one as its first)."""
        if self._retrying is None:
            import tenacity

            self._retrying = tenacity.AsyncRetrying(
                retry=tenacity.retry_if_exception_type(Retry),
                stop=self._stop,
                wait=self._next_wait,
                before_sleep=self._before_sleep,
                reraise=True,
            )
        retrying = self._retrying.copy()  # tenacity keeps per-call state on the object
        try:
            message: AssistantMessage = await retrying(self._again, request)
        except Retry as failure:
            self.counts["gave_up"] += 1
            attempts = retrying.statistics.get("attempt_number", 1)
            raise ModelError(f"{failure} (gave up after {attempts} attempts)") from None
        return message

    async def _again(self, request: _Request) -> AssistantMessage:
        if request.failed is not None:  # the first attempt, already made: its failure, again
            failed, request.failed = request.failed, None
            raise failed
        return await self._attempt(request)

    async def _attempt(self, request: _Request) -> AssistantMessage:
        request.probe, waited = await self.guard.admit()
        request.waited += waited
        self.counts["sent"] += 1
        request.waited += await self.limiter.acquire(request.estimate)
        try:
            raw = await self.transport.post(request.body)
        except Retry as retry:
            await self._failed(retry)
            raise
        except BaseException as exc:
            if isinstance(exc, ModelError):
                self.guard.answered()  # an answer, if an unwelcome one
            elif request.probe:
                self.guard.probe_over()
            await self.limiter.release(success=False)
            raise
        self.guard.answered()
        await self.limiter.release()
        try:
            return self._read(raw, request.body)
        except Retry as retry:
            self.counts[retry.kind] += 1
            raise

    async def _failed(self, retry: Retry) -> None:
        self.counts[retry.kind] += 1
        if retry.kind == "connection_error":
            self.guard.failed(str(retry).partition(": ")[2] or str(retry))
        else:
            self.guard.answered()
        if retry.kind == "rate_limited":
            await self.limiter.throttled(retry.retry_after)
        elif retry.kind == "disconnected" and self.counts["disconnected"] == 1:
            log.warning("%s (retried; every such case is counted as 'disconnected')", retry)
        await self.limiter.release(success=False)

    def _next_wait(self, state: tenacity.RetryCallState) -> float:
        failure = state.outcome.exception() if state.outcome else None
        if isinstance(failure, Retry):
            if failure.kind == "connection_error" and self.guard.down:
                return 0.0  # the guard spaces the probes and holds everyone else
            if failure.retry_after is not None:
                return failure.retry_after
        # The backoff doubles with the failures that named no wait of their own: a 429 that said
        # how long to wait is no reason to wait longer after the next, unrelated failure.
        request: _Request = state.args[0]
        request.backed_off += 1
        return backoff_delay(request.backed_off, *REQUEST_BACKOFF)

    def _stop(self, state: tenacity.RetryCallState) -> bool:
        failure = state.outcome.exception() if state.outcome else None
        if isinstance(failure, Retry) and failure.kind == "connection_error" and self.guard.down:
            return False  # the guard's bound decides, for every session at once
        request: _Request = state.args[0]
        spent = time.monotonic() - request.started - request.waited
        return state.attempt_number > self.max_retries or spent + state.upcoming_sleep > self.retry_budget

    def _before_sleep(self, state: tenacity.RetryCallState) -> None:
        self.counts["retries"] += 1

    def _read(self, raw: bytes, body: dict[str, Any]) -> AssistantMessage:
        """The assistant message of an answer, counted (usage, cost) before anything can reject it."""
        try:
            data = orjson.loads(raw)
        except ValueError:
            raise Retry("bad_response", f"the endpoint returned non-JSON: {raw[:200]!r}") from None
        if not isinstance(data, dict):
            raise Retry("bad_response", "the endpoint returned JSON that is not an object")
        choices = data.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
        wire = choice.get("message")
        message = parse_assistant_message(
            wire if isinstance(wire, dict) else {}, data.get("usage"), choice.get("finish_reason")
        )
        if isinstance(wire, dict) or data.get("usage"):
            self._count(message, body)  # answered: paid for, whatever becomes of it
        if data.get("error"):
            raise answer_error(data["error"])
        if not isinstance(wire, dict):
            raise Retry("empty_response", "the endpoint returned no choices")
        if not message.content and not message.tool_calls and not message.reasoning:
            raise Retry("empty_response", "the endpoint returned an empty message")
        return message

    def _count(self, message: AssistantMessage, body: dict[str, Any]) -> None:
        """Fill in usage the endpoint left out (estimated) and cost from ``prices``; add it up."""
        usage: Usage = message.usage
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
        self.answered()

    def statistics(self) -> dict[str, Any]:
        return {
            **dict(sorted(self.counts.items())),
            "requests": self.received,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cost": self.cost,
            "throttled": self.limiter.stats.throttled,
            "throttle_recovered": self.limiter.stats.recovered,
            "limiter_wait_s": round(self.limiter.stats.waited_s, 3),
            "outages": self.guard.outages,
        }

    def spent(self) -> float:
        return self.cost

    async def aclose(self) -> None:
        await self.transport.aclose()


def _estimate_tokens(body: dict[str, Any]) -> int:
    """About four characters a token: enough to pace a tokens-per-minute budget before the call."""
    return sum(len(str(m.get("content") or "")) for m in body["messages"]) // 4 + 1
