"""The server's guards, as aiohttp middlewares: errors in OpenAI's envelope, CORS, the bearer key.

Order (outermost first): CORS (a preflight is answered before anything else; a page of an origin
that is not listed gets 403), errors (every refusal becomes an OpenAI error body), then the key
(constant-time comparison; ``/health`` and preflights need none). CORS headers go on in
``on_response_prepare`` so that streamed responses, whose headers leave before the handler
returns, carry them too.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable, Collection

import orjson
from aiohttp import web
from aiohttp.typedefs import Middleware

from trajkit.serve.protocol import ProtocolError, error_body

log = logging.getLogger("trajkit")

CORS_ORIGINS: web.AppKey[frozenset[str]] = web.AppKey("cors_origins", frozenset)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
OPEN_PATHS = frozenset({"/health", "/v1/health"})
ALLOWED_HEADERS = "Authorization, Content-Type, OpenAI-Organization, OpenAI-Project, X-Stainless-*"
PREFLIGHT_MAX_AGE = "600"


def json_response(body: object, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=orjson.dumps(body), status=status, headers=headers, content_type="application/json"
    )


def error_response(error: ProtocolError) -> web.Response:
    return json_response(error.body(), error.status, error.headers)


def cors_middleware(origins: Collection[str]) -> Middleware:
    allowed = frozenset(origins)

    @web.middleware
    async def cors(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if origin is None:
            return await handler(request)  # not a browser page's cross-origin call: CORS has no say
        if origin not in allowed:
            return error_response(
                ProtocolError(403, "this origin may not call the server", code="cors_forbidden")
            )
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            return web.Response(
                status=204,
                headers={
                    "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
                    "Access-Control-Allow-Headers": ALLOWED_HEADERS,
                    "Access-Control-Max-Age": PREFLIGHT_MAX_AGE,
                },
            )
        return await handler(request)

    return cors


async def cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: every response varies by Origin; a listed origin is named back."""
    response.headers["Vary"] = "Origin"
    origin = request.headers.get("Origin")
    if origin is not None and origin in request.app[CORS_ORIGINS]:
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Access-Control-Expose-Headers"] = "Retry-After"


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ProtocolError as error:
        return error_response(error)
    except web.HTTPRequestEntityTooLarge as exc:
        return error_response(ProtocolError(413, f"the request body is too large ({exc.text})"))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return json_response(error_body(exc.reason, "invalid_request_error"), exc.status)
    except ConnectionError:
        raise  # the client is gone: there is no one to answer
    except Exception as exc:  # a bug: said in the log, never in detail to the client
        log.exception("internal error serving %s %s", request.method, request.path)
        return error_response(ProtocolError(500, f"internal error: {type(exc).__name__}"))


def auth_middleware(key: str | None) -> Middleware:
    expected = key.encode() if key is not None else None

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if expected is None or request.path in OPEN_PATHS or request.method == "OPTIONS":
            return await handler(request)
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        given = token.strip().encode("utf-8", "replace") if scheme.lower() == "bearer" else b""
        if not hmac.compare_digest(given, expected):
            raise ProtocolError(
                401, "Incorrect API key provided: send the server key as 'Authorization: Bearer KEY'",
                code="invalid_api_key",
            )  # fmt: skip
        return await handler(request)

    return auth
