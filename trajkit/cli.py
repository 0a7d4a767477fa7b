"""The ``trajkit`` command line.

Every flag of the reference runner is accepted in both spellings (``--dataset_file`` and
``--dataset-file``) so existing commands keep working.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource
from pydantic import ValidationError

from trajkit import __version__
from trajkit.config import ConfigFileError, RunConfig, read_config_file
from trajkit.manager import PluginError, PluginHost, load_plugins

log = logging.getLogger("trajkit")


def option(
    name: str, dest: str | None = None, **kwargs: Any
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A click option under ``--snake_case`` and ``--kebab-case``, stored as ``dest`` (default: the name)."""
    spellings = dict.fromkeys([f"--{name}", f"--{name.replace('_', '-')}"])
    return click.option(*spellings, dest or name, **kwargs)


def comma_list(_ctx: click.Context, _param: click.Parameter, value: str | None) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()] if value else []


def key_values(
    _ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]
) -> dict[str, dict[str, str]]:
    """``docker.network=host`` -> {"docker": {"network": "host"}}."""
    options: dict[str, dict[str, str]] = {}
    for item in values:
        key, sep, value = item.partition("=")
        backend, dot, setting = key.partition(".")
        if not sep or not dot or not backend or not setting:
            raise click.BadParameter(f"{item!r}: expected BACKEND.KEY=VALUE, e.g. docker.network=host")
        options.setdefault(backend, {})[setting] = value
    return options


def load_host(ctx: click.Context) -> PluginHost:
    host: PluginHost = ctx.obj
    for error in host.load_errors:
        log.warning("%s", error)
    return host


