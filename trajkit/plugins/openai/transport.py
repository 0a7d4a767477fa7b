"""How a chat-completions request travels: aiohttp (the default) or the ``openai`` SDK's own path.

Both send the body as given and hand back the raw JSON answer; both turn every failure into the
same exceptions (:func:`status_error`, :class:`Retry`), so the client's retry loop and the run's
error classes do not depend on the transport.

What the aiohttp transport makes explicit, because a model call is paid for:

- a POST is never sent again by the HTTP library: aiohttp resends a request on a reused
  connection that turns out closed only for idempotent methods, and POST is not one. A
  connection that closes before the answer is a :class:`Retry` of kind ``disconnected``, counted
  apart, whose message says that the endpoint may have received (and billed) the request;
- idle pooled connections are dropped after :data:`IDLE_TIMEOUT`, before the servers commonly in
  front of model endpoints drop them, which is when a request would meet a closed connection;
- an answer is read up to :data:`MAX_ANSWER_BYTES`, counted after decompression;
- redirects are not followed: the POST would be sent somewhere the configuration did not name.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson

from trajkit.jsonutil import dumps_bytes
from trajkit.model import (
    ModelAuthError,
    ModelConfigError,
    ModelContextOverflow,
    ModelError,
    ModelNotFound,
)
from trajkit.plugins.openai.endpoint import (
    CONNECT_TIMEOUT,
    client_session,
    close_session,
    connect_failure,
    env_proxy,
    redirect_error,
    retry_after,
)

if TYPE_CHECKING:
    import aiohttp
    import openai

IDLE_TIMEOUT = 4.0
"""Seconds an idle pooled connection is kept: under uvicorn's 5 s default (vLLM, SGLang serve
through it) and far under what proxies and hosted APIs keep."""
MAX_ANSWER_BYTES = 64 << 20
"""The longest answer read, after decompression: far above any chat completion, far below memory."""
RETRYABLE_STATUS = frozenset({408, 409, 425, 429})
OVERFLOW_CODES = frozenset({"context_length_exceeded", "exceed_context_size_error"})
"""Error codes of a conversation longer than the model's context (OpenAI's; llama.cpp's server's)."""
OVERFLOW_WORDS = re.compile(
    r"maximum context length|context length exceeded|exceeds? the available context"
    r"|(?:longer than|exceeds?|too large for).{0,40}(?:context|maximum model length)"
    r"|prompt is too long|tokens \+ `?max_new_tokens`? must be",
    re.IGNORECASE,
)
"""How endpoints without the code word it: OpenAI, OpenRouter, DeepSeek, vLLM, SGLang, llama.cpp,
text-generation-inference, Anthropic's and Mistral's compatible APIs."""


class Retry(Exception):
    """A failure worth another try of the same request; ``kind`` names it in the statistics."""

    def __init__(self, kind: str, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.retry_after = retry_after


class Transport(ABC):
    """Sends one chat-completions body and returns the raw JSON answer."""

    max_answer = MAX_ANSWER_BYTES

    def __init__(self, api_key: str, base_url: str, *, timeout: float, connections: int) -> None:
        self.api_key = api_key
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.connections = connections

    @property
    def url(self) -> str:
        return f"{self.base_url}/chat/completions"

    @abstractmethod
    async def post(self, body: dict[str, Any]) -> bytes: ...

    @abstractmethod
    async def aclose(self) -> None: ...


class AiohttpTransport(Transport):
    """aiohttp (``--transport aiohttp``, the default). The session is made on first use, in the run's loop."""

    session: aiohttp.ClientSession | None = None
    proxy: Mapping[str, Any] = {}
    _url: Any = None

    async def post(self, body: dict[str, Any]) -> bytes:
        import aiohttp

        if self.session is None:
            from yarl import URL

            self.proxy = env_proxy(self.url)
            self.session = client_session(self.api_key, connections=self.connections, timeout=self.timeout)
            self._url = URL(self.url)  # parsed once, not on every request
        try:
            async with self.session.post(
                self._url, data=dumps_bytes(body), allow_redirects=False, **self.proxy
            ) as response:
                raw = await read_limited(response, self.max_answer)
                if response.status >= 300:
                    message, code = error_fields(raw)
                    raise status_error(response.status, message, response.headers, self.url, code=code)
                return raw
        except aiohttp.ConnectionTimeoutError:
            reason = f"no connection within {min(self.timeout, CONNECT_TIMEOUT):g}s"
            raise Retry("connection_error", connect_failure(self.url, reason)) from None
        except TimeoutError:
            raise Retry("timeout", f"no answer within {self.timeout:g}s") from None
        except aiohttp.ClientConnectorError as exc:
            raise Retry("connection_error", connect_failure(self.url, exc)) from None
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            raise Retry("disconnected", disconnected(exc)) from None
        except aiohttp.ClientError as exc:
            raise Retry("bad_response", f"{type(exc).__name__}: {exc}") from None

    async def aclose(self) -> None:
        if self.session is not None:
            await close_session(self.session)


def disconnected(exc: BaseException) -> str:
    return (
        f"the connection closed before the answer ({type(exc).__name__}: {exc}); the endpoint may"
        " have received the request, so sending it again may be paid for twice"
    )


