"""``trajkit stats`` and ``trajkit report``: a run directory, read back for the people who judge it.

Both read the run as its ledger stands (:mod:`trajkit.run.view`) and change nothing in it: they
work on a finished, running, killed, interrupted or copied run directory alike.

The report is one self-contained HTML file (inline CSS and JS, charts drawn as inline SVG by its own
script, a Content-Security-Policy that forbids every fetch) so it can be mailed, archived or opened
on a machine without network. Charts and totals cover every trajectory; only the conversations
embedded for browsing are capped, because a page holding a million conversations would not open.

This module registers the commands and stays small, because every ``trajkit`` process imports it;
the work is in :mod:`trajkit.plugins.report.run` (reading the run, the report's data),
:mod:`trajkit.plugins.report.tables` (the stats tables) and :mod:`trajkit.plugins.report.page` (the
page: a template and static files), imported when a command runs.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import click

from trajkit import hookimpl

DEFAULT_EMBEDDED = 2000
"""Conversations embedded in the report by default: enough to browse, small enough to open."""


@hookimpl
def trajkit_commands(cli: click.Group) -> None:
    cli.add_command(stats)
    cli.add_command(report)


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path, exists=True, file_okay=False))
def stats(run_dir: Path) -> None:
    """The statistics of a run as tables: outcome, tools, backends, model client."""
    from trajkit.plugins.report.run import opened_run
    from trajkit.plugins.report.tables import print_renderables, stats_tables
    from trajkit.run.rundir import RunDir

    with opened_run(RunDir(run_dir), click.get_current_context().find_root().obj) as run:
        tables = stats_tables(run)
    print_renderables(tables)


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option(
    "--out",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Where to write the page (default: RUN_DIR/report.html).",
)
@click.option(
    "--max-conversations",
    "--max_conversations",
    "max_conversations",
    type=click.IntRange(min=0),
    default=DEFAULT_EMBEDDED,
    show_default=True,
    help="Conversations embedded for browsing; charts always cover every trajectory.",
)
def report(run_dir: Path, out: Path | None, max_conversations: int) -> None:
    """Write a self-contained HTML report of a run: summary, charts and a trajectory browser."""
    from trajkit.plugins.report.page import render_html
    from trajkit.plugins.report.run import opened_run, report_data
    from trajkit.run.rundir import RunDir

    run_files = RunDir(run_dir)
    with opened_run(run_files, click.get_current_context().find_root().obj) as run:
        data = report_data(run, max_conversations)
    target = out or run_files.report_path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render_html(data), encoding="utf-8")
    browse = data["browse"]
    click.echo(f"wrote {target} ({browse['total']} trajectories, {browse['embedded']} embedded for browsing)")
    if browse["note"]:
        click.echo(f"note: {browse['note']}", err=True)


_MOVED = {
    "trajkit.plugins.report.run": (
        "RunFiles opened_run report_data missing_kept_note histogram top_counts browser_entry "
        "TURN_CHARS HISTOGRAM_BINS TOP_REASONS"
    ),
    "trajkit.plugins.report.tables": "stats_tables number percent duration money",
    "trajkit.plugins.report.page": "render_html embed_json",
}
_HOME = {name: module for module, names in _MOVED.items() for name in names.split()}


def __getattr__(name: str) -> Any:
    """The names this module had before it was split, imported from their modules on first use."""
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
