"""The core's run configuration, validated once at the boundary (see :mod:`trajkit.config.resolve`)."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from trajkit.compress.step import CompressStep

DEFAULT_SYSTEM_PROMPT = (
    "You are a capable assistant working in a sandboxed environment. Use the tools you are given "
    "to inspect, create and run things; think step by step, check results, and finish with a "
    "concise answer."
)
Probability = Annotated[float, Field(ge=0.0, le=1.0)]
_RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

PER_INVOCATION = frozenset({"resume", "overwrite", "allow_change", "verbose", "quiet", "log_prefix_chars"})
"""Settings of one invocation alone: a resume never takes them from the run's saved settings."""
OPERATIONAL = PER_INVOCATION | {
    "output_dir",
    "run_name",
    "batch_size",
    "num_workers",
    "max_cost",
    "max_cost_policy",
    "max_attempts",
    "retry_backoff",
    "writers",
    "compress",
    "prefill_messages_file",
}
"""The core's settings that do not change what a session produces or which trajectories are kept
(how fast, how many at once, what is spent, which files are rendered from the whole ledger): a
resume may change them freely. Every other core setting shapes the output, so a resume that
changes it is refused unless ``--allow_change KEY`` says so (:mod:`trajkit.run.settings`). A
plugin's setting that shapes the output says so with ``json_schema_extra={"affects_output": True}``;
every setting of a filter does (it decides what is kept)."""
FINGERPRINTED = {
    "ephemeral_system_prompt": "ephemeral_system_prompt_sha256",
    "prefill_messages": "prefill_messages_sha256",
}
"""Settings used but never saved: run.json holds a fingerprint of each, under these keys."""


