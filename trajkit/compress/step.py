"""Compression as a step of a run: after every merge, the kept trajectories are compressed into
``trajectories.compressed.jsonl`` next to the originals, exactly as ``trajkit compress RUN_DIR``
would (resumable, summaries cached and paid once, the same metrics and state files)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from trajkit.compress.metrics import Metrics
    from trajkit.config.run_config import RunConfig
    from trajkit.manager import PluginHost

log = logging.getLogger("trajkit")


class CompressStep(BaseModel):
    """The run's compression step and the defaults of ``trajkit compress``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_tokens: int | None = Field(None, ge=1)
    """Token budget of each trajectory; when set, every merge also writes trajectories.compressed.jsonl."""
    strategy: str = "mask_observations"
    """Compressor to use (trajkit compress --list_strategies lists them)."""
    options: dict[str, Any] = {}
    """The strategy's settings."""
    tokenizer: str = "estimate"
    """A token counter's name, a tokenizer.json (or its directory) or a model id in the local HF cache."""
    tokenizer_options: dict[str, Any] = {}
    """The token counter's settings."""
    model: str | None = None
    """Summary model (default: the run's model, through the run's model client settings)."""
    concurrency: int = Field(16, ge=1)
    """Records in flight."""
    record_timeout: float = Field(900.0, gt=0)
    """Seconds one record may take; past it the record is kept unchanged and flagged."""


def pairs(values: dict[str, Any]) -> tuple[str, ...]:
    return tuple(f"{key}={value}" for key, value in values.items())


class StepFailed(RuntimeError):
    """The step could not compress the run; the message says why."""


def check(config: RunConfig, host: PluginHost) -> None:
    """Build the step's strategy and token counter before the run starts, so a misspelled one is
    refused before any session is paid for; raises :class:`StepFailed`."""
    from trajkit.compress.setup import SetupError, build_compressor, build_counter
    from trajkit.config.settings import OptionError
    from trajkit.manager import PluginError

    step = config.compress
    if step.max_tokens is None:
        return
    try:
        counter = build_counter(host, step.tokenizer, pairs(step.tokenizer_options))
        build_compressor(host, step.strategy, pairs(step.options), counter)
    except (SetupError, OptionError, PluginError) as exc:
        raise StepFailed(f"compress: {exc}") from None


async def compress_run(config: RunConfig, host: PluginHost) -> Metrics | None:
    """Run the step if the configuration asks for it (None if not); raises :class:`StepFailed`."""
    from trajkit.compress.setup import SetupError, prepare
    from trajkit.manager import PluginError

    if config.compress.max_tokens is None:
        return None
    try:
        prepared = prepare(host, _flags(config))
    except (SetupError, PluginError) as exc:
        raise StepFailed(f"compress: {exc}") from exc
    try:
        metrics = await prepared.run()
    except prepared.errors as exc:
        raise StepFailed(f"compress: {exc}") from exc
    if prepared.incomplete:
        raise StepFailed(f"compress: {prepared.incomplete}")
    return metrics


def _flags(config: RunConfig) -> dict[str, Any]:
    """What ``trajkit compress RUN_DIR --out RUN_DIR/trajectories.compressed.jsonl`` would be given."""
    from trajkit.run.rundir import RunDir

    step = config.compress
    return {
        "source": config.run_dir,
        "out": RunDir(config.run_dir).compressed_path,
        "max_tokens": step.max_tokens,
        "strategy": step.strategy,
        "options": pairs(step.options),
        "tokenizer": step.tokenizer,
        "tokenizer_options": pairs(step.tokenizer_options),
        "model": step.model or config.model,
        "concurrency": step.concurrency,
        "record_timeout": step.record_timeout,
        # Each merge rewrites trajectories.jsonl in dataset order, new records anywhere in it: the
        # step compresses it again, and every summary paid before comes from the cache.
        "overwrite": True,
        "quiet": config.quiet,
        # the run's model client settings, validated already (keys and secrets included)
        "client_settings": ({"model_options": dict(config.model_options)}, {}),
    }
