"""The model endpoint checked before the first session: its URL, the key, and one cheap request.

A wrong URL, key or model would otherwise fail every session one by one, after sandboxes were
started for them. :func:`check_endpoint` asks for the endpoint's model list (``GET /models``),
which needs the key on most endpoints and names the models served; an endpoint without a list
(404 or 405) is noted and the run goes on. Every message here names the host, never the key, and
shows URLs without credentials or query strings.
"""

from __future__ import annotations

import asyncio
import difflib
import email.utils
import logging
import os
import socket
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit

import orjson

from trajkit import __version__
from trajkit.model import ModelEndpointError, ModelNotFound
from trajkit.tools.network import public

if TYPE_CHECKING:
    import aiohttp

log = logging.getLogger("trajkit")

CHECK_TIMEOUT = 20.0
"""Seconds the check's request may take: an endpoint that cannot answer a model list in that
time will not answer the run either."""
CONNECT_TIMEOUT = 30.0


def host_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)


def validate_base_url(base_url: str) -> None:
    shown = public(base_url)
    if any(ord(c) <= 32 or ord(c) == 127 for c in base_url):
        raise ModelEndpointError(f"--base_url {shown!r} contains whitespace or control characters")
    try:
        parts = urlsplit(base_url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        raise ModelEndpointError(f"--base_url {shown!r} is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise ModelEndpointError(
            f"--base_url {shown!r} must start with http:// or https:// (e.g. http://localhost:8000/v1)"
        )
    if not parts.hostname:
        raise ModelEndpointError(f"--base_url {shown!r} names no host")


def validate_api_key(api_key: str) -> None:
    """Printable ASCII without whitespace: anything else would corrupt the Authorization header.

    The message says what and where, never the key itself.
    """
    if not api_key:
        raise ModelEndpointError("the API key is empty")
    for position, char in enumerate(api_key):
        if 33 <= ord(char) <= 126:
            continue
        raise ModelEndpointError(
            f"the API key has {_kind_of(char)} at position {position + 1} of {len(api_key)}: keys are"
            " printable ASCII without spaces (was it pasted or exported with a line break?)"
        )


def _kind_of(char: str) -> str:
    if char in "\r\n":
        return "a newline"
    if char.isspace():
        return "whitespace"
    if ord(char) < 32 or ord(char) == 127:
        return "a control character"
    return "a non-ASCII character"


def connect_failure(url: str, error: BaseException | str) -> str:
    """``cannot connect to HOST: reason`` for a connection that could not be made."""
    if isinstance(error, str):
        reason = error
    else:
        cause = getattr(error, "os_error", None) or error
        if isinstance(cause, socket.gaierror):
            reason = str(cause.strerror)
        elif isinstance(cause, OSError) and cause.errno and cause.errno > 0:
            reason = os.strerror(cause.errno)
        else:
            reason = str(cause) or type(cause).__name__
    return f"cannot connect to {host_of(url)}: {reason}"


def redirect_error(status: int, location: str | None, url: str) -> ModelEndpointError:
    """A redirect is not followed: the request would go somewhere the configuration did not name."""
    if not location:
        return ModelEndpointError(f"{public(url)} answered {status}, a redirect that names no address")
    target = public(urljoin(url, location))
    path = urlsplit(url).path
    suffix = path[path.rfind("/") :] if "/" in path else ""
    hint = target.removesuffix(suffix) if suffix and target.endswith(suffix) else target
    return ModelEndpointError(
        f"{public(url)} answered {status}, a redirect to {target}; model requests are not sent on to"
        f" another address: set --base_url to {hint} if that is the endpoint"
    )


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds from ``Retry-After`` (seconds or an HTTP date) or ``retry-after-ms``."""
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


def env_proxy(url: str) -> dict[str, Any]:
    """``proxy``/``proxy_auth`` for requests to ``url``, from HTTP(S)_PROXY and NO_PROXY, read once.

    aiohttp's own reading of the variables (and of a proxy's credentials), but done once per run:
    a session with ``trust_env`` reads them, and looks the host up in ~/.netrc, on a worker thread
    for every request (two thread hand-offs, a third of a model turn's CPU), and a netrc entry for
    the endpoint's host would clash with the Authorization header on every request.
    """
    from aiohttp.helpers import get_env_proxy_for_url
    from yarl import URL

    try:
        proxy, auth = get_env_proxy_for_url(URL(url))
    except LookupError:
        return {}
    log.info("model requests to %s go through the proxy at %s", host_of(url), public(str(proxy)))
    return {"proxy": proxy, "proxy_auth": auth}


def client_session(api_key: str, *, connections: int, timeout: float) -> aiohttp.ClientSession:
    """An aiohttp session for the endpoint: the key, no cookies; proxies come from :func:`env_proxy`."""
    import aiohttp

    from trajkit.plugins.openai.transport import IDLE_TIMEOUT

    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=connections, keepalive_timeout=IDLE_TIMEOUT),
        cookie_jar=aiohttp.DummyCookieJar(),  # an API needs no cookies; the jar costs CPU per request
        trust_env=False,
        timeout=aiohttp.ClientTimeout(total=timeout, sock_connect=min(timeout, CONNECT_TIMEOUT)),
        headers={
            "Authorization": f"Bearer {api_key}",
            "Content-Type": "application/json",
            "User-Agent": f"trajkit/{__version__}",
        },
    )


async def close_session(session: aiohttp.ClientSession) -> None:
    """Close ``session`` and its sockets: aiohttp's closed connections let go of theirs on the
    loop's next turn, which a run that ends right after would never reach."""
    await session.close()
    await asyncio.sleep(0)


async def check_endpoint(base_url: str, api_key: str, model: str, *, timeout: float = CHECK_TIMEOUT) -> None:
    """One cheap request before the run; raises :class:`ModelEndpointError` or :class:`ModelNotFound`."""
    base = base_url.rstrip("/")
    proxy = env_proxy(base)
    session = client_session(api_key, connections=2, timeout=timeout)
    try:
        await _check(session, base, model, timeout, proxy)
    finally:
        await close_session(session)


async def _check(
    session: aiohttp.ClientSession, base: str, model: str, timeout: float, proxy: dict[str, Any]
) -> None:
    """Ask ``base`` for its model list (and OpenRouter for the key's standing) through ``session``."""
    status, headers, raw = await _get(session, f"{base}/models", timeout, proxy)
    if status in (401, 403):
        raise _refused(status, raw)
    if 300 <= status < 400:
        raise redirect_error(status, headers.get("Location"), f"{base}/models")
    if status in (404, 405):
        log.info(
            "%s has no model list (%d): continuing; if its API lives under /v1, add that to --base_url",
            public(base),
            status,
        )
    elif status >= 400:
        log.warning("%s/models answered %d: the model could not be checked; continuing", public(base), status)
    else:
        _check_model(model, raw, headers, base)
    if (urlsplit(base).hostname or "").endswith("openrouter.ai"):
        # OpenRouter lists its models without a key: its key endpoint checks the key.
        status, _, raw = await _get(session, f"{base}/key", timeout, proxy)
        if status in (401, 403):
            raise _refused(status, raw)


async def _get(
    session: aiohttp.ClientSession, url: str, timeout: float, proxy: dict[str, Any]
) -> tuple[int, Mapping[str, str], bytes]:
    import aiohttp

    from trajkit.plugins.openai.transport import read_limited

    try:
        async with session.get(url, allow_redirects=False, **proxy) as response:
            return response.status, response.headers, await read_limited(response, 16 << 20)
    except aiohttp.ClientConnectorError as exc:
        raise ModelEndpointError(connect_failure(url, exc)) from None
    except TimeoutError:
        raise ModelEndpointError(connect_failure(url, f"no answer within {timeout:g}s")) from None
    except aiohttp.ClientError as exc:
        raise ModelEndpointError(connect_failure(url, f"{type(exc).__name__}: {exc}")) from None


def _refused(status: int, raw: bytes) -> ModelEndpointError:
    from trajkit.plugins.openai.transport import error_text

    return ModelEndpointError(
        f"the endpoint refused the credentials ({status}): {error_text(raw)}; check --api_key"
        " (or $OPENROUTER_API_KEY / $OPENAI_API_KEY)"
    )


def _check_model(model: str, raw: bytes, headers: Mapping[str, str], base: str) -> None:
    try:
        data: Any = orjson.loads(raw)
    except ValueError:
        kind = headers.get("Content-Type", "no content type")
        raise ModelEndpointError(
            f"{public(base)}/models answered with something that is not JSON ({kind}): is --base_url"
            " the address of an OpenAI-compatible API (often ending in /v1)?"
        ) from None
    listed = data.get("data") if isinstance(data, dict) else None
    if not isinstance(listed, list):
        log.warning("%s/models is not a model list: the model could not be checked; continuing", public(base))
        return
    ids = {str(entry.get("id")) for entry in listed if isinstance(entry, dict) and entry.get("id")}
    # A tag names a variant of a listed model, on either side: OpenRouter lists "vendor/model" and
    # takes "vendor/model:free"; Ollama lists "llama3:latest" and takes "llama3".
    if not ids or model in ids or model.split(":", 1)[0] in {i.split(":", 1)[0] for i in ids}:
        return
    close = difflib.get_close_matches(model, sorted(ids), n=3, cutoff=0.5)
    hint = f" (close: {', '.join(close)})" if close else ""
    raise ModelNotFound(f"model {model!r} is not among the {len(ids)} models {public(base)} serves{hint}")
