"""``trajkit export``: render a run's kept trajectories again, with any output writer.

A run only writes the formats named with ``--writer``; deciding on another format later should not
mean running (and paying for) the run again. ``trajectories.jsonl`` holds every kept record in
dataset order (made from the ledger as it is now when the run's is not current, a run going on
included: :mod:`trajkit.run.view`), so any writer can be fed from it, and ``tools.json`` the tool schemas the model saw
(runs made before it take the installed plugins' schemas). The output appears atomically: it is written to
a temporary file beside the target and renamed into place, so a crash or a bad record never leaves
a half-written file where a trainer could pick it up.

``--format hf`` writes a directory instead: a Hugging Face dataset saved with ``save_to_disk`` and
its dataset card (:mod:`trajkit.plugins.export.hf`); ``--out`` names the directory.

``--chat_template T`` (repeatable) renders every row through the chat template it will be trained
with, adapts what the template needs, checks the rendering and leaves out, with its reason, a row
the template cannot express (:mod:`trajkit.plugins.export.chat_templates`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from trajkit import hookimpl
from trajkit.manager import PluginError, PluginHost
from trajkit.plugins.export.chat_templates.options import chat_template_options
from trajkit.record.writers import OutputWriter
from trajkit.run.files import RunIOError, atomic_replace
from trajkit.run.rundir import RunDir

HF_FORMAT = "hf"
"""The format that is no writer: a dataset directory (``save_to_disk``) with its card."""


@hookimpl
def trajkit_commands(cli: click.Group) -> None:
    cli.add_command(export)


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option(
    "--format",
    "format_name",
    default=None,
    help="Output writer, e.g. hermes, openai, parquet; or hf, a Hugging Face dataset directory with its card.",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="Output file, or directory for hf (default: the writer's file name, or hf_dataset, inside RUN_DIR).",
)
@click.option(
    "--push_to_hub",
    "push_repo",
    default=None,
    metavar="REPO",
    help="With --format hf: upload the dataset to this Hub dataset repository (needs a configured token).",
)
@chat_template_options
@click.pass_context
def export(
    ctx: click.Context,
    run_dir: Path,
    format_name: str | None,
    out: Path | None,
    push_repo: str | None,
    **template_options: Any,
) -> None:
    """Write the kept trajectories of RUN_DIR in another format, or rendered through chat templates."""
    host: PluginHost = ctx.find_root().obj
    run = RunDir(run_dir)
    writers = host.writers
    if template_options["chat_templates"]:
        if format_name not in (None, "openai") or push_repo is not None:
            raise click.BadParameter(
                "--chat_template writes openai messages (or --out_format text); it takes no other --format",
                param_hint="--format",
            )
        from trajkit.plugins.export.chat_templates.command import export_through_templates

        with kept_trajectories(run, host) as (source, _):
            export_through_templates(run, lambda: read_records(source), out, **template_options)
        return
    if format_name is None:
        raise click.BadParameter("give --format (or --chat_template)", param_hint="--format")
    if format_name not in writers and format_name != HF_FORMAT:
        names = ", ".join(sorted([*writers, HF_FORMAT]))
        raise click.BadParameter(f"unknown format {format_name!r}; formats: {names}", param_hint="--format")
    if push_repo is not None and format_name != HF_FORMAT:
        raise click.BadParameter("only --format hf can be pushed to the Hub", param_hint="--push_to_hub")
    if out is not None and out.is_dir() and format_name != HF_FORMAT:
        raise click.BadParameter(
            f"{out} is a directory; --format {format_name} writes a file", param_hint="--out"
        )
    with kept_trajectories(run, host) as (source, statistics):
        if format_name == HF_FORMAT:
            target = out if out is not None else run.hf_dataset_path
            export_hf_dataset(run, source, target, push_repo, statistics)
        else:
            export_file(run, source, writers[format_name], format_name, out)


@contextlib.contextmanager
def kept_trajectories(run_dir: RunDir, host: PluginHost) -> Iterator[tuple[Path, dict[str, Any] | None]]:
    """The run's kept trajectories (a ``trajectories.jsonl``) and statistics as its ledger stands
    now (:mod:`trajkit.run.view`: the run's own when its merge is current, else a merge of the
    ledger in a temporary directory, removed after the block), so a run going on exports too."""
    from trajkit.run.view import NotARun, current_outputs, read_run

    try:
        state = read_run(run_dir, host)
        with current_outputs(state, host) as (outputs, statistics):
            source = outputs.kept_path
            if not source.is_file():
                problem = state.problem or f"no {source.name} (a run without the sharegpt writer)"
                raise click.ClickException(f"{run_dir} has no kept trajectories to export: {problem}")
            yield source, statistics
    except (RunIOError, NotARun) as exc:
        raise click.ClickException(str(exc)) from None


def export_file(
    run_dir: RunDir, source: Path, writer_class: type[OutputWriter], format_name: str, out: Path | None
) -> None:
    """``trajectories.jsonl`` rendered by one writer into a file (by default in the run directory)."""
    try:
        writer = writer_class()
    except PluginError as exc:
        raise click.ClickException(str(exc)) from None
    from trajkit.run.finalize import offer_tool_schemas  # a run needs it only after its sessions

    offer_tool_schemas([writer], run_dir)
    target = out if out is not None else run_dir.output_path(writer.filename)
    try:
        rows = export_records(writer, read_records(source), target)
    except RunIOError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{target}: {rows} rows ({format_name})", err=True)


def export_hf_dataset(
    run_dir: RunDir,
    source: Path,
    target: Path,
    push_repo: str | None = None,
    statistics: dict[str, Any] | None = None,
) -> None:
    from trajkit.plugins.export import hf as hf_export  # datasets is imported only when it is used

    try:
        schemas = run_dir.tool_schemas()
        rows = hf_export.export_hf(read_records(source), run_dir, target, schemas, statistics)
        click.echo(f"{target}: {rows} rows (hf dataset, card in {target / 'README.md'})", err=True)
        if push_repo is not None:
            url = hf_export.push_to_hub(target, push_repo, f"trajkit export of {run_dir.name}: {rows} rows")
            click.echo(f"pushed to {push_repo}: {url}", err=True)
    except (hf_export.HFExportError, RunIOError) as exc:
        raise click.ClickException(str(exc)) from None


def export_records(writer: OutputWriter, records: Iterator[dict[str, Any]], target: Path) -> int:
    """Render ``records`` with ``writer`` into ``target`` atomically; return the number of rows."""
    with atomic_replace(target) as tmp:
        return writer.write(records, tmp)


def read_records(path: Path) -> Iterator[dict[str, Any]]:
    """The records of a ``trajectories.jsonl``, one at a time, so memory stays flat on large runs."""
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as exc:
                raise click.ClickException(f"{path}:{number}: not a JSON record ({exc})") from None
            if not isinstance(record, dict):
                raise click.ClickException(f"{path}:{number}: not a JSON object")
            yield record
