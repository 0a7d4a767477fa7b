"""``trajkit compare`` as tables: the comparison (:mod:`trajkit.plugins.compare.build`) as sections of
rows, one column per run, shown by the terminal (rich) and by the page (its template) alike."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trajkit.plugins.report.tables import duration, money, number, percent

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.table import Table

Entry = dict[str, Any]
"""One run's entry of the comparison."""
Figures = dict[str, Any]
Row = tuple[str, list[str]]
"""A metric's label and its value shown for each run."""


@dataclass(frozen=True)
class Section:
    """A table of metrics: one row per metric, one column per run."""

    id: str
    title: str
    columns: list[str]
    rows: list[list[str]]


def sections(data: dict[str, Any]) -> list[Section]:
    """The figures; then, where there is anything to show, sources, tool use and failures."""
    found = [figures_section(data)]
    if len(data["rows"]["scored_sources"]) > 1:
        found.append(sources_section(data))
    found.append(tools_section(data))
    if any(run["failures"]["failed_attempts"] for run in data["runs"]):
        found.append(failures_section(data))
    return found


def terminal_renderables(data: dict[str, Any]) -> list[RenderableType]:
    """What the terminal shows, in order: differences, runs, rows, then the sections."""
    from rich.text import Text

    shown: list[RenderableType] = []
    if data["differences"]:
        text = Text(DIFFERENCES_HEADING + "\n", style="bold yellow")
        for what, values in map(distinct, data["differences"]):
            text.append(f"  {what}: ", style="yellow")
            text.append(" · ".join(f"{label} {short(value)}" for label, value in values.items()) + "\n")
        shown.append(text)
    shown.append(runs_table(data))
    shown.append(Text(rows_sentence(data)))
    shown += [rich_table(section) for section in sections(data)]
    return shown


DIFFERENCES_HEADING = "These runs differ in what they offered (compared all the same):"