class TrajkitGroup(click.Group):
    """Loads plugins before parsing, so plugins can add commands."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        try:
            host = load_plugins()
        except PluginError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        host.register_commands(self)
        kwargs.setdefault("obj", host)
        return super().main(*args, **kwargs)


@click.group(cls=TrajkitGroup)
@click.version_option(__version__, prog_name="trajkit")
def cli() -> None:
    """Turn a JSONL file of prompts into tool-calling agent trajectories for training."""
    # Our own progress at INFO; libraries (the HTTP clients log every request at INFO) only warnings.
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr
    )
    log.setLevel(logging.INFO)


@cli.command()
@option(
    "config",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    default=None,
    help="TOML or YAML file with any of these settings and more; flags override it.",
)
@option("dataset_file", type=click.Path(path_type=Path), help='JSONL file, one {"prompt": ...} per line.')
@option("run_name", help="Names the run directory under --output_dir.")
@option("output_dir", type=click.Path(path_type=Path), default=Path("data"), show_default=True)
@option("batch_size", type=int, default=100, show_default=True, help="Records per ledger file.")
@option("distribution", default="default", show_default=True, help="Toolset distribution.")
@option("model", default="scripted", show_default=True, help="'scripted' (offline) or a model slug.")
@option("base_url", default="https://openrouter.ai/api/v1", show_default=True)
@option(
    "api_key",
    default=None,
    help="Default: $OPENROUTER_API_KEY or $OPENAI_API_KEY. On the command line the key shows in the "
    "process list: prefer the environment or --api_key_file.",
)
@option(
    "api_key_file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="A file holding the API key.",
)
@option("max_turns", type=int, default=10, show_default=True, help="Model calls per prompt at most.")
@option("num_workers", type=int, default=16, show_default=True, help="Sessions in flight at once.")
@option("resume", is_flag=True, help="Continue the run in the run directory.")
@option("overwrite", is_flag=True, help="Delete an existing run of this name first.")
@option("verbose", is_flag=True)
@option("quiet", is_flag=True, help="No progress display.")
@option("max_samples", type=int, default=None, help="Use only the first N rows.")
@option("providers_allowed", callback=comma_list, help="OpenRouter providers to use, comma-separated.")
@option("providers_ignored", callback=comma_list, help="OpenRouter providers to avoid.")
@option("providers_order", callback=comma_list, help="OpenRouter providers to try in order.")
@option("provider_sort", type=click.Choice(["price", "throughput", "latency"]), default=None)
@option(
    "reasoning_effort",
    type=click.Choice(["none", "minimal", "low", "medium", "high", "xhigh", "max", "ultra"]),
    default=None,
)
@option("reasoning_disabled", is_flag=True)
@option("max_tokens", type=int, default=None)
@option("temperature", type=float, default=None)
@option("ephemeral_system_prompt", default=None, help="Used in every session, never saved.")
@option("system_prompt", default=None, help="Replaces the default system prompt (saved).")
@option("prefill_messages_file", type=click.Path(path_type=Path, exists=True, dir_okay=False), default=None)
@option("log_prefix_chars", type=int, default=100, show_default=True)
@option("seed", type=int, default=0, show_default=True, help="Seeds toolset sampling per prompt.")
@option("sandbox", default="local", show_default=True, help="Backend for rows without an image.")
@option(
    "image_backend",
    default=None,
    help="Backend for rows with an image (default: the installed backend made for images, docker).",
)
@option(
    "sandbox_option",
    "sandbox_options",
    multiple=True,
    callback=key_values,
    help="BACKEND.KEY=VALUE, repeatable.",
)
@option("prompt_timeout", type=float, default=1800.0, show_default=True, help="Seconds per prompt attempt.")
@option("tool_timeout", type=float, default=120.0, show_default=True)
@option("max_attempts", type=int, default=3, show_default=True, help="Attempts per prompt in one invocation.")
@option(
    "retry_backoff",
    type=float,
    default=2.0,
    show_default=True,
    help="Seconds before the 2nd attempt; doubles.",
)
@option("max_retries", type=int, default=6, show_default=True, help="Retries of one model request.")
@option("retry_budget", type=float, default=900.0, show_default=True, help="Seconds one request may retry.")
@option("max_concurrent_requests", type=int, default=None, help="Model requests in flight at most.")
@option("max_rpm", type=float, default=None, help="Model requests per minute at most.")
@option("max_tpm", type=float, default=None, help="Tokens per minute at most (estimated before each call).")
@option("max_cost", type=float, default=None, help="Stop starting sessions once the run has cost this much.")
@option(
    "transport",
    type=click.Choice(["aiohttp", "sdk", "builtin"]),
    default="aiohttp",
    show_default=True,
    help="How model requests are sent: aiohttp (honours HTTP(S)_PROXY/NO_PROXY) or the openai "
    "SDK's own path; 'builtin' (retired) is taken as aiohttp with a warning.",
)
@option("request_timeout", type=float, default=600.0, show_default=True, help="Seconds per model request.")
@option("sandbox_lifetime", type=float, default=3600.0, show_default=True, help="Seconds a sandbox may live.")
@option("tool_output_cap", type=int, default=16384, show_default=True, help="Bytes of tool output kept.")
@option("filter", "filters", multiple=True, help="Enable a filter that is off by default.")
@option("no_filter", "disabled_filters", multiple=True, help="Disable a filter.")
@option("writer", "writers", multiple=True, help="Output writer(s); default sharegpt.")
@option("list_distributions", is_flag=True, help="List toolset distributions and exit.")
@click.pass_context
def run(ctx: click.Context, **flags: Any) -> None:
    """Run every prompt of DATASET_FILE through an agent session and write the run directory."""
    host = load_host(ctx)
    if flags.pop("list_distributions"):
        print_distributions(host)
        return
    config_path = flags.pop("config")
    try:
        from_file = read_config_file(config_path) if config_path else {}
    except ConfigFileError as exc:
        raise click.UsageError(str(exc)) from None
    explicit = {name for name in flags if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT}
    if ctx.get_parameter_source("api_key") is ParameterSource.COMMANDLINE:
        log.warning(
            "--api_key: the key is visible to every process of this machine; "
            "prefer the environment or --api_key_file"
        )
    for key in ("filters", "disabled_filters", "writers"):
        flags[key] = list(flags[key])
    settings = {**flags, **{k: v for k, v in from_file.items() if k not in explicit}}
    for required in ("dataset_file", "run_name"):
        if not settings.get(required):
            raise click.UsageError(f"--{required} is required (on the command line or in --config)")
    prefill = settings.pop("prefill_messages_file", None)
    settings["prefill_messages"] = read_prefill(Path(prefill)) if prefill else []
    if settings.get("system_prompt") is None:
        settings.pop("system_prompt", None)
    try:
        config = RunConfig(**settings)
    except ValidationError as exc:
        where = {k: f"{config_path}: {k}" for k in from_file if k not in explicit}
        raise click.UsageError(_describe(exc, where)) from None
    ctx.exit(execute(config, host))


def execute(config: RunConfig, host: PluginHost) -> int:
    """Run and report; returns the process exit code."""
    from trajkit.dataset import DatasetError
    from trajkit.model import ModelConfigError
    from trajkit.rundir import RunIOError, RunLocked
    from trajkit.runner import EXIT_IO, EXIT_LOCKED, EXIT_USAGE, RunError, Runner

    _wait_for_children_in_the_loop()
    _raise_open_file_limit()
    try:
        runner = Runner(config, host)
        outcome = asyncio.run(runner.run())
    except (RunError, PluginError, ModelConfigError, DatasetError) as exc:
        click.echo(f"error: {exc}", err=True)
        return EXIT_USAGE
    except RunLocked as exc:
        click.echo(f"error: {exc}", err=True)
        return EXIT_LOCKED
    except (RunIOError, OSError) as exc:
        if not isinstance(exc, RunIOError):
            exc = RunIOError.of(exc, config.run_dir)
        click.echo(f"error: {exc}", err=True)
        click.echo(f"once that is fixed, continue with: {_resume_command(config)}", err=True)
        return EXIT_IO
    stats = outcome.statistics
    click.echo(
        f"{config.run_dir}: {stats['done']}/{stats['dataset_rows']} rows done, {stats['kept']} kept, "
        f"{stats['rejected']} rejected, {stats['pending']} pending"
        + (f", {len(outcome.row_errors)} invalid rows" if outcome.row_errors else ""),
        err=True,
    )
    if stats["pending"] or runner.interrupted:
        click.echo(f"to finish: {_resume_command(config)}", err=True)
    return outcome.exit_code


def _resume_command(config: RunConfig) -> str:
    return (
        f"trajkit run --dataset_file {config.dataset_file} --run_name {config.run_name} "
        f"--output_dir {config.output_dir} --resume"
    )


def _wait_for_children_in_the_loop() -> None:
    """Before Python 3.12, asyncio waits for each child process in a thread of its own; a pidfd
    watcher waits in the event loop instead, a third less CPU per command (BENCHMARKS.md)."""
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return  # 3.12 chooses pidfd by itself
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return
    asyncio.set_child_watcher(asyncio.PidfdChildWatcher())


def _raise_open_file_limit() -> None:
    """Every session holds a few descriptors (a connection, pipes, files): at hundreds in flight the
    common soft limit of 1024 runs out, so take as many as the hard limit allows."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def read_prefill(path: Path) -> list[dict[str, Any]]:
    try:
        messages = json.loads(path.read_text())
    except ValueError as exc:
        raise click.BadParameter(f"{path}: invalid JSON: {exc}") from None
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and m.get("role") in {"system", "user", "assistant"} and "content" in m
        for m in messages
    ):
        raise click.BadParameter(f"{path}: expected a JSON list of {{role, content}} messages")
    return messages


