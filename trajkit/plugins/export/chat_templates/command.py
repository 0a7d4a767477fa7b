"""Where the chat-template export reads and writes: the run's rows in, one output per template out.

One template: ``--out`` is the output file (default ``RUN_DIR/trajectories.FORMAT.NAME.jsonl``).
Several: ``--out`` is a directory (default RUN_DIR) holding one such file per template. Beside
each output, ``….left_out.jsonl`` lists the rows left out with their reasons, and a report
(``….report.json``; ``chat_templates.report.json`` for several) gives, per template, the rows
rendered, adapted by kind and left out by reason; the same table goes to stderr. Every file
appears atomically.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import click

from trajkit.run.files import RunIOError, atomic_replace, write_atomic
from trajkit.run.rundir import RunDir

REPORT_FILE = "chat_templates.report.json"


def export_through_templates(
    run_dir: RunDir,
    records: Callable[[], Iterator[dict[str, Any]]],
    out: Path | None,
    *,
    chat_templates: tuple[str, ...],
    chat_template_name: str | None,
    template_vars: Mapping[str, Any],
    out_format: str,
    split_parallel_calls: bool,
) -> list[dict[str, Any]]:
    """Render the run's rows through every template in ``chat_templates``; return the reports."""
    from trajkit.plugins.export.chat_templates.export import (
        TemplateExport,
        beside,
        output_name,
        report_json,
        report_table,
        write_template_export,
    )
    from trajkit.plugins.export.chat_templates.source import TemplateSourceError, load_chat_template
    from trajkit.plugins.export.writers import OpenAIWriter
    from trajkit.run.finalize import offer_tool_schemas

    try:
        templates = [load_chat_template(spec, chat_template_name) for spec in chat_templates]
        exports = [TemplateExport(t, template_vars, out_format, split_parallel_calls) for t in templates]
    except TemplateSourceError as exc:
        raise click.ClickException(str(exc)) from None
    several = len(templates) > 1
    if several and out is not None and out.exists() and not out.is_dir():
        raise click.BadParameter(
            f"{out} is a file; with several --chat_template, --out is a directory", param_hint="--out"
        )
    directory = (
        (out if several and out is not None else run_dir.path) if several or out is None else out.parent
    )
    writer = OpenAIWriter()
    offer_tool_schemas([writer], run_dir)
    reports = []
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for export in exports:
            target = (
                out
                if (out is not None and not several)
                else directory / output_name(export.template, out_format)
            )
            left_target = beside(target, "left_out.jsonl")
            with (
                atomic_replace(target) as tmp,
                atomic_replace(left_target) as left_tmp,
                tmp.open("wb") as rows,
                left_tmp.open("wb") as left,
            ):
                report = write_template_export(export, records(), writer.schemas_for, rows, left)
            reports.append({**report, "output": str(target), "left_out_file": str(left_target)})
        report_path = (
            directory / REPORT_FILE
            if several
            else target.with_name(target.name.removesuffix(".jsonl") + ".report.json")
        )
        write_atomic(report_path, report_json(reports))
    except (RunIOError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(report_table(reports), err=True)
    click.echo(f"report: {report_path}", err=True)
    return reports
