"""The OpenAI-compatible client's settings: flags and configuration keys of their own name, as
the reference runner had them (``--base_url``, ``--max_retries``, ``--providers_allowed``...)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, model_validator

from trajkit.config.run_config import flag
from trajkit.config.settings import StrictSettings
from trajkit.record.secrets import read_key_file

DEFAULT_BASE_URL = "https://openrouter.ai/api/v1"
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max", "ultra"]
AFFECTS_OUTPUT: dict[str, Any] = {"affects_output": True}


class OpenAISettings(StrictSettings):
    base_url: str = Field(DEFAULT_BASE_URL, json_schema_extra=AFFECTS_OUTPUT)
    """Any OpenAI-compatible endpoint."""
    api_key: SecretStr | None = None
    """Default: $OPENROUTER_API_KEY or $OPENAI_API_KEY. On the command line the key shows in the
    process list: prefer the environment or --api_key_file."""
    api_key_file: Path | None = None
    """A file holding the API key (unlike --api_key it never shows in the process list)."""
    transport: Literal["aiohttp", "sdk", "builtin"] = "aiohttp"
    """How model requests are sent: aiohttp (honours HTTP(S)_PROXY/NO_PROXY) or the openai SDK's
    own path; 'builtin' (retired) is taken as aiohttp with a warning."""
    request_timeout: float = Field(600.0, gt=0)
    """Seconds per model request."""
    max_retries: int = Field(6, ge=0)
    """Retries of one model request."""
    retry_budget: float = Field(900.0, gt=0)
    """Seconds one model request may spend retrying in all."""
    max_concurrent_requests: int | None = Field(None, ge=1)
    """Model requests in flight at most."""
    max_rpm: float | None = Field(None, gt=0)
    """Model requests per minute at most."""
    max_tpm: float | None = Field(None, gt=0)
    """Tokens per minute at most (estimated before each call)."""
    prices: dict[str, tuple[float, float]] = Field({}, json_schema_extra=flag(cli=False))
    """Model -> (input, output) price per million tokens, for endpoints that report no cost."""
    providers_allowed: list[str] = Field([], json_schema_extra=AFFECTS_OUTPUT)
    """OpenRouter providers to use, comma-separated."""
    providers_ignored: list[str] = Field([], json_schema_extra=AFFECTS_OUTPUT)
    """OpenRouter providers to avoid, comma-separated."""
    providers_order: list[str] = Field([], json_schema_extra=AFFECTS_OUTPUT)
    """OpenRouter providers to try in order, comma-separated."""
    provider_sort: Literal["price", "throughput", "latency"] | None = Field(
        None, json_schema_extra=AFFECTS_OUTPUT
    )
    """How OpenRouter orders providers."""
    reasoning_effort: ReasoningEffort | None = Field(None, json_schema_extra=AFFECTS_OUTPUT)
    """Sent the way the endpoint expects (OpenRouter's reasoning object)."""
    reasoning_disabled: bool = Field(False, json_schema_extra=AFFECTS_OUTPUT)
    """Ask the endpoint not to reason."""
    max_tokens: int | None = Field(None, ge=1, json_schema_extra=AFFECTS_OUTPUT)
    """Tokens per model answer at most."""
    temperature: float | None = Field(None, json_schema_extra=AFFECTS_OUTPUT)
    """Sampling temperature."""

    @model_validator(mode="before")
    @classmethod
    def _key_from_file(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("api_key_file") and not data.get("api_key"):
            data = {**data, "api_key": read_key_file(Path(data["api_key_file"]), "api_key_file")}
        return data
