"""The environment's settings: Atropos's own (``BaseEnvConfig``) plus the dataset and trajkit's run
settings, each an ``--env.KEY`` flag (or a key of the ``env`` section of ``--config FILE.yaml``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from atroposlib.envs.base import BaseEnvConfig
from pydantic import Field

from trajkit.config.run_config import read_config_file


class TrajkitEnvError(Exception):
    """The environment cannot go on: a bad setting or dataset, or every group failing; the
    message says what and where."""


class TrajkitEnvConfig(BaseEnvConfig):
    """Atropos's environment settings and trajkit's."""

    dataset_file: str | None = Field(
        default=None,
        description="The trajkit dataset whose rows are the items (JSONL, JSON, CSV, Parquet, hf://...); "
        "each row needs a check or an answer to be scored by",
    )
    trajkit_config: str | None = Field(
        default=None, description="A trajkit configuration file (TOML or YAML) with the run settings"
    )
    trajkit_settings: str | None = Field(
        default=None,
        description='trajkit run settings as a JSON object, over the file\'s: {"sandbox_options": {...}}',
    )
    toolsets: str | None = Field(
        default=None, description="Toolsets offered, comma-separated (over the above)"
    )
    distribution: str | None = Field(default=None, description="A toolset distribution (over the above)")
    sandbox: str | None = Field(default=None, description="The default sandbox backend (over the above)")
    max_turns: int | None = Field(default=None, description="Model calls per session (over the above)")
    concurrency: int = Field(default=64, ge=1, description="trajkit sessions running at once")
    chat_template: str | None = Field(
        default=None,
        description="The chat template to tokenize with (a .jinja file or a model directory); "
        "default: the tokenizer's own",
    )
    record_dir: str | None = Field(
        default=None,
        description="Record every rollout as a trajectory in this trajkit run directory "
        "(trajkit status, stats and export read it)",
    )
    seed: int = Field(default=0, description="Seed of the toolsets drawn per session")


def trajkit_settings(config: TrajkitEnvConfig) -> dict[str, Any]:
    """The trajkit run settings: the configuration file's, then the JSON's, then the flags'."""
    settings: dict[str, Any] = {}
    if config.trajkit_config:
        settings.update(read_config_file(Path(config.trajkit_config)))
    if config.trajkit_settings:
        try:
            given = json.loads(config.trajkit_settings)
        except ValueError as exc:
            raise TrajkitEnvError(f"--env.trajkit_settings: not JSON ({exc})") from None
        if not isinstance(given, dict):
            raise TrajkitEnvError("--env.trajkit_settings: expected a JSON object of settings")
        settings.update(given)
    if config.toolsets:
        settings["toolsets"] = [name.strip() for name in config.toolsets.split(",") if name.strip()]
    for key in ("distribution", "sandbox", "max_turns"):
        value = getattr(config, key)
        if value is not None:
            settings[key] = value
    for key in ("dataset_file", "run_name", "output_dir", "model", "base_url", "api_key"):
        if key in settings:
            raise TrajkitEnvError(
                f"trajkit setting {key!r} is not taken here: the dataset is --env.dataset_file, the "
                "policy --openai.*, the run directory --env.record_dir"
            )
    return settings