class Route(BaseModel):
    """Rows whose image matches ``image`` (a shell-style pattern) run on ``backend``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    image: str
    backend: str

    def matches(self, image: str | None) -> bool:
        return fnmatch.fnmatchcase(image or "", self.image)


def flag(name: str | None = None, *, cli: bool = True) -> dict[str, Any]:
    """Field metadata for the command line: the flag's ``name`` when it differs from the field's,
    ``cli=False`` for settings only a configuration file can hold. (A list's flag is repeatable
    and takes comma-separated items whatever it says.)"""
    return {"flag": name, "cli": cli}


class RunConfig(BaseModel):
    """The core's settings: what every run has, whatever its plugins. Each plugin's own settings
    are its ``Settings`` model, validated into the ``*_options`` sections by
    :func:`trajkit.config.resolve.resolve`; secrets are ``SecretStr`` and never serialised."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset_file: Path | None = None
    """JSONL file, one {"prompt": ...} per line (required); or a Parquet, CSV or JSON (an array of
    objects) file, a Hugging Face dataset directory saved with save_to_disk, or
    hf://OWNER/NAME[:SPLIT] from the local Hugging Face cache."""
    prompt_field: str = Field("prompt", min_length=1)
    """The dataset's column that holds the prompt."""
    run_name: str = "run"
    """Names the run directory under --output_dir (required)."""
    output_dir: Path = Path("data")
    """Where run directories are made."""
    batch_size: int = Field(100, ge=1)
    """Records per ledger file."""
    distribution: str | None = None
    """Toolset distribution drawn per prompt (default: the one a plugin marks as default, the
    built-in sandboxed; trajkit distributions lists them)."""
    toolsets: list[str] = []
    """Offer exactly these toolsets to every prompt (comma-separated) instead of drawing from a
    distribution."""
    disabled_toolsets: list[str] = []
    """Never offer these toolsets (comma-separated): left out of the distribution's draw or of
    --toolsets."""
    model: str = "scripted"
    """'scripted' (offline), a model client's name, or a model slug for the client that takes any."""
    max_turns: int = Field(10, ge=1)
    """Model calls per prompt at most."""
    num_workers: int = Field(16, ge=1)
    """Sessions in flight at once."""
    max_samples: int | None = Field(None, ge=0)
    """Use only the first N rows."""
    samples_per_prompt: int = Field(1, ge=1)
    """Trajectories per row: each sample is a work item of its own (own toolset draw, own model
    sampling), counted by resume; the outputs keep a row's samples together."""
    resume: bool = False
    """Continue the run in the run directory with the settings it was made with (run.json);
    on the command line, --resume RUN_DIR names the directory alone."""
    allow_change: list[str] = Field([], json_schema_extra=flag())
    """A setting that shapes the output which this --resume may change from the run's own
    (repeatable; each change is recorded in run.json)."""
    overwrite: bool = False
    """Delete an existing run of this name first."""
    seed: int = 0
    """Seeds toolset sampling per prompt."""
    verbose: bool = False
    """Log every session's steps."""
    quiet: bool = False
    """No progress display."""
    log_prefix_chars: int = Field(100, ge=0)
    """Characters of each tool call and result shown in verbose logs."""
    max_cost: float | None = Field(None, ge=0)
    """What the run may spend (every model answer of every invocation counts): a new session
    starts only while what was spent plus the sessions in flight at the run's mean cost per
    session stays under it."""
    max_cost_policy: Literal["finish", "stop"] = "finish"
    """At --max_cost: 'finish' lets the sessions in flight end; 'stop' stops them (each recorded
    as a 'budget' failure, run again by a --resume with a larger --max_cost)."""

    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    """The saved system prompt (default: a built-in one)."""
    ephemeral_system_prompt: str | None = None
    """Used in every session, never saved."""
    prefill_messages: list[dict[str, Any]] = Field(
        [], json_schema_extra=flag("prefill_messages_file", cli=False)
    )
    """Few-shot messages used in every session, never saved (on the command line: a JSON file of
    them, --prefill_messages_file)."""
    prefill_messages_file: Path | None = Field(None, json_schema_extra=flag(cli=False))
    """The file --prefill_messages_file read them from: run.json keeps its name (never the
    messages) so that a resume can say which file to give again."""

    sandbox: str = "local"
    """Backend for rows without an image."""
    image_backend: str | None = None
    """Backend for rows with an image that no route or row names (default: the installed backend
    made for images)."""
    sandbox_lifetime: float = Field(3600.0, gt=0)
    """Seconds a sandbox may live."""
    tool_timeout: float = Field(120.0, gt=0)
    """Seconds one tool call may take."""
    tool_output_cap: int = Field(16 * 1024, ge=256)
    """Bytes of tool output kept."""
    prompt_timeout: float = Field(1800.0, gt=0)
    """Seconds per attempt of one prompt."""
    max_attempts: int = Field(3, ge=1)
    """Attempts per prompt in one invocation."""
    retry_backoff: float = Field(2.0, ge=0)
    """Seconds before the 2nd attempt; doubles."""
    check_timeout: float = Field(600.0, gt=0)
    """Seconds a row's check command (its "check" field) may run in the sandbox after the session."""

    filters: list[str] = Field([], json_schema_extra=flag("filter"))
    """Enable a filter that is off by default (repeatable)."""
    disabled_filters: list[str] = Field([], json_schema_extra=flag("no_filter"))
    """Disable a filter (repeatable)."""
    writers: list[str] = Field([], json_schema_extra=flag("writer"))
    """Output writer(s), repeatable (default: the ones registered as default)."""
    executor: str = "local"
    """Runs the sessions: 'local' on this process, or an executor plugin's."""

    model_options: dict[str, Any] = {}
    """Model client name -> its settings."""
    sandbox_options: dict[str, Any] = {}
    """Sandbox backend name -> its settings."""
    filter_options: dict[str, Any] = {}
    """Filter name -> its settings."""
    writer_options: dict[str, Any] = {}
    """Writer name -> its settings."""
    executor_options: dict[str, Any] = {}
    """Executor name -> its settings."""
    toolset_options: dict[str, Any] = {}
    """Toolset name -> its settings."""
    search_options: dict[str, Any] = {}
    """Web search provider name -> its settings."""

    compress: CompressStep = CompressStep()
    """The compression step after every merge (off until compress.max_tokens is set)."""

    distributions: dict[str, dict[str, Probability]] = Field({}, json_schema_extra=flag(cli=False))
    """Distributions defined in the configuration file ([distributions.NAME], a probability in
    [0, 1] per toolset: 0.9 offers it to 90% of prompts)."""
    routes: list[Route] = []
    """Rules choosing the backend of rows that name none, tried in order before the defaults."""
    tables: dict[str, dict[str, Any]] = Field({}, json_schema_extra=flag(cli=False))
    """Tables of named entries that plugins declare, given at the top level of the configuration
    file ([mcp_servers.NAME]); table -> entry name -> its validated settings."""

    @field_validator("prefill_messages")
    @classmethod
    def _prefill(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        from trajkit.model.prefill import check_prefill

        return check_prefill(value)

    @field_validator("run_name")
    @classmethod
    def _safe_run_name(cls, value: str) -> str:
        if not _RUN_NAME.match(value):
            raise ValueError("use letters, digits, '.', '_' or '-', starting with a letter or digit")
        return value

    @property
    def run_dir(self) -> Path:
        return self.output_dir / self.run_name

    def settings_of(self, plugin: Any) -> Any:
        """A plugin's settings in this run (a class, or a toolset): its validated section, else its defaults."""
        for section in (
            self.model_options,
            self.sandbox_options,
            self.filter_options,
            self.writer_options,
            self.executor_options,
            self.toolset_options,
            self.search_options,
        ):
            found = section.get(getattr(plugin, "name", ""))
            if isinstance(found, plugin.Settings):
                return found
        return plugin.Settings()

    def model_settings(self) -> dict[str, Any]:
        """The model clients' settings as the top-level keys they are given as, for the manifest."""
        flat: dict[str, Any] = {}
        for section in self.model_options.values():
            if isinstance(section, BaseModel):
                public = section.model_dump(mode="json", exclude=secret_fields(section))
                for key, value in public.items():
                    flat.setdefault(key, value)
        return flat

    def secret_values(self) -> list[str]:
        """The secrets this configuration holds (every ``SecretStr`` setting), for scrubbing."""
        from trajkit.config.resolve import secret_values

        return secret_values(dict(self))

    def watched(self) -> tuple[str, ...]:
        """The keys of :meth:`manifest` that shape what the run produces: every core setting but
        :data:`OPERATIONAL` (a never-saved one by its fingerprint) and the model client's settings
        marked ``affects_output``. (Other plugins' such settings are in their sections:
        :func:`trajkit.run.settings.guarded_settings`.)"""
        core = [
            FINGERPRINTED.get(name, name)
            for name in type(self).model_fields
            if name not in OPERATIONAL and not name.endswith("_options")
        ]
        marked = [
            key
            for section in self.model_options.values()
            if isinstance(section, BaseModel)
            for key, field in type(section).model_fields.items()
            if isinstance(field.json_schema_extra, dict) and field.json_schema_extra.get("affects_output")
        ]
        return (*core, *marked)

    def manifest(self) -> dict[str, Any]:
        """The configuration as saved in the run directory's ``run.json``: every setting but the
        secrets (``SecretStr`` settings are left out, not masked) and the parts used but never
        saved (the ephemeral system prompt and the prefill messages: a fingerprint of each), the
        model client's settings at the top level as in a configuration file, and the dataset as
        an absolute path, so a resume from another directory reads the same file."""
        data = self.model_dump(
            mode="json",
            exclude={
                **secret_fields(self),
                "ephemeral_system_prompt": True,
                "prefill_messages": True,
                "model_options": True,
            },
        )
        data.update({k: v for k, v in self.model_settings().items() if k not in data})
        if self.dataset_file is not None and not str(self.dataset_file).startswith("hf:"):
            data["dataset_file"] = os.path.abspath(self.dataset_file)
        data["ephemeral_system_prompt_used"] = self.ephemeral_system_prompt is not None
        data["prefill_messages_used"] = len(self.prefill_messages)
        data[FINGERPRINTED["ephemeral_system_prompt"]] = fingerprint(self.ephemeral_system_prompt)
        data[FINGERPRINTED["prefill_messages"]] = fingerprint(self.prefill_messages or None)
        return data


def fingerprint(value: Any) -> str | None:
    """A hash of a setting that is used but never saved, so a resume can tell whether it changed."""
    if value is None:
        return None
    text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def secret_fields(settings: Any) -> dict[Any, Any]:
    """The ``SecretStr`` settings held by ``settings`` as pydantic's nested ``exclude`` argument,
    so a dump leaves them out (a masked value would be read back as the secret)."""
    if isinstance(settings, BaseModel):
        fields = type(settings).model_fields
        items = [
            (key, SecretStr("") if _holds_secret(field.annotation) else getattr(settings, key))
            for key, field in fields.items()
        ]
    elif isinstance(settings, dict):
        items = list(settings.items())
    else:
        return {}
    found: dict[Any, Any] = {}
    for key, value in items:
        inner: Any = True if isinstance(value, SecretStr) else secret_fields(value)
        if inner:
            found[key] = inner
    return found


def _holds_secret(annotation: Any) -> bool:
    """A ``SecretStr`` field (``SecretStr | None`` too), whatever its value: left out even when unset."""
    return annotation is SecretStr or SecretStr in getattr(annotation, "__args__", ())


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
