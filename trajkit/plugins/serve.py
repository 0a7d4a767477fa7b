"""``trajkit serve``: the agent behind an OpenAI-compatible API (see :mod:`trajkit.serve`).

The run's settings that apply to a served session (model, endpoint, toolsets, sandbox, turns,
prompts, filters and writers for ``--record``) come from the same flags and the same
configuration file keys as ``trajkit run``; the server's own settings are added beside them.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource
from pydantic import ValidationError

from trajkit import hookimpl
from trajkit.cli import _describe, comma_list, key_values, load_host, option, read_prefill
from trajkit.config import ConfigFileError, RunConfig, read_config_file
from trajkit.serve.settings import ServeSettings

log = logging.getLogger("trajkit")

EXIT_USAGE, EXIT_LOCKED = 2, 75


def default(name: str) -> Any:
    """A flag's default is the setting's own (one default in one place: the settings models)."""
    fields = ServeSettings.model_fields if name in ServeSettings.model_fields else RunConfig.model_fields
    return fields[name].default


@hookimpl
def trajkit_commands(cli: click.Group) -> None:
    cli.add_command(serve)


@click.command()
@option(
    "config",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    default=None,
    help="TOML or YAML file: the keys of `trajkit run` that apply, and these flags; flags override it.",
)
@option("model", default=default("model"), show_default=True, help="'scripted' (offline) or a model slug.")
@option("base_url", default=default("base_url"), show_default=True)
@option(
    "api_key_file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="A file holding the model's API key (default: $OPENROUTER_API_KEY or $OPENAI_API_KEY).",
)
@option(
    "distribution",
    default=default("distribution"),
    show_default=True,
    help="Toolset distribution sampled per request (unless --toolsets).",
)
@option("toolsets", callback=comma_list, help="Fixed toolsets for every request, comma-separated.")
@option("sandbox", default=default("sandbox"), show_default=True, help="Sandbox backend of the sessions.")
@option(
    "sandbox_option",
    "sandbox_options",
    multiple=True,
    callback=key_values,
    help="BACKEND.KEY=VALUE, repeatable.",
)
@option(
    "max_turns",
    type=int,
    default=default("max_turns"),
    show_default=True,
    help="Model calls per request at most.",
)
@option("system_prompt", default=None, help="System prompt for requests that bring none.")
@option("host", default=default("host"), show_default=True, help="Address to listen on.")
@option("port", type=int, default=default("port"), show_default=True)
@option(
    "server_key_file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="A file holding the bearer key clients must send (default: $TRAJKIT_SERVER_KEY).",
)
@option(
    "cors_origin",
    "cors_origins",
    multiple=True,
    help="An exact origin browser pages may call from; repeatable.",
)
@option(
    "max_concurrent",
    type=int,
    default=default("max_concurrent"),
    show_default=True,
    help="Requests in flight; more get 429.",
)
@option(
    "request_timeout",
    type=float,
    default=default("request_timeout"),
    show_default=True,
    help="Seconds one request may take.",
)
@option("max_body_bytes", type=int, default=default("max_body_bytes"), show_default=True)
@option(
    "record",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Record every served session in this run directory's ledger.",
)
@option(
    "tool_progress",
    type=click.Choice(["off", "sse", "inline"]),
    default=default("tool_progress"),
    show_default=True,
)
@option(
    "housekeeping",
    type=click.Choice(["on", "off"]),
    default=default("housekeeping"),
    show_default=True,
    help="Answer chat UIs' title/tag/follow-up requests with a plain model call.",
)
@option(
    "keepalive",
    type=float,
    default=default("keepalive"),
    show_default=True,
    help="Seconds of stream silence before a keepalive.",
)
@option("filter", "filters", multiple=True, help="With --record: enable a filter that is off by default.")
@option("no_filter", "disabled_filters", multiple=True, help="With --record: disable a filter.")
@click.pass_context
def serve(ctx: click.Context, **flags: Any) -> None:
    """Serve the agent as an OpenAI-compatible chat completions API."""
    host = load_host(ctx.find_root())
    config, settings = build_settings(ctx, flags)
    ctx.exit(run_server(config, settings, host))


def build_settings(ctx: click.Context, flags: dict[str, Any]) -> tuple[RunConfig, Any]:
    """The run configuration and the server settings, flags over the configuration file."""
    from trajkit.serve.settings import ServerKeyError, check_exposure, read_server_key

    config_path = flags.pop("config")
    try:
        from_file = read_config_file(config_path) if config_path else {}
    except ConfigFileError as exc:
        raise click.UsageError(str(exc)) from None
    explicit = {name for name in flags if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT}
    for key in ("cors_origins", "filters", "disabled_filters"):
        flags[key] = list(flags[key])
    settings = {**flags, **{k: v for k, v in from_file.items() if k not in explicit}}
    where = {k: f"{config_path}: {k}" for k in from_file if k not in explicit}
    key_file = settings.pop("server_key_file", None)
    served = {k: settings.pop(k) for k in list(settings) if k in ServeSettings.model_fields}
    try:
        serve_settings = ServeSettings(
            **served, server_key=read_server_key(Path(key_file) if key_file else None)
        )
        warning = check_exposure(serve_settings)
    except ServerKeyError as exc:
        raise click.UsageError(str(exc)) from None
    except ValidationError as exc:
        raise click.UsageError(_describe(exc, where)) from None
    if warning:
        log.warning("%s", warning)
    prefill = settings.pop("prefill_messages_file", None)
    settings["prefill_messages"] = (
        read_prefill(Path(prefill)) if prefill else settings.get("prefill_messages", [])
    )
    if settings.get("system_prompt") is None:
        settings.pop("system_prompt", None)
    settings["request_timeout"] = serve_settings.request_timeout  # no model call outlasts its request
    # Sessions in flight: the model client sizes its connection pool from this.
    settings["num_workers"] = serve_settings.max_concurrent
    if serve_settings.record is not None:
        settings["output_dir"], settings["run_name"] = (
            serve_settings.record.parent,
            serve_settings.record.name,
        )
        where["run_name"] = "--record (the directory's name)"
    try:
        return RunConfig(**settings), serve_settings
    except ValidationError as exc:
        raise click.UsageError(_describe(exc, where)) from None


def run_server(config: RunConfig, settings: Any, host: Any) -> int:
    """Serve until stopped; returns the exit code."""
    from trajkit.manager import PluginError
    from trajkit.model import ModelConfigError
    from trajkit.rundir import RunIOError, RunLocked
    from trajkit.runner import RunError
    from trajkit.serve.app import serve_until_stopped
    from trajkit.serve.service import ServedAgent

    try:
        agent = ServedAgent(config, settings, host)
        asyncio.run(serve_until_stopped(agent, settings))
    except (RunError, PluginError, ModelConfigError, ValueError, RunIOError) as exc:
        click.echo(f"error: {exc}", err=True)
        return EXIT_USAGE
    except RunLocked as exc:
        click.echo(f"error: {exc}", err=True)
        return EXIT_LOCKED
    except OSError as exc:  # the address is taken or cannot be had
        click.echo(
            f"error: cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}", err=True
        )
        return EXIT_USAGE
    return 0