def _describe(exc: ValidationError, where: dict[str, str]) -> str:
    """Each problem with its place: the flag, or the file and key it came from."""
    problems = []
    for error in exc.errors():
        path = ".".join(map(str, error["loc"]))
        top = str(error["loc"][0]) if error["loc"] else ""
        place = f"{where[top]}{path[len(top) :]}" if top in where else f"--{path}"
        problems.append(f"{place}: {error['msg']}")
    return "; ".join(problems)


def print_distributions(host: PluginHost) -> None:
    for name, distribution in sorted(host.distributions.items()):
        shares = ", ".join(f"{ts} {p:.0%}" for ts, p in sorted(distribution.probabilities.items()))
        click.echo(f"{name:16} {shares}  ({distribution.description})")


@cli.command()
@click.pass_context
def distributions(ctx: click.Context) -> None:
    """List toolset distributions and their probabilities."""
    print_distributions(load_host(ctx))


@cli.command()
@click.pass_context
def plugins(ctx: click.Context) -> None:
    """List installed plugins, where they come from, and what each registers."""
    host = load_host(ctx)
    for name, plugin in sorted(host.pm.list_name_plugin(), key=lambda pair: pair[0]):
        hooks = sorted(h.name for h in host.pm.get_hookcallers(plugin) or [])
        click.echo(f"{name}  [{host.sources.get(name, '?')}]")
        click.echo(f"    hooks: {', '.join(hooks)}")
        for concern, names in host.registrations(plugin).items():
            click.echo(f"    {concern}: {', '.join(names)}")
    for error in host.load_errors:
        click.echo(f"BROKEN {error}")


@cli.command()
@click.argument("run_dir", type=click.Path(path_type=Path, exists=True, file_okay=False))
def status(run_dir: Path) -> None:
    """Where a run stands: done, rejected, failing, pending."""
    from trajkit.finalize import run_status
    from trajkit.rundir import RunIOError
    from trajkit.runner import EXIT_IO

    try:
        summary = run_status(run_dir)
    except (RunIOError, OSError) as exc:
        click.echo(f"error: {exc if isinstance(exc, RunIOError) else RunIOError.of(exc, run_dir)}", err=True)
        sys.exit(EXIT_IO)
    problems = summary.pop("problems")
    for key, value in summary.items():
        click.echo(f"{key:18} {value}")
    for problem in problems:
        click.echo(f"bad ledger line: {problem} (its prompt runs again on --resume)")


@cli.group()
def sandbox() -> None:
    """Sandbox maintenance."""


@sandbox.command()
@click.option("--backend", "names", multiple=True, help="Only these backends (default: all installed).")
@click.option("--run-id", default=None, help="Remove every sandbox of this run id, alive or not.")
@click.pass_context
def reap(ctx: click.Context, names: tuple[str, ...], run_id: str | None) -> None:
    """Remove sandboxes left behind by crashed runs."""
    host = load_host(ctx.find_root())

    async def reap_all() -> None:
        for name in names or sorted(host.backends):
            try:
                backend = host.backend(name)()
                removed = await backend.reap(run_id)
                await backend.aclose()
            except Exception as exc:
                click.echo(f"{name}: {exc}", err=True)
                continue
            click.echo(f"{name}: removed {removed}")

    asyncio.run(reap_all())


def main() -> None:
    cli(prog_name="trajkit")