async def read_limited(response: aiohttp.ClientResponse, limit: int = MAX_ANSWER_BYTES) -> bytes:
    """The answer's body, refusing one longer than ``limit`` bytes once decompressed."""
    length = response.content_length
    if length is not None and length <= limit and "Content-Encoding" not in response.headers:
        return await response.read()  # the common case: the length is known and is what arrives
    if length is not None and "Content-Encoding" not in response.headers:
        raise too_long(limit)
    chunks = []
    size = 0
    async for chunk in response.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > limit:
            response.close()
            raise too_long(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def too_long(limit: int) -> ModelError:
    return ModelError(f"the endpoint's answer is longer than {limit >> 20} MiB; not read")


class SDKTransport(Transport):
    """The ``openai`` SDK's own request path (``--transport sdk``), with its retries and redirects off."""

    client: openai.AsyncOpenAI | None = None

    async def post(self, body: dict[str, Any]) -> bytes:
        import openai

        if self.client is None:
            self.client = self._client()
        try:
            return await self.client.post("/chat/completions", cast_to=bytes, body=body)
        except openai.APIStatusError as exc:
            message, code = sdk_error(exc)
            raise status_error(exc.status_code, message, exc.response.headers, self.url, code=code) from None
        except openai.APIConnectionError as exc:  # a timeout is one too: tell them apart by the cause
            cause = _os_error(exc)
            if cause is not None:
                raise Retry("connection_error", connect_failure(self.url, cause)) from None
            if isinstance(exc, openai.APITimeoutError):
                raise Retry("timeout", f"no answer within {self.timeout:g}s") from None
            raise Retry("disconnected", disconnected(exc)) from None

    def _client(self) -> openai.AsyncOpenAI:
        import openai

        try:
            import httpx2 as httpx  # the SDK's HTTP layer in openai 3.x
        except ImportError:  # pragma: no cover - older SDKs
            import httpx  # type: ignore[no-redef]
        # The SDK's default pool holds 100 connections: far fewer than the sessions in flight.
        limits = httpx.Limits(
            max_connections=self.connections,
            max_keepalive_connections=self.connections,
            keepalive_expiry=IDLE_TIMEOUT,
        )
        return openai.AsyncOpenAI(
            api_key=self.api_key,
            base_url=self.base_url,
            timeout=self.timeout,
            max_retries=0,
            http_client=openai.DefaultAioHttpClient(
                timeout=self.timeout, limits=limits, follow_redirects=False
            ),
        )

    async def aclose(self) -> None:
        if self.client is not None:
            await self.client.close()


def _os_error(exc: BaseException) -> OSError | None:
    """The refused, unreachable or unresolvable connection under an SDK error, if that is what it was."""
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 10:
        if isinstance(current, OSError) and not isinstance(current, TimeoutError):
            return current
        current = current.__cause__ or current.__context__
        seen += 1
    return None


def status_error(
    status: int, message: str, headers: Mapping[str, str], url: str, *, code: str | None = None
) -> Exception:
    """What an answer's status means for the run: retry, fail the session (for good, when the
    conversation outgrew the model's context), or stop the run."""
    if 300 <= status < 400:
        return redirect_error(status, headers.get("Location"), url)
    if status in (401, 403):
        return ModelAuthError(f"the endpoint refused the credentials ({status}): {message}")
    if status == 404:
        return ModelNotFound(f"{status} from the endpoint: {message}")
    if status in RETRYABLE_STATUS or status >= 500:
        kind = "rate_limited" if status == 429 else "server_error"
        return Retry(kind, f"{status}: {message}", retry_after(headers))
    if context_overflow(message, code):
        return ModelContextOverflow(
            f"the conversation is longer than the model's context ({status}): {message}"
        )
    return ModelConfigError(f"{status} from the endpoint: {message}")


def answer_error(error: Any) -> Exception:
    """An error inside an answer of status 200 (some routers send a provider's failure so): an
    overflow is final, anything else is worth another try."""
    message = describe_error(error)
    if context_overflow(message, error_code(error)):
        return ModelContextOverflow(f"the conversation is longer than the model's context: {message}")
    return Retry("server_error", f"the endpoint returned an error: {message}")


def context_overflow(message: str, code: str | None) -> bool:
    """Whether an endpoint's error says the conversation does not fit the model's context."""
    return code in OVERFLOW_CODES or OVERFLOW_WORDS.search(message) is not None


def error_fields(raw: bytes) -> tuple[str, str | None]:
    """An error answer's message and code (OpenAI's ``{"error": {"message", "code"}}`` or a bare object)."""
    try:
        data = orjson.loads(raw)
    except ValueError:
        return raw[:500].decode("utf-8", "replace"), None
    if not isinstance(data, dict):
        return str(data)[:500], None
    error = data.get("error", data)
    return describe_error(error), error_code(error)


def error_text(raw: bytes) -> str:
    return error_fields(raw)[0]


def error_code(error: Any) -> str | None:
    """An error object's code, else its type (llama.cpp's server names the case in ``type``)."""
    if not isinstance(error, dict):
        return None
    code = next((error[key] for key in ("code", "type") if isinstance(error.get(key), str)), None)
    return str(code) if code is not None else None


def describe_error(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error)[:500]
    return str(error)[:500]


def sdk_error(exc: openai.APIStatusError) -> tuple[str, str | None]:
    """The SDK's error's message and code (it has unwrapped OpenAI's ``error`` object already)."""
    body = exc.body
    if isinstance(body, dict):
        error = body.get("error", body)
        return describe_error(error), error_code(error)
    return str(exc.message)[:500], None
