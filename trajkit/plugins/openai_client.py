"""The OpenAI-compatible model client (OpenRouter, OpenAI, vLLM, SGLang, Ollama, ...).

It goes through the ``openai`` SDK's async client for transport, retries and error classes, but
posts the request as a plain dict and reads the raw JSON back: the SDK's typed request
transformation and response models cost more CPU per call than the rest of a turn, and the raw
JSON also keeps the reasoning fields that each endpoint names differently.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from trajkit import hookimpl
from trajkit.config import RunConfig
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

if TYPE_CHECKING:
    import openai

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


class OpenAIClient(ModelClient):
    name = "openai"
    description = "any OpenAI-compatible chat completions endpoint (--base_url, --model SLUG)"

    def __init__(self, client: openai.AsyncOpenAI, model: str, extras: dict[str, Any]) -> None:
        self.client = client
        self.model = model
        self.extras = extras

    @classmethod
    def from_config(cls, config: RunConfig) -> OpenAIClient:
        import openai

        try:
            http_client = openai.DefaultAioHttpClient(timeout=config.request_timeout)
        except RuntimeError:  # the aiohttp extra is missing: the SDK's default transport still works
            http_client = None
        client = openai.AsyncOpenAI(
            api_key=resolve_api_key(config),
            base_url=config.base_url,
            timeout=config.request_timeout,
            max_retries=config.max_retries,
            http_client=http_client,
        )
        return cls(client, config.model, request_extras(config))

    async def complete(self, messages: list[Message], tools: list[dict[str, Any]]) -> AssistantMessage:
        import openai

        body: dict[str, Any] = {"model": self.model, "messages": messages, **self.extras}
        if tools:
            body["tools"] = tools
        try:
            raw = await self.client.post("/chat/completions", cast_to=bytes, body=body)
        except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
            raise ModelAuthError(
                f"the endpoint refused the credentials ({exc.status_code}): {_message(exc)}"
            ) from None
        except openai.NotFoundError as exc:
            raise ModelNotFound(f"{exc.status_code} from the endpoint: {_message(exc)}") from None
        except (openai.BadRequestError, openai.UnprocessableEntityError) as exc:
            raise ModelConfigError(f"{exc.status_code} from the endpoint: {_message(exc)}") from None
        except openai.APIStatusError as exc:
            raise ModelError(f"{exc.status_code} from the endpoint after retries: {_message(exc)}") from None
        except openai.APIConnectionError as exc:
            raise ModelError(f"{type(exc).__name__} after retries: {exc}") from None
        return self._parse(raw)

    @staticmethod
    def _parse(raw: bytes) -> AssistantMessage:
        try:
            data = json.loads(raw)
        except ValueError:
            raise ModelError(f"the endpoint returned non-JSON: {raw[:200]!r}") from None
        if not isinstance(data, dict):
            raise ModelError("the endpoint returned JSON that is not an object")
        if data.get("error"):
            raise ModelError(f"the endpoint returned an error: {_describe_error(data['error'])}")
        choices = data.get("choices") or []
        if not choices or not isinstance(choices[0].get("message"), dict):
            raise ModelError("the endpoint returned no choices")
        choice = choices[0]
        return parse_assistant_message(choice["message"], data.get("usage"), choice.get("finish_reason"))

    async def aclose(self) -> None:
        await self.client.close()


def _describe_error(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error)[:500]
    return str(error)[:500]


def _message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        return _describe_error(body.get("error", body))
    return str(exc.message)[:500]
