"""The HTTP client of the tools that reach the network: aiohttp under a :class:`NetworkPolicy`.

One :class:`Fetcher` serves a run (its connections are pooled across sessions). Each fetch is
bounded: a time limit over the whole exchange (redirects and the body included), a size limit
enforced while the body streams in (a body is never held beyond it), a cap on redirects with the
policy checked again on every one, a content-type check before the body is read, and a limit on
connections per host. No cookies are kept (sessions would otherwise share them), no proxy from
the environment is used (the policy judges the address the connection really goes to), and the
user agent names trajkit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit

from trajkit import __version__
from trajkit.tools.network import GuardedResolver, NetworkPolicy, Refused, public

if TYPE_CHECKING:
    import aiohttp
    from aiohttp.abc import AbstractResolver

USER_AGENT = f"trajkit/{__version__} (agent tools; +https://pypi.org/project/trajkit/)"
REDIRECTS = frozenset({301, 302, 303, 307, 308})


class FetchError(Exception):
    """A fetch failed (refused, unreachable, too slow, too large, wrong kind); the message names
    the URL without its query and never a header, so it can go back to the model as it is."""


@dataclass(frozen=True)
class Limits:
    max_bytes: int = 10 << 20
    """Most bytes of one body (after decompression)."""
    timeout: float = 30.0
    """Seconds one fetch may take, from the first connection to the body's last byte."""
    max_redirects: int = 5
    """Redirects followed; 0 makes a redirect an error (an API endpoint is not sent elsewhere)."""
    connections_per_host: int = 4
    """Connections open to one host at once; further requests wait their turn."""


@dataclass(frozen=True)
class Response:
    url: str
    """The final URL, after redirects."""
    status: int
    content_type: str
    """The media type, lower case, without parameters ("" when the answer names none)."""
    charset: str | None
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)

    def excerpt(self, limit: int = 300) -> str:
        """The start of the body as one line of text, for error messages."""
        text = " ".join(self.body[: limit * 4].decode("utf-8", "replace").split())
        return text[:limit] or "(no body)"


Accept = Callable[[str], bool]
"""Whether a media type is one the caller can use; checked before the body is read."""


class Fetcher:
    """HTTP requests under one policy and one set of limits; open it inside the event loop that
    uses it (``async with`` or :meth:`aclose`)."""

    def __init__(
        self,
        policy: NetworkPolicy,
        limits: Limits = Limits(),
        *,
        headers: Mapping[str, str] | None = None,
        resolver: AbstractResolver | None = None,
    ) -> None:
        self.policy = policy
        self.limits = limits
        self.headers = {"User-Agent": USER_AGENT, **(headers or {})}
        self.resolver = resolver
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            import aiohttp

            resolver: Any = (
                GuardedResolver(self.policy, self.resolver) if self.policy.guard else self.resolver
            )
            connector = aiohttp.TCPConnector(
                resolver=resolver, limit=0, limit_per_host=self.limits.connections_per_host, ttl_dns_cache=30
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),
                trust_env=False,
                headers=self.headers,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=min(self.limits.timeout, 15.0)),
            )
        return self._session

    async def __aenter__(self) -> Fetcher:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def fetch(
        self,
        url: str,
        *,
        method: str = "GET",
        json: Any = None,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        accept: Accept | None = None,
        max_bytes: int | None = None,
    ) -> Response:
        """The answer to ``method url``, redirects followed under the policy; :class:`FetchError`
        when the policy refuses a hop, the limits are exceeded or the answer cannot be read.

        A status of 400 or more is returned, not raised: the caller says what it means.
        """
        trail = [url]
        try:
            async with asyncio.timeout(self.limits.timeout):
                return await self._follow(trail, method, json, params, headers, accept, max_bytes)
        except TimeoutError:
            raise FetchError(f"{public(url)}: no complete answer within {self.limits.timeout:g}s") from None
        except Refused as exc:
            hop = f" redirected to {public(trail[-1])}, which is" if len(trail) > 1 else ""
            raise FetchError(f"{public(url)}{hop} refused: {exc}") from None
        except FetchError:
            raise
        except Exception as exc:  # aiohttp's errors, and a URL it cannot parse
            raise FetchError(f"{public(trail[-1])}: {_describe(exc)}") from None

    async def _follow(
        self,
        trail: list[str],
        method: str,
        json: Any,
        params: Mapping[str, str] | None,
        headers: Mapping[str, str] | None,
        accept: Accept | None,
        max_bytes: int | None,
    ) -> Response:
        """Fetch ``trail[-1]``, appending each redirect's target to ``trail``."""
        session = self._client()
        for hop in range(self.limits.max_redirects + 1):
            url = trail[-1]
            self._check(url)
            async with session.request(
                method, url, json=json, params=params, headers=headers, allow_redirects=False
            ) as response:
                location = response.headers.get("Location")
                if response.status in REDIRECTS and location:
                    if hop == self.limits.max_redirects:
                        raise FetchError(_too_many(url, response.status, self.limits.max_redirects))
                    trail.append(urljoin(str(response.url), location))
                    params = None  # the new location is complete
                    if response.status == 303 or (response.status in (301, 302) and method == "POST"):
                        method, json = "GET", None
                    continue
                kind = response.content_type.lower() if "Content-Type" in response.headers else ""
                if accept is not None and response.status < 400 and not accept(kind):
                    raise FetchError(f"{public(url)}: its content type is {kind or 'not given'}")
                body = await _read(response, self.limits.max_bytes if max_bytes is None else max_bytes, url)
                return Response(
                    str(response.url), response.status, kind, response.charset, body, response.headers
                )
        raise AssertionError("unreachable")

    def check(self, url: str) -> None:
        """:class:`FetchError` when ``url`` is no http(s) URL or names an address the policy
        refuses (a name's addresses are checked when it is fetched)."""
        try:
            self._check(url)
        except Refused as exc:
            raise FetchError(f"{public(url)} refused: {exc}") from None

    def _check(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise FetchError(f"{public(url)}: only http and https URLs can be fetched")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise FetchError(f"{public(url)}: the port is not a number") from None
        if not parts.hostname:
            raise FetchError(f"{public(url)}: the URL names no host")
        self.policy.check_host(parts.hostname, port)


def _too_many(url: str, status: int, limit: int) -> str:
    if limit == 0:
        return f"{public(url)} answered {status}, a redirect; it is not followed"
    return f"{public(url)}: more than {limit} redirects"


async def _read(response: aiohttp.ClientResponse, limit: int, url: str) -> bytes:
    """The body, refused as soon as it passes ``limit`` bytes: a large body is never held."""
    declared = response.content_length
    if declared is not None and declared > limit and "Content-Encoding" not in response.headers:
        raise FetchError(f"{public(url)}: the body is {declared} bytes, more than the {limit} allowed")
    chunks, size = [], 0
    async for chunk in response.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > limit:
            response.close()
            raise FetchError(f"{public(url)}: the body is more than the {limit} bytes allowed")
        chunks.append(chunk)
    return b"".join(chunks)


def _describe(exc: Exception) -> str:
    import aiohttp

    if isinstance(exc, aiohttp.ClientConnectorError):
        cause = exc.os_error
        return f"cannot connect to {exc.host}:{exc.port}: {cause.strerror or cause}"
    if isinstance(exc, aiohttp.InvalidURL):
        return "not a valid URL"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "the body could not be read (broken or cut off)"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the server closed the connection without an answer"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
