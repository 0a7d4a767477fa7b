"""The run configuration: every flag of ``trajkit run``, validated once at the boundary."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max", "ultra"]
DEFAULT_BASE_URL = "https://openrouter.ai/api/v1"
DEFAULT_SYSTEM_PROMPT = (
    "You are a capable assistant working in a sandboxed environment. Use the tools you are given "
    "to inspect, create and run things; think step by step, check results, and finish with a "
    "concise answer."
)
_RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

# Settings that change what a session produces: resuming with any of them changed mixes two
# configurations in one dataset, so the run warns and records it.
OUTPUT_AFFECTING = (
    "model",
    "base_url",
    "distribution",
    "max_turns",
    "seed",
    "system_prompt",
    "reasoning_effort",
    "reasoning_disabled",
    "max_tokens",
    "temperature",
)


class Route(BaseModel):
    """Rows whose image matches ``image`` (a shell-style pattern) run on ``backend``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    image: str
    backend: str

    def matches(self, image: str | None) -> bool:
        return fnmatch.fnmatchcase(image or "", self.image)


class RunConfig(BaseModel):
    """Everything a run needs to know. Secrets are ``SecretStr`` and never serialised."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset_file: Path | None = None
    run_name: str = "run"
    output_dir: Path = Path("data")
    batch_size: int = Field(100, ge=1)
    distribution: str = "default"
    model: str = "scripted"
    base_url: str = DEFAULT_BASE_URL
    api_key: SecretStr | None = None
    api_key_file: Path | None = None
    """A file holding the key: unlike ``--api_key`` it never shows in the process list."""
    max_turns: int = Field(10, ge=1)
    num_workers: int = Field(16, ge=1)
    max_samples: int | None = Field(None, ge=0)
    resume: bool = False
    overwrite: bool = False
    seed: int = 0
    verbose: bool = False
    quiet: bool = False
    log_prefix_chars: int = Field(100, ge=0)

    providers_allowed: list[str] = []
    providers_ignored: list[str] = []
    providers_order: list[str] = []
    provider_sort: Literal["price", "throughput", "latency"] | None = None
    reasoning_effort: ReasoningEffort | None = None
    reasoning_disabled: bool = False
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = None
    transport: Literal["aiohttp", "sdk", "builtin"] = "aiohttp"
    """How the OpenAI-compatible client sends requests: aiohttp, or the openai SDK's own path
    (``builtin``, the retired hand-written client, is taken as ``aiohttp`` with a warning)."""
    request_timeout: float = Field(600.0, gt=0)
    max_retries: int = Field(6, ge=0)
    retry_budget: float = Field(900.0, gt=0)
    """Seconds one model request may spend retrying in all."""
    max_concurrent_requests: int | None = Field(None, ge=1)
    max_rpm: float | None = Field(None, gt=0)
    max_tpm: float | None = Field(None, gt=0)
    max_cost: float | None = Field(None, ge=0)
    prices: dict[str, tuple[float, float]] = {}
    """Model -> (input, output) price per million tokens, for endpoints that report no cost."""

    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    ephemeral_system_prompt: str | None = None
    prefill_messages: list[dict[str, Any]] = []

    sandbox: str = "local"
    image_backend: str | None = None
    """Backend for rows with an image that no route or row names; default: the installed backend
    made for images."""
    sandbox_options: dict[str, dict[str, str]] = {}
    sandbox_lifetime: float = Field(3600.0, gt=0)
    tool_timeout: float = Field(120.0, gt=0)
    tool_output_cap: int = Field(16 * 1024, ge=256)
    prompt_timeout: float = Field(1800.0, gt=0)
    max_attempts: int = Field(3, ge=1)
    retry_backoff: float = Field(2.0, ge=0)

    filters: list[str] = []
    disabled_filters: list[str] = []
    filter_options: dict[str, dict[str, Any]] = {}
    """Filter name -> keyword options for that filter's constructor."""
    writers: list[str] = []
    """Output writers; default: the ones registered as default."""
    writer_options: dict[str, Any] = {}
    """Writer name -> its settings."""
    executor: str = "local"
    """Runs the sessions: ``local`` on this process's event loop, or an executor plugin's."""
    executor_options: dict[str, Any] = {}
    """Executor name -> its settings."""

    distributions: dict[str, dict[str, float]] = {}
    """Distributions defined in the configuration file: name -> toolset -> probability."""
    routes: list[Route] = []
    """Rules choosing the backend of rows that name none, tried in order before the defaults."""

    @model_validator(mode="before")
    @classmethod
    def _key_from_file(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("api_key_file") and not data.get("api_key"):
            path = Path(data["api_key_file"])
            try:
                key = path.read_text().strip()
            except (OSError, UnicodeDecodeError) as exc:
                raise ValueError(f"api_key_file {path}: cannot be read ({type(exc).__name__})") from None
            if not key:
                raise ValueError(f"api_key_file {path} is empty")
            data = {**data, "api_key": key}
        return data

    def secret_values(self) -> list[str]:
        """The secrets this configuration holds, for scrubbing records."""
        return [self.api_key.get_secret_value()] if self.api_key is not None else []

    @field_validator("run_name")
    @classmethod
    def _safe_run_name(cls, value: str) -> str:
        if not _RUN_NAME.match(value):
            raise ValueError("use letters, digits, '.', '_' or '-', starting with a letter or digit")
        return value

    @property
    def run_dir(self) -> Path:
        return self.output_dir / self.run_name

    def manifest(self) -> dict[str, Any]:
        """The configuration as saved in the run directory: secrets and ephemeral parts left out."""
        data = self.model_dump(
            mode="json", exclude={"api_key", "ephemeral_system_prompt", "prefill_messages"}
        )
        data["ephemeral_system_prompt_used"] = self.ephemeral_system_prompt is not None
        data["prefill_messages_used"] = len(self.prefill_messages)
        return data


class ConfigFileError(ValueError):
    """The configuration file cannot be read; the message names the file and the key."""


def read_config_file(path: Path) -> dict[str, Any]:
    """Settings from a TOML or YAML file, keys in either spelling (``max_turns`` or ``max-turns``).

    Keys are checked against :class:`RunConfig` when the run's configuration is built, so an
    unknown key is reported with its place in the file.
    """
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigFileError(f"{path}: {exc.strerror}") from None
    if path.suffix in {".yaml", ".yml"}:
        try:
            import yaml
        except ImportError:
            raise ConfigFileError(f"{path}: YAML needs PyYAML (pip install pyyaml), or use TOML") from None
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ConfigFileError(f"{path}: {exc}") from None
    else:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigFileError(f"{path}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigFileError(f"{path}: expected a table of settings at the top level")
    return {str(key).replace("-", "_"): value for key, value in data.items()}
