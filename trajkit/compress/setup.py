"""From the command's flags to a ready compression: input, strategy, counter, model and output."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trajkit.compress.base import CompressionContext, Compressor, TokenCounter
from trajkit.compress.counters import TokenizerError
from trajkit.compress.engine import (
    CACHE_SUFFIX,
    METRICS_SUFFIX,
    STATE_SUFFIX,
    CompressError,
    Compression,
    Job,
    mark_completeness,
    output_lock,
    sidecar,
)
from trajkit.compress.metrics import Metrics
from trajkit.config.settings import OptionError, build_settings, parse_pairs
from trajkit.manager import PluginError, PluginHost
from trajkit.model import ModelClient, ModelError
from trajkit.record.secrets import Scrubber, environment_secrets
from trajkit.run.files import RunIOError, write_json_atomic
from trajkit.run.rundir import RunDir

log = logging.getLogger("trajkit")


class SetupError(ValueError):
    """The flags cannot make a compression; the message says which and why."""


def resolve_input(source: Path) -> Path:
    """A run directory's kept trajectories, or the JSONL file itself."""
    if source.is_dir():
        kept = RunDir(source).kept_path
        if not kept.is_file():
            raise SetupError(
                f"{source} has no {kept.name}: INPUT must be a run that has been merged at least once, "
                "or a JSONL file"
            )
        return kept
    return source


def build_counter(host: PluginHost, spec: str, pairs: tuple[str, ...]) -> TokenCounter:
    counters = host.token_counters
    data = parse_pairs(pairs, "--tokenizer_option")
    if spec in counters:
        counter_class = counters[spec]
    else:
        sourced = [c for c in counters.values() if c.accepts_source]
        if not sourced:
            raise SetupError(f"unknown token counter {spec!r} (installed: {', '.join(sorted(counters))})")
        counter_class = sourced[0]
        data["source"] = spec
    settings = build_settings(
        counter_class.Settings, data, f"token counter {counter_class.name!r}", "--tokenizer_option"
    )
    try:
        return counter_class(settings)  # type: ignore[arg-type]
    except TokenizerError as exc:
        raise SetupError(f"--tokenizer {spec}: {exc}") from None


def fingerprint(source: Path, compressor: Compressor, counter: TokenCounter, budget: int) -> dict[str, Any]:
    """What the output's records depend on: a resume with any of it changed would mix two outputs."""
    return {
        "input": str(source.resolve()),
        "strategy": compressor.name,
        "settings": compressor.settings.model_dump(mode="json"),
        "max_tokens": budget,
        "counter": counter.describe(),
        "counter_settings": counter.settings.model_dump(mode="json"),
    }


def check_output(output: Path, source: Path, state: dict[str, Any], overwrite: bool) -> None:
    if output.resolve() == source.resolve():
        raise SetupError("--out must not be the input file")
    state_file = sidecar(output, STATE_SUFFIX)
    if overwrite or not output.exists() or output.stat().st_size == 0:
        return
    try:
        previous = json.loads(state_file.read_text())
    except (OSError, ValueError):
        previous = None
    if previous != state:
        changed = (
            ", ".join(k for k in state if previous.get(k) != state[k])
            if isinstance(previous, dict)
            else "unknown (no readable state file)"
        )
        raise SetupError(
            f"{output} was written by another compression (differs in: {changed}); "
            "pass --overwrite to start it again, or choose another --out"
        )


