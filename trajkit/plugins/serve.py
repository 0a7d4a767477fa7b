"""``trajkit serve``: the agent behind an OpenAI-compatible API (see :mod:`trajkit.serve`).

The run's settings that apply to a served session (model, endpoint, toolsets, sandbox, turns,
prompts, filters and writers for ``--record``) come from the same flags and the same
configuration file keys as ``trajkit run``; the server's own settings are added beside them.

Every ``trajkit`` command loads this plugin, so :mod:`trajkit.serve.settings` (a pydantic model) is
imported only when ``trajkit serve`` builds its flags or its settings.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

from trajkit import hookimpl
from trajkit.cli import configure, load_host, read_given
from trajkit.config.cli_options import PluginCommand, SettingOption, model_options, plugin_options, spellings
from trajkit.config.run_config import RunConfig
from trajkit.manager import PluginHost

log = logging.getLogger("trajkit")

EXIT_USAGE, EXIT_LOCKED = 2, 75


# The run's settings a served session uses; the others (dataset, run directory, workers...) are
# the server's business or mean nothing for one request.
RUN_SETTINGS = (
    "model", "distribution", "toolsets", "disabled_toolsets", "sandbox", "max_turns", "system_prompt", "ephemeral_system_prompt",
    "tool_timeout", "tool_output_cap", "sandbox_lifetime", "filters", "disabled_filters", "seed",
)  # fmt: skip


@hookimpl
def trajkit_commands(cli: click.Group) -> None:
    cli.add_command(serve)


def serve_params(host: PluginHost) -> list[click.Parameter]:
    from trajkit.serve.settings import ServeSettings

    own = model_options(ServeSettings, group="Serve")
    core = model_options(RunConfig, group="Session", skip=set(RunConfig.model_fields) - set(RUN_SETTINGS))
    taken = {opt for param in [*own, *core] for opt in param.opts}
    plugins = [p for p in plugin_options(host) if not taken & set(p.opts)]
    files = [
        SettingOption(
            [*spellings(name), name], group="Serve", default=None,
            type=click.Path(path_type=Path, exists=True, dir_okay=False), help=text,
        )
        for name, text in (
            ("config", "TOML or YAML file: the keys of `trajkit run` that apply, and these; flags override it."),
            ("server_key_file", "A file holding the bearer key clients must send (default: $TRAJKIT_SERVER_KEY)."),
            ("prefill_messages_file", "JSON list of few-shot messages; used, never saved."),
        )
    ]  # fmt: skip
    return [*files, *own, *core, *plugins]


@click.command(cls=PluginCommand, plugin_params=lambda host, _command: serve_params(host))
@click.pass_context
def serve(ctx: click.Context, **flags: Any) -> None:
    """Serve the agent as an OpenAI-compatible chat completions API."""
    host = load_host(ctx.find_root())
    config, settings = build_settings(ctx, host, flags)
    ctx.exit(run_server(config, settings, host))


def build_settings(ctx: click.Context, host: PluginHost, flags: dict[str, Any]) -> tuple[RunConfig, Any]:
    """The run configuration and the server settings, flags over the configuration file."""
    from trajkit.config.resolve import describe_errors
    from trajkit.serve.settings import ServerKeyError, ServeSettings, check_exposure, read_server_key

    key_file = flags.pop("server_key_file", None)
    given, places = read_given(ctx, flags)
    served = {k: given.pop(k) for k in list(given) if k in ServeSettings.model_fields}
    try:
        serve_settings = ServeSettings(
            **served, server_key=read_server_key(Path(key_file) if key_file else None)
        )
        warning = check_exposure(serve_settings)
    except ServerKeyError as exc:
        raise click.UsageError(str(exc)) from None
    except ValidationError as exc:
        raise click.UsageError(describe_errors(exc, lambda key: places.get(key, f"--{key}"))) from None
    if warning:
        log.warning("%s", warning)
    # No model call outlasts its request: every client's own --NAME.request_timeout gives way too.
    given["request_timeout"] = serve_settings.request_timeout
    for client in (given.get("model_options") or {}).values():
        client.pop("request_timeout", None)
    # Sessions in flight: the model client sizes its connection pool from this.
    given["num_workers"] = serve_settings.max_concurrent
    if serve_settings.record is not None:
        given["output_dir"], given["run_name"] = serve_settings.record.parent, serve_settings.record.name
        places["run_name"] = "--record (the directory's name)"
    return configure(host, given, places), serve_settings


def run_server(config: RunConfig, settings: Any, host: Any) -> int:
    """Serve until stopped; returns the exit code."""
    from trajkit.manager import PluginError
    from trajkit.model import ModelConfigError
    from trajkit.run.files import RunIOError
    from trajkit.run.lock import RunLocked
    from trajkit.run.runner import RunError
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
