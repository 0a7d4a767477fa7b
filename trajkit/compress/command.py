"""``trajkit compress INPUT --out OUTPUT --max_tokens N``: the command, registered by a built-in plugin.

INPUT is a run directory (its kept trajectories, ``trajectories.jsonl``; never the ledger's batch
files, which would compress every record twice and mix in rejected ones) or any ShareGPT JSONL
file, the reference runner's included.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import click

from trajkit.cli import option
from trajkit.compress.step import CompressStep
from trajkit.config.cli_options import PluginCommand, given_settings, plugin_options
from trajkit.config.resolve import CONCERNS
from trajkit.manager import PluginError, PluginHost

log = logging.getLogger("trajkit")
STEP = CompressStep.model_fields  # one default per setting: the run's step and this command share them


@click.command(cls=PluginCommand, plugin_params=lambda host, command: client_params(host, command))
@click.argument("source", metavar="INPUT", type=click.Path(path_type=Path, exists=True), required=False)
@option("out", type=click.Path(path_type=Path, dir_okay=False), help="Output JSONL file.")
@option("max_tokens", type=click.IntRange(min=1), help="Token budget of each trajectory.")
@option("strategy", default=STEP["strategy"].default, show_default=True, help="Compressor to use.")
@option("option", "options", multiple=True, help="KEY=VALUE setting of the strategy, repeatable.")
@option(
    "tokenizer",
    default=STEP["tokenizer"].default,
    show_default=True,
    help="A token counter's name, a tokenizer.json (or its directory) or a model id in the local HF cache.",
)
@option("tokenizer_option", "tokenizer_options", multiple=True, help="KEY=VALUE setting of the counter.")
@option("model", default="scripted", show_default=True, help="Summary model: 'scripted' (offline) or a slug.")
@option(
    "concurrency",
    type=click.IntRange(min=1),
    default=STEP["concurrency"].default,
    show_default=True,
    help="Records in flight.",
)
@option(
    "record_timeout",
    type=float,
    default=STEP["record_timeout"].default,
    show_default=True,
    help="Seconds one record may take; past it the record is kept unchanged and flagged.",
)
@option("overwrite", is_flag=True, help="Start the output again (the summary cache is kept).")
@option("quiet", is_flag=True, help="No progress display and no table.")
@option(
    "list_strategies", is_flag=True, help="List strategies, token counters and their settings, then exit."
)
@click.pass_context
def compress(ctx: click.Context, **flags: Any) -> None:
    """Compress the trajectories of INPUT to --max_tokens tokens each, into --out."""
    host: PluginHost = ctx.find_root().obj
    if flags["list_strategies"]:
        _list(host)
        return
    for required in ("source", "out", "max_tokens"):
        if flags[required] is None:
            raise click.UsageError(f"{'INPUT' if required == 'source' else '--' + required} is required")
    from trajkit.compress.setup import SetupError, prepare

    flags["client_settings"] = given_settings(ctx, flags, {}, None)
    try:
        prepared = prepare(host, flags)
    except (SetupError, PluginError) as exc:
        raise click.UsageError(str(exc)) from None
    try:
        metrics = asyncio.run(prepared.run())
    except prepared.errors as exc:
        raise click.ClickException(str(exc)) from None
    if metrics.flagged:
        click.echo(
            f"{metrics.flagged} records could not be compressed and were kept unchanged "
            "(their compression.error says why)",
            err=True,
        )
    if prepared.incomplete:
        raise click.ClickException(prepared.incomplete)


def client_params(host: PluginHost, command: click.Command) -> list[click.Parameter]:
    """The summary model client's settings as flags, but for names the command uses itself
    (``--max_tokens`` is the budget here)."""
    own = {opt for param in command.params for opt in param.opts}
    clients = [concern for concern in CONCERNS if concern.bare_aliases]
    return [param for param in plugin_options(host, clients) if not own & set(param.opts)]


def _list(host: PluginHost) -> None:
    from trajkit.config.settings import describe_settings

    registries: list[tuple[str, dict[str, Any]]] = [
        ("strategies", dict(host.compressors)),
        ("token counters", dict(host.token_counters)),
    ]
    for title, registry in registries:
        click.echo(f"{title}:")
        for name, plugin in sorted(registry.items()):
            click.echo(f"  {name}: {plugin.description}")
            for line in describe_settings(plugin.Settings):
                click.echo(f"      {line}")
