"""``trajkit stats``: a run's statistics as rich tables, and the number formats they share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.table import Table

    from trajkit.plugins.report.run import RunFiles


def number(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.3f}".rstrip("0").rstrip(".")
    return f"{int(value):,}"


def percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"


def money(value: float | None) -> str:
    return "-" if value is None else f"${value:,.4f}"


def print_renderables(shown: Sequence[RenderableType]) -> None:
    """Print tables (and text) to stdout: rounded boxes on a terminal; piped or captured, plain
    ASCII without colour, wide enough that no row wraps."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    plain = not console.is_terminal
    if plain:
        console = Console(highlight=False, no_color=True, width=max(console.width, 120))
    for item in shown:
        if isinstance(item, Table):
            item.box = box.ASCII if plain else box.ROUNDED
        console.print(item)


def stats_tables(run: RunFiles) -> list[Table]:
    """Summary, failures by class (when any), tools, backends and the model client's counters."""
    s = run.statistics
    tables = [summary_table(run)]
    failures = s.get("failures") or {}
    if failures.get("failed_attempts_by_class"):
        tables.append(failures_table(failures))
    if failures.get("failed_for_good_rows"):
        tables.append(failed_for_good_table(failures))
    tables += [tools_table(s.get("tools") or {}), backends_table(s.get("backends") or {})]
    scores = s.get("scores") or {}
    if scores.get("scored"):
        tables.append(pass_rates_table(scores))
    tables.append(client_table(s.get("model_client") or {}))
    return tables


ALARMING = {
    "kept": "green",
    "rejected": "red",
    "pending": "yellow",
    "failing": "red",
    "failed for good": "red",
}
"""Summary rows coloured when their value is neither 0 nor missing."""


def summary_table(run: RunFiles) -> Table:
    summary = _table(f"run {run.statistics.get('run_name', run.run_dir.name)}", ("", "value"))
    for label, value in summary_rows(run):
        style = ALARMING.get(label) if value not in ("0", "-") else None
        summary.add_row(label, value, style=style)
    return summary


def summary_rows(run: RunFiles) -> list[tuple[str, str]]:
    s = run.statistics
    failures = s.get("failures") or {}
    tokens = s.get("tokens") or {}
    rows: list[tuple[str, str]] = [
        ("model", str(run.config.get("model", "-"))),
        ("dataset rows", number(s.get("dataset_rows"))),
        ("done", number(s.get("done"))),
        ("kept", number(s.get("kept"))),
        ("rejected", number(s.get("rejected"))),
        *((f"  rejected by {name}", number(n)) for name, n in (s.get("rejected_by_filter") or {}).items()),
        ("pending", number(s.get("pending"))),
        ("failing", number(failures.get("failing", 0))),
        *((f"  failing: {cls}", number(n)) for cls, n in (failures.get("failing_by_class") or {}).items()),
        ("failed for good", number(failures.get("failed_for_good", 0))),
        *(
            (f"  failed for good: {cls}", number(n))
            for cls, n in (failures.get("failed_for_good_by_class") or {}).items()
        ),
        ("failed attempts", number(failures.get("failed_attempts", 0))),
        ("completed / partial", f"{number(s.get('completed'))} / {number(s.get('partial'))}"),
        ("reasoning coverage", percent(s.get("reasoning_coverage"))),
        ("invocations", number(s.get("invocations"))),
        ("wall time", duration(s.get("wall_seconds"))),
        ("session time (sum)", duration(s.get("session_seconds"))),
        ("api calls", number(s.get("api_calls"))),
        ("tokens prompt", number(tokens.get("prompt"))),
        ("tokens completion", number(tokens.get("completion"))),
        ("tokens total", number(tokens.get("total"))),
        ("cost", money(s.get("cost"))),
        ("spent (every request, every invocation)", money((s.get("spent") or {}).get("cost"))),
        ("model requests sent", number((s.get("spent") or {}).get("requests"))),
        ("invalid tool calls", number(s.get("invalid_tool_calls"))),
        ("trajectories without a tool call", number(s.get("without_tool_calls"))),
    ]
    scores = s.get("scores") or {}
    if scores.get("scored"):
        rows.append(("passed / scored", f"{number(scores.get('passed'))} / {number(scores.get('scored'))}"))
        rows.append(("pass rate", percent(scores.get("pass_rate"))))
    if (s.get("samples_per_prompt") or 1) > 1:
        rows.insert(2, ("samples per prompt", number(s["samples_per_prompt"])))
    if s.get("bad_ledger_lines"):
        rows.append(("bad ledger lines (prompts ran again)", number(s["bad_ledger_lines"])))
    return rows


def _table(title: str, columns: tuple[str, ...]) -> Table:
    """A table whose first column is a name (left) and the others numbers (right)."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for position, column in enumerate(columns):
        table.add_column(column, justify="right" if position else "left")
    return table


def failures_table(failures: dict[str, Any]) -> Table:
    columns = ("error class", "failed attempts", "still failing", "failed for good")
    table = _table("failures by error class", columns)
    still = failures.get("failing_by_class") or {}
    final = failures.get("failed_for_good_by_class") or {}
    for cls, attempts in failures["failed_attempts_by_class"].items():
        table.add_row(cls, number(attempts), number(still.get(cls, 0)), number(final.get(cls, 0)))
    return table


def failed_for_good_table(failures: dict[str, Any]) -> Table:
    """The rows no attempt can finish with the run's settings, the first of them one by one."""
    rows = failures["failed_for_good_rows"]
    table = _table("rows that failed for good (no resume runs them again)", ("prompt", "error class"))
    table.add_column("message", justify="left")
    for row in rows:
        table.add_row(
            str(row.get("prompt_index")), str(row.get("error_class")), str(row.get("message"))[:300]
        )
    more = int(failures.get("failed_for_good", len(rows))) - len(rows)
    if more > 0:
        table.add_row("...", f"{more} more", "failures.jsonl lists them all")
    return table


def tools_table(tools: dict[str, Any]) -> Table:
    table = _table("tools", ("tool", "calls", "ok", "failed", "success rate"))
    for name, stat in sorted(tools.items(), key=lambda kv: (-kv[1].get("count", 0), kv[0])):
        table.add_row(
            name,
            number(stat.get("count")),
            number(stat.get("success")),
            number(stat.get("failure")),
            percent(stat.get("success_rate")),
        )
    return table


def pass_rates_table(scores: dict[str, Any]) -> Table:
    table = _table("pass rate of the rows' checks", ("group", "scored", "passed", "pass rate"))
    table.add_row(
        "all", number(scores.get("scored")), number(scores.get("passed")), percent(scores.get("pass_rate"))
    )
    for label, key in (("toolset", "by_toolset"), ("source", "by_source")):
        for name, group in (scores.get(key) or {}).items():
            table.add_row(
                f"{label} {name}",
                number(group.get("scored")),
                number(group.get("passed")),
                percent(group.get("pass_rate")),
            )
    return table


def backends_table(backends: dict[str, int]) -> Table:
    table = _table("backends", ("backend", "trajectories", "share"))
    total = sum(backends.values())
    for name, count in backends.items():
        table.add_row(name, number(count), percent(count / total if total else None))
    return table


def client_table(client: dict[str, Any]) -> Table:
    table = _table("model client (every invocation)", ("counter", "value"))
    for name, value in client.items():
        table.add_row(name, money(value) if name == "cost" else number(value))
    if not client:
        table.add_row("(none recorded)", "")
    return table