@dataclass
class Prepared:
    job: Job
    state: dict[str, Any]
    client: ModelClient | None
    model: str
    quiet: bool
    overwrite: bool = False
    errors: tuple[type[Exception], ...] = (CompressError, ModelError, RunIOError, OSError)
    """What a compression may end with, for a caller to report (the command, the run's step)."""
    metrics: Metrics = field(default_factory=Metrics)
    incomplete: str | None = None
    """After :meth:`run`: why the output lacks records of the input (skipped lines), or None."""

    async def run(self) -> Metrics:
        from trajkit.compress.progress import Display, print_table

        output = self.job.output
        output.parent.mkdir(parents=True, exist_ok=True)
        with output_lock(output):
            if self.overwrite:  # only now: another invocation may be writing it until the lock is ours
                output.unlink(missing_ok=True)
            write_json_atomic(sidecar(output, STATE_SUFFIX), self.state)
            cache = None
            metrics = Metrics()
            try:
                if self.client is not None:
                    cache = self._summariser()
                    await self.client.check()
                display = Display(self.job.source, quiet=self.quiet)
                with display:
                    metrics = await Compression(self.job, display.update).run(metrics)
            finally:
                if self.client is not None:
                    # What this invocation paid, failed and cut-short summaries included: the
                    # records' own figures count only the summaries they kept.
                    metrics.spent = _spent(self.client.statistics())
                    await self.client.aclose()
                if cache is not None:
                    cache.close()
            write_json_atomic(sidecar(output, METRICS_SUFFIX), metrics.to_json())
            self.incomplete = mark_completeness(self.job, metrics)
        if not self.quiet:
            print_table(metrics, output)
        return metrics

    def _summariser(self) -> Any:
        from trajkit.compress.summarizer import Summarizer, SummaryCache

        assert self.client is not None
        cache = SummaryCache(sidecar(self.job.output, CACHE_SUFFIX))
        self.job.compressor.context.summarize = Summarizer(self.client, self.model, cache)
        return cache


def _spent(statistics: dict[str, Any]) -> dict[str, float] | None:
    """None for a client that counts nothing (the offline scripted model)."""
    if not statistics:
        return None
    return {key: statistics.get(key, 0) for key in ("requests", "prompt_tokens", "completion_tokens", "cost")}


def prepare(host: PluginHost, flags: dict[str, Any]) -> Prepared:
    """A compression ready to run, from the options of ``trajkit compress`` (by their names).

    Everything that can be wrong with the options is found here, before any output is touched:
    a :class:`SetupError` says what. The model client is built only for a strategy that needs one.
    """
    source = resolve_input(flags["source"])
    try:
        counter = build_counter(host, flags["tokenizer"], flags["tokenizer_options"])
        compressor = build_compressor(host, flags["strategy"], flags["options"], counter)
    except OptionError as exc:
        raise SetupError(str(exc)) from None
    client, secrets = _client(host, flags) if compressor.uses_model else (None, [])
    state = fingerprint(source, compressor, counter, flags["max_tokens"])
    check_output(flags["out"], source, state, flags["overwrite"])
    scrubber = Scrubber([*secrets, *environment_secrets()]) if compressor.uses_model else None
    job = Job(
        source=source,
        output=flags["out"],
        compressor=compressor,
        counter=counter,
        budget=flags["max_tokens"],
        concurrency=flags["concurrency"],
        record_timeout=flags["record_timeout"],
        scrubber=scrubber,
    )
    return Prepared(job, state, client, flags["model"], flags["quiet"], flags["overwrite"])


def build_compressor(
    host: PluginHost, name: str, pairs: tuple[str, ...], counter: TokenCounter
) -> Compressor:
    compressors = host.compressors
    if name not in compressors:
        raise SetupError(f"unknown strategy {name!r} (installed: {', '.join(sorted(compressors))})")
    compressor_class = compressors[name]
    settings = build_settings(
        compressor_class.Settings, parse_pairs(pairs, "--option"), f"strategy {name!r}", "--option"
    )
    return compressor_class(settings, CompressionContext(counter))  # type: ignore[arg-type]


def _client(host: PluginHost, flags: dict[str, Any]) -> tuple[ModelClient, list[str]]:
    """The model client the run would build for these flags: its retries, limits and accounting."""
    from trajkit.config.resolve import ConfigurationError, resolve

    given, places = flags.get("client_settings") or ({}, {})
    concurrency = flags["concurrency"]
    given = {"max_concurrent_requests": concurrency, **given, "model": flags["model"]}
    try:
        config = resolve(host, {**given, "num_workers": concurrency, "quiet": True}, places)
        client_class = host.model_client(config.model)
    except (ConfigurationError, PluginError) as exc:
        raise SetupError(str(exc)) from None
    if client_class.offline:
        log.warning("--model %s: summaries are offline placeholders, for a dry run only", config.model)
    try:
        client = client_class.from_config(config)
    except ModelError as exc:
        raise SetupError(str(exc)) from None
    return client, config.secret_values()
