"""``trajkit compare``: runs of the same prompt suite side by side (models, settings, toolsets).

Each run is read from its ledger, so a run that is still going (or was killed) compares with what
it has so far. Rows are matched by prompt identity; pass rates carry Wilson intervals, runs with
several samples per prompt get pass@k and pass^k, and every run is paired with the first (the
baseline) on the prompts both scored. Output: rich tables, ``--json`` for scripts, ``--html FILE``
for a self-contained page with charts.

This module registers the command and stays small, because every ``trajkit`` process imports it;
the work is in :mod:`trajkit.plugins.compare.read` (a run directory),
:mod:`trajkit.plugins.compare.build` (the comparison), :mod:`trajkit.plugins.compare.stats`,
:mod:`trajkit.plugins.compare.tables` and :mod:`trajkit.plugins.compare.page`, imported when the
command runs.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import click

from trajkit import hookimpl


@hookimpl
def trajkit_commands(cli: click.Group) -> None:
    cli.add_command(compare)


@click.command()
@click.argument(
    "run_dirs", nargs=-1, required=True, type=click.Path(path_type=Path, exists=True, file_okay=False)
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print the comparison as JSON (for scripts) instead of tables."
)
@click.option(
    "--html",
    "page",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Also write the comparison as a self-contained HTML page with charts.",
)
def compare(run_dirs: tuple[Path, ...], as_json: bool, page: Path | None) -> None:
    """Compare runs of the same prompt suite: RUN_DIR RUN_DIR ... (the first is the baseline).

    Prompts are matched by identity (content, not line number); figures cover the prompts every
    run has finished, and what only some runs have is counted apart. Runs still going compare
    with what their ledger holds so far.
    """
    import json

    if len(run_dirs) < 2:
        raise click.UsageError("compare needs two or more run directories")
    seen: dict[Path, Path] = {}
    for run_dir in run_dirs:
        first = seen.setdefault(run_dir.resolve(), run_dir)
        if first is not run_dir:
            raise click.UsageError(f"{run_dir} is given twice")
    data = read_and_compare(run_dirs)
    if as_json:
        click.echo(json.dumps(data, indent=2, ensure_ascii=False))
    else:
        print_comparison(data)
    if page is not None:
        from trajkit.plugins.compare.page import render_comparison

        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text(render_comparison(data), encoding="utf-8")
        click.echo(f"wrote {page}", err=True)


def read_and_compare(run_dirs: tuple[Path, ...]) -> dict[str, Any]:
    """Read every run and compare them, saying what is being read on a terminal (a run of a
    million trajectories takes a minute or more)."""
    from rich.console import Console

    from trajkit.plugins.compare.build import compare_runs, run_labels
    from trajkit.plugins.compare.read import read_run

    console = Console(stderr=True)
    with console.status("", spinner="dots") if console.is_terminal else contextlib.nullcontext() as status:
        runs = []
        for position, run_dir in enumerate(run_dirs, 1):
            if status is not None:
                status.update(f"reading run {position} of {len(run_dirs)}: {run_dir}")
            runs.append(read_run(run_dir))
        if status is not None:
            status.update("comparing")
        return compare_runs(runs, run_labels(runs, run_dirs))


def print_comparison(data: dict[str, object]) -> None:
    from trajkit.plugins.compare.tables import terminal_renderables
    from trajkit.plugins.report.tables import print_renderables

    print_renderables(terminal_renderables(data))