def distinct(difference: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A difference as shown: lists (of tools, of toolsets) without the items every run has."""
    values: dict[str, Any] = difference["values"]
    if not all(isinstance(v, list) for v in values.values()):
        return difference["what"], values
    common = set.intersection(*(set(v) for v in values.values()))
    if not common:
        return difference["what"], values
    beyond = f"{difference['what']} (beyond {short(sorted(common))})"
    return beyond, {label: [item for item in v if item not in common] for label, v in values.items()}


def short(value: Any, limit: int = 60) -> str:
    """A setting's value on one line."""
    if value is None:
        return "(not set)"
    if isinstance(value, list):
        text = ", ".join(map(str, value)) or "(none)"
    elif isinstance(value, dict):
        text = ", ".join(f"{k}={v}" for k, v in value.items()) or "(none)"
    else:
        text = str(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def run_state(run: Entry) -> str:
    return f"running ({run['running']})" if run["running"] else "not running"


def runs_table(data: dict[str, Any]) -> Table:
    from rich.table import Table

    table = Table(title="runs (the first is the baseline)", title_justify="left")
    for column in ("run", "model", "directory", "state"):
        table.add_column(column)
    table.add_column("trajectories", justify="right")
    for run in data["runs"]:
        table.add_row(
            run["label"],
            run["model"] or "-",
            run["dir"],
            run_state(run),
            number(run["trajectories_in_ledger"]),
            style="yellow" if run["running"] else None,
        )
    return table


def rows_sentence(data: dict[str, Any]) -> str:
    """Which prompts the figures cover, and what only some runs have."""
    parts = [f"{number(data['rows']['shared'])} prompts finished by every run are compared"]
    for run in data["runs"]:
        apart = run["apart"]
        if apart["prompts"]:
            passed = f", {apart['passed']} of {apart['scored']} passed" if apart["scored"] else ""
            parts.append(
                f"{run['label']} has {number(apart['prompts'])} more "
                f"({number(apart['trajectories'])} trajectories{passed})"
            )
        if apart["missing_prompts"]:
            failing = apart["missing_prompts_failing"]
            why = f", {failing} of them failing" if failing else ""
            parts.append(f"{run['label']} lacks {number(apart['missing_prompts'])} that others have{why}")
    return "; ".join(parts) + "."


def pass_rate(figures: Figures) -> str:
    interval = figures["pass_rate_interval"]
    if figures["pass_rate"] is None:
        return "-"
    return f"{percent(figures['pass_rate'])} [{percent(interval[0])}, {percent(interval[1])}]"


def points(fraction: float) -> str:
    """A difference of pass fractions in percentage points, signed."""
    return f"{100 * fraction:+.1f}"


def difference(entry: dict[str, Any] | None) -> str:
    if not entry or entry.get("difference") is None:
        return "-"
    low, high = entry["interval"]
    return f"{points(entry['difference'])} pts [{points(low)}, {points(high)}]"


def tally(entry: dict[str, Any] | None) -> str:
    if not entry or entry.get("difference") is None:
        return "-"
    return f"{entry['better']} · {entry['worse']} · {entry['same']}"


def at_k_rows(data: dict[str, Any], key: str, label: str) -> list[Row]:
    """pass@k (or pass^k) rows for k = 1, 2, 4, ... and the largest k any run has."""
    largest = max((len(run["figures"]["at_k"]) for run in data["runs"]), default=0)
    if largest < 2:
        return []
    rows = []
    for k in sorted({2**i for i in range(largest.bit_length()) if 2**i <= largest} | {largest}):
        cells = []
        for run in data["runs"]:
            found = next((a for a in run["figures"]["at_k"] if a["k"] == k), None)
            cells.append("-" if found is None else f"{percent(found[key])} ({number(found['prompts'])})")
        rows.append((f"{label}{k} (prompts)", cells))
    return rows


def figures_section(data: dict[str, Any]) -> Section:
    def row(label: str, show: Callable[[Figures], str]) -> Row:
        return label, [show(run["figures"]) for run in data["runs"]]

    def paired_row(label: str, show: Callable[[dict[str, Any] | None], str]) -> Row:
        return label, [show(run["paired"]) for run in data["runs"]]

    rows: list[Row] = [
        row("prompts · trajectories", lambda f: f"{number(f['prompts'])} · {number(f['trajectories'])}"),
        row("samples per prompt", samples),
        row("passed / scored", lambda f: f"{number(f['passed'])} / {number(f['scored'])}"),
        row("pass rate [95% Wilson]", pass_rate),
        *at_k_rows(data, "pass_at_k", "pass@"),
        *at_k_rows(data, "pass_hat_k", "pass^"),
        paired_row(f"vs {data['baseline']} [95%, paired]", difference),
        paired_row("  prompts better · worse · same", tally),
        row("completed", lambda f: percent(f["completed"])),
        row("turns / trajectory", lambda f: number(f["turns"])),
        row("tokens / trajectory", lambda f: number(f["tokens"]["total"])),
        row("  prompt · completion", lambda f: f"{number(f['tokens']['prompt'])} · {number(f['tokens']['completion'])}"),
        row("cost / trajectory", lambda f: money(f["cost_per_trajectory"])),
        row("cost / passed", lambda f: money(f["cost_per_passed"])),
        row("latency mean · median · p90", lambda f: latency(f["latency_s"])),
        ("still failing (work items)", [number(run["failures"]["failing"]) for run in data["runs"]]),
    ]  # fmt: skip
    title = f"figures on the {number(data['rows']['shared'])} prompts every run finished"
    return section("figures", title, data, rows)


def samples(figures: Figures) -> str:
    low, high = figures["samples_per_prompt"]["min"], figures["samples_per_prompt"]["max"]
    return number(low) if low == high else f"{number(low)}-{number(high)}"


def latency(found: dict[str, Any]) -> str:
    return " · ".join(duration(found[key]) for key in ("mean", "median", "p90"))


def sources_section(data: dict[str, Any]) -> Section:
    rows: list[Row] = []
    for source in data["rows"]["scored_sources"]:
        figures = [run["by_source"][source] for run in data["runs"]]
        paired = [(run["paired"] or {}).get("by_source", {}).get(source) for run in data["runs"]]
        rows += [
            (f"{source}: pass rate [95%]", [pass_rate(f) for f in figures]),
            (
                f"{source}: passed / scored",
                [f"{number(f['passed'])} / {number(f['scored'])}" for f in figures],
            ),
            (f"{source}: vs {data['baseline']}", [difference(p) for p in paired]),
        ]
    return section("sources", "by source", data, rows)


def tools_section(data: dict[str, Any]) -> Section:
    figures = [run["figures"] for run in data["runs"]]
    rows: list[Row] = [
        ("tool calls / trajectory", [number(f["tool_calls"]) for f in figures]),
        ("tool error rate", [percent(f["tool_error_rate"]) for f in figures]),
        ("invalid tool calls / trajectory", [number(f["invalid_tool_calls"]) for f in figures]),
    ]
    for toolset in sorted({name for f in figures for name in f["toolsets_offered"]}):
        rows.append(
            (
                f"toolset {toolset} offered",
                [
                    percent(f["toolsets_offered"].get(toolset, 0.0 if f["trajectories"] else None))
                    for f in figures
                ],
            )
        )
    for tool in sorted({name for f in figures for name in f["tools"]}):
        rows.append(
            (f"{tool}: calls / trajectory · error rate", [tool_cell(f["tools"].get(tool)) for f in figures])
        )
    return section("tools", "tool use", data, rows)


def tool_cell(found: dict[str, Any] | None) -> str:
    if found is None:
        return "-"
    return f"{number(found['calls_per_trajectory'])} · {percent(found['error_rate'])}"


def failures_section(data: dict[str, Any]) -> Section:
    failures = [run["failures"] for run in data["runs"]]
    rows: list[Row] = [
        (
            cls,
            [
                f"{number(f['failed_attempts_by_class'].get(cls, 0))} · {number(f['failing_by_class'].get(cls, 0))}"
                for f in failures
            ],
        )
        for cls in sorted({c for f in failures for c in f["failed_attempts_by_class"]})
    ]
    return section("failures", "failed attempts · work items still failing, by error class", data, rows)


def section(id: str, title: str, data: dict[str, Any], rows: list[Row]) -> Section:
    return Section(
        id, title, ["", *(run["label"] for run in data["runs"])], [[label, *cells] for label, cells in rows]
    )


def rich_table(found: Section) -> Table:
    from rich.table import Table

    table = Table(title=found.title, title_justify="left")
    for position, column in enumerate(found.columns):
        table.add_column(column, justify="right" if position else "left")
    for row in found.rows:
        table.add_row(*row)
    return table
