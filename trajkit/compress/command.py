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
from trajkit.manager import PluginError, PluginHost

log = logging.getLogger("trajkit")


@click.command()
@click.argument("source", metavar="INPUT", type=click.Path(path_type=Path, exists=True), required=False)
@option("out", type=click.Path(path_type=Path, dir_okay=False), help="Output JSONL file.")
@option("max_tokens", type=click.IntRange(min=1), help="Token budget of each trajectory.")
@option("strategy", default="mask_observations", show_default=True, help="Compressor to use.")
@option("option", "options", multiple=True, help="KEY=VALUE setting of the strategy, repeatable.")
@option(
    "tokenizer",
    default="estimate",
    show_default=True,
    help="A token counter's name, a tokenizer.json (or its directory) or a model id in the local HF cache.",
)
@option("tokenizer_option", "tokenizer_options", multiple=True, help="KEY=VALUE setting of the counter.")
@option("model", default="scripted", show_default=True, help="Summary model: 'scripted' (offline) or a slug.")
@option("base_url", default="https://openrouter.ai/api/v1", show_default=True)
@option(
    "api_key_file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="A file holding the API key (default: $OPENROUTER_API_KEY or $OPENAI_API_KEY).",
)
@option("request_timeout", type=float, default=300.0, show_default=True, help="Seconds per model request.")
@option("max_retries", type=int, default=4, show_default=True, help="Retries of one model request.")
@option("max_rpm", type=float, default=None, help="Model requests per minute at most.")
@option("concurrency", type=click.IntRange(min=1), default=16, show_default=True, help="Records in flight.")
@option(
    "record_timeout",
    type=float,
    default=900.0,
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


def _list(host: PluginHost) -> None:
    from trajkit.settings import describe_settings

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
