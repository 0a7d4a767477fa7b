"""``trajkit stats`` and ``trajkit report``: a run directory, read back for the people who judge it.

Both read only the files a run leaves behind (``statistics.json``, ``run.json``, ``failures.jsonl``,
``trajectories.jsonl``, ``rejected.jsonl``), never the ledger, and change nothing: they work on a
finished, interrupted or copied run directory alike.

The report is one self-contained HTML file (inline CSS and JS, charts drawn as inline SVG by its own
script, a Content-Security-Policy that forbids every fetch) so it can be mailed, archived or opened
on a machine without network. Charts and totals cover every trajectory; only the conversations
embedded for browsing are capped, because a page holding a million conversations would not open.
"""

from __future__ import annotations

import heapq
import html
import json
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from trajkit import __version__, hookimpl
from trajkit.rundir import (
    FAILURES_FILE,
    KEPT_FILE,
    MANIFEST_FILE,
    REJECTED_FILE,
    RunIOError,
    read_json_object,
    read_statistics,
)

if TYPE_CHECKING:
    from rich.table import Table

REPORT_FILE = "report.html"

DEFAULT_EMBEDDED = 2000
"""Conversations embedded in the report by default: enough to browse, small enough to open."""
TURN_CHARS = 20_000
"""Characters of one turn's text kept in the report; tool output can be far longer and adds little."""
HISTOGRAM_BINS = 20
TOP_REASONS = 12


@hookimpl
def trajkit_commands(cli: click.Group) -> None:
    cli.add_command(stats)
    cli.add_command(report)


# -- reading a run directory ----------------------------------------------------------------------


@dataclass(frozen=True)
class RunFiles:
    """The summary files of one run directory."""

    run_dir: Path
    statistics: dict[str, Any]
    manifest: dict[str, Any]

    @property
    def config(self) -> dict[str, Any]:
        config: dict[str, Any] = self.manifest.get("config") or {}
        return config

    def failures(self) -> Iterator[dict[str, Any]]:
        return _read_jsonl(self.run_dir / FAILURES_FILE)

    def trajectories(self) -> Iterator[tuple[str, str | None, dict[str, Any]]]:
        """``(status, reason, record)`` for every kept and rejected trajectory, in dataset order.

        Both files are written in dataset order by the same merge, so a streaming merge on the
        prompt index interleaves them without holding either in memory.
        """
        kept = (("kept", None, r) for r in _read_jsonl(self.run_dir / KEPT_FILE))
        rejected = (
            ("rejected", str(line.get("reason") or ""), line["record"])
            for line in _read_jsonl(self.run_dir / REJECTED_FILE)
            if isinstance(line.get("record"), dict)
        )
        return heapq.merge(kept, rejected, key=lambda item: item[2].get("prompt_index", 0))


def load_run(run_dir: Path) -> RunFiles:
    """The run's statistics and manifest, or a usage error that says what is missing."""
    try:
        statistics = read_statistics(run_dir)
        manifest = read_json_object(run_dir / MANIFEST_FILE, {}, "showing the run without it") or {}
    except RunIOError as exc:
        raise click.ClickException(str(exc)) from None
    if statistics is None:
        raise click.ClickException(
            f"{run_dir} has no statistics.json (or a damaged one): not a trajkit run directory, or no "
            "invocation of the run has ended yet (statistics are written when an invocation stops; "
            "`trajkit run ... --resume` writes them again from the ledger)"
        )
    return RunFiles(run_dir, statistics, manifest)


def _read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    from trajkit.ledger import read_jsonl

    return read_jsonl(path)


# -- formatting -----------------------------------------------------------------------------------


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


# -- trajkit stats --------------------------------------------------------------------------------


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path, exists=True, file_okay=False))
def stats(run_dir: Path) -> None:
    """The statistics of a run as tables: outcome, tools, backends, model client."""
    from rich import box
    from rich.console import Console

    run = load_run(run_dir)
    console = Console(highlight=False)
    plain = not console.is_terminal
    if plain:  # piped or captured: plain ASCII, wide enough that no row wraps
        console = Console(highlight=False, no_color=True, width=max(console.width, 120))
    for table in stats_tables(run):
        table.box = box.ASCII if plain else box.ROUNDED
        console.print(table)


def stats_tables(run: RunFiles) -> list[Table]:
    from rich.table import Table

    s = run.statistics
    failures = s.get("failures") or {}
    tokens = s.get("tokens") or {}

    summary = Table(title=f"run {s.get('run_name', run.run_dir.name)}", title_justify="left")
    summary.add_column("")
    summary.add_column("value", justify="right")
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
    ]
    if s.get("bad_ledger_lines"):
        rows.append(("bad ledger lines (prompts ran again)", number(s["bad_ledger_lines"])))
    alarming = {"kept": "green", "rejected": "red", "pending": "yellow", "failing": "red"}
    for label, value in rows:
        style = alarming.get(label) if value not in ("0", "-") else None
        summary.add_row(label, value, style=style)
    tables = [summary]

    if failures.get("failed_attempts_by_class"):
        table = Table(title="failures by error class", title_justify="left")
        for column in ("error class", "failed attempts", "still failing"):
            table.add_column(column, justify="left" if column == "error class" else "right")
        still = failures.get("failing_by_class") or {}
        for cls, attempts in failures["failed_attempts_by_class"].items():
            table.add_row(cls, number(attempts), number(still.get(cls, 0)))
        tables.append(table)

    tools = s.get("tools") or {}
    table = Table(title="tools", title_justify="left")
    for column in ("tool", "calls", "ok", "failed", "success rate"):
        table.add_column(column, justify="left" if column == "tool" else "right")
    for name, stat in sorted(tools.items(), key=lambda kv: (-kv[1].get("count", 0), kv[0])):
        table.add_row(
            name,
            number(stat.get("count")),
            number(stat.get("success")),
            number(stat.get("failure")),
            percent(stat.get("success_rate")),
        )
    tables.append(table)

    backends = s.get("backends") or {}
    table = Table(title="backends", title_justify="left")
    for column in ("backend", "trajectories", "share"):
        table.add_column(column, justify="left" if column == "backend" else "right")
    total = sum(backends.values())
    for name, count in backends.items():
        table.add_row(name, number(count), percent(count / total if total else None))
    tables.append(table)

    client = s.get("model_client") or {}
    table = Table(title="model client (every invocation)", title_justify="left")
    table.add_column("counter")
    table.add_column("value", justify="right")
    for name, value in client.items():
        table.add_row(name, money(value) if name == "cost" else number(value))
    if not client:
        table.add_row("(none recorded)", "")
    tables.append(table)
    return tables


# -- trajkit report -------------------------------------------------------------------------------


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option(
    "--out",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help=f"Where to write the page (default: RUN_DIR/{REPORT_FILE}).",
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
    run = load_run(run_dir)
    data = report_data(run, max_conversations)
    target = out or run_dir / REPORT_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render_html(data), encoding="utf-8")
    browse = data["browse"]
    click.echo(f"wrote {target} ({browse['total']} trajectories, {browse['embedded']} embedded for browsing)")
    if browse["note"]:
        click.echo(f"note: {browse['note']}", err=True)


def report_data(run: RunFiles, limit: int) -> dict[str, Any]:
    """Everything the page shows, as one JSON-able object."""
    s = run.statistics
    api_calls: list[int] = []
    tokens: list[int] = []
    reasons: Counter[str] = Counter()
    embedded: list[dict[str, Any]] = []
    total = 0
    for status, reason, record in run.trajectories():
        total += 1
        api_calls.append(int(record.get("api_calls") or 0))
        tokens.append(int((record.get("usage") or {}).get("total_tokens") or 0))
        if reason is not None:
            reasons[reason] += 1
        if len(embedded) < limit:
            embedded.append(browser_entry(status, reason, record))

    failures = s.get("failures") or {}
    samples: dict[str, str] = {}
    for entry in run.failures():
        samples[str(entry.get("error_class", "unknown"))] = str(entry.get("message", ""))[:300]
    config = run.config
    return {
        "run": {
            "name": s.get("run_name", run.run_dir.name),
            "dir": str(run.run_dir),
            "model": config.get("model"),
            "distribution": config.get("distribution"),
            "dataset_file": config.get("dataset_file"),
            "trajkit_version": run.manifest.get("trajkit_version", __version__),
            "generated": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        },
        "statistics": s,
        "charts": {
            "tools": [
                {"name": name, "success": stat.get("success", 0), "failure": stat.get("failure", 0)}
                for name, stat in sorted(
                    (s.get("tools") or {}).items(), key=lambda kv: (-kv[1].get("count", 0), kv[0])
                )
            ],
            "api_calls": histogram(api_calls),
            "tokens": histogram(tokens),
            "failures": [
                {"name": cls, "attempts": n, "failing": (failures.get("failing_by_class") or {}).get(cls, 0)}
                for cls, n in (failures.get("failed_attempts_by_class") or {}).items()
            ],
            "failure_samples": samples,
            "rejections": top_counts(reasons, TOP_REASONS),
            "backends": [{"name": k, "count": v} for k, v in (s.get("backends") or {}).items()],
        },
        "browse": {
            "total": total,
            "embedded": len(embedded),
            "limit": limit,
            "items": embedded,
            "note": missing_kept_note(run),
        },
    }


def missing_kept_note(run: RunFiles) -> str | None:
    """Kept conversations are read from the ``sharegpt`` writer's file; a run without it has none to show."""
    if run.statistics.get("kept") and not (run.run_dir / KEPT_FILE).is_file():
        return (
            f"This run wrote no {KEPT_FILE} (run it with --writer sharegpt), so only rejected "
            "trajectories can be browsed here; the summary and charts still count every one."
        )
    return None


def histogram(values: list[int], bins: int = HISTOGRAM_BINS) -> list[dict[str, int]]:
    """Bins ``[lo, hi]`` (inclusive integers) with counts: one bin per value when few values differ."""
    if not values:
        return []
    low, high = min(values), max(values)
    width = max(1, math.ceil((high - low + 1) / bins))
    counts = Counter((v - low) // width for v in values)
    return [
        {"lo": low + i * width, "hi": low + (i + 1) * width - 1, "count": counts.get(i, 0)}
        for i in range((high - low) // width + 1)
    ]


def top_counts(counter: Counter[str], keep: int) -> list[dict[str, Any]]:
    top = counter.most_common(keep)
    rest = sum(counter.values()) - sum(n for _, n in top)
    items = [{"name": name, "count": n} for name, n in top]
    if rest:
        items.append({"name": f"{len(counter) - keep} other reasons", "count": rest})
    return items


def browser_entry(status: str, reason: str | None, record: dict[str, Any]) -> dict[str, Any]:
    """The part of one record the browser needs, long turn texts shortened."""
    usage = record.get("usage") or {}
    sandbox = record.get("sandbox") or {}
    metadata = {
        k: v for k, v in (record.get("metadata") or {}).items() if k not in {"batch_num", "timestamp"}
    }
    return {
        "index": record.get("prompt_index"),
        "work_id": record.get("work_id"),
        "status": status,
        "reason": reason,
        "backend": sandbox.get("backend"),
        "image": sandbox.get("image"),
        "tools": sorted(n for n, st in (record.get("tool_stats") or {}).items() if st.get("count")),
        "toolsets": record.get("toolsets_used") or [],
        "api_calls": record.get("api_calls"),
        "tokens": usage.get("total_tokens"),
        "cost": usage.get("cost"),
        "duration_s": record.get("duration_s"),
        "completed": record.get("completed"),
        "finish_reason": record.get("finish_reason"),
        "metadata": metadata,
        "turns": [_turn(t) for t in record.get("conversations") or []],
    }


def _turn(turn: dict[str, Any]) -> dict[str, Any]:
    shown: dict[str, Any] = {"from": turn.get("from"), "value": _clip(turn.get("value"))}
    if turn.get("reasoning"):
        shown["reasoning"] = _clip(turn["reasoning"])
    if turn.get("tool_calls"):
        shown["tool_calls"] = [
            {"id": c.get("id"), "name": c.get("name"), "arguments": _clip(c.get("arguments"))}
            for c in turn["tool_calls"]
        ]
    for key in ("tool_call_id", "name"):
        if turn.get(key):
            shown[key] = turn[key]
    return shown


def _clip(text: Any) -> str:
    text = "" if text is None else str(text)
    if len(text) <= TURN_CHARS:
        return text
    return f"{text[:TURN_CHARS]}\n… [{len(text) - TURN_CHARS:,} more characters not shown in the report]"


def embed_json(data: Any) -> str:
    """JSON safe inside ``<script type="application/json">``: no ``<``, ``>`` or ``&`` left raw.

    ``</script>`` (or ``<!--``) in a prompt would otherwise end the element early and let the rest
    of the data be parsed as markup; the ``\\u003c`` escapes parse back to the same string.
    """
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_html(data: dict[str, Any]) -> str:
    return (
        PAGE.replace("__TITLE__", html.escape(f"trajkit report: {data['run']['name']}"))
        .replace("__STYLE__", STYLE)
        .replace("__SCRIPT__", SCRIPT)
        .replace("__DATA__", embed_json(data))
    )


PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy"
  content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>__TITLE__</title>
<style>__STYLE__</style>
</head>
<body>
<header>
  <h1 id="title">trajkit report</h1>
  <div id="subtitle" class="muted"></div>
</header>
<main>
  <section id="summary" aria-label="run summary"></section>
  <section id="charts" aria-label="charts"></section>
  <section id="browser" aria-label="trajectories">
    <h2>Trajectories</h2>
    <div class="toolbar">
      <input id="search" type="search" placeholder="Search prompts, answers, reasoning, tool calls…"
        aria-label="search">
      <label>status <select id="status-filter"></select></label>
      <label>tool <select id="tool-filter"></select></label>
      <label>backend <select id="backend-filter"></select></label>
      <span id="shown-count" class="muted"></span>
    </div>
    <p id="cap-note" class="note" hidden></p>
    <div class="panes">
      <ol id="traj-list"></ol>
      <article id="detail"></article>
    </div>
  </section>
</main>
<script type="application/json" id="report-data">__DATA__</script>
<script>__SCRIPT__</script>
</body>
</html>
"""

STYLE = """
:root { --ok: #2e9d57; --bad: #d24545; --warn: #d88a1c; --accent: #3b6fd4; --ink: #1d2430;
  --muted: #6b7585; --line: #dde2ea; --bg: #f5f7fa; --card: #fff; --reason: #7a4fc9; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif;
  color: var(--ink); background: var(--bg); }
header { padding: 18px 28px 8px; }
h1 { margin: 0; font-size: 22px; }
h2 { font-size: 17px; margin: 0 0 10px; }
main { padding: 0 28px 28px; }
.muted { color: var(--muted); }
.note { background: #fff7e6; border: 1px solid #f1d29a; padding: 6px 10px; border-radius: 6px; }
#summary { display: grid; grid-template-columns: repeat(auto-fill, minmax(150px, 1fr)); gap: 10px;
  margin: 12px 0 18px; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 10px 12px; }
.card .label { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .03em; }
.card .value { font-size: 20px; font-weight: 600; margin-top: 2px; }
.card .value.ok { color: var(--ok); } .card .value.bad { color: var(--bad); }
.card .value.warn { color: var(--warn); }
#charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(420px, 1fr)); gap: 14px;
  margin-bottom: 22px; }
.chart { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 12px 14px; }
.chart h3 { margin: 0 0 8px; font-size: 14px; }
.chart svg { width: 100%; height: auto; display: block; }
.chart .empty { color: var(--muted); font-style: italic; padding: 16px 0; }
svg text { font: 11px system-ui, "DejaVu Sans", sans-serif; fill: var(--ink); }
svg text.dim { fill: var(--muted); }
svg .ok { fill: var(--ok); } svg .bad { fill: var(--bad); } svg .neutral { fill: var(--accent); }
svg .warn { fill: var(--warn); } svg .axis { stroke: var(--line); }
.legend { font-size: 12px; color: var(--muted); margin-top: 4px; }
.legend i { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin: 0 4px 0 10px; }
.toolbar { display: flex; flex-wrap: wrap; gap: 10px; align-items: center; margin-bottom: 10px; }
.toolbar input { flex: 1 1 320px; padding: 7px 10px; border: 1px solid var(--line); border-radius: 6px;
  font: inherit; }
.toolbar select { padding: 5px; font: inherit; border: 1px solid var(--line); border-radius: 6px; }
.panes { display: grid; grid-template-columns: minmax(260px, 34%) 1fr; gap: 14px; height: 78vh;
  min-height: 480px; }
#traj-list { list-style: none; margin: 0; padding: 0; overflow-y: auto; background: var(--card);
  border: 1px solid var(--line); border-radius: 8px; }
#traj-list li { padding: 8px 12px; border-bottom: 1px solid var(--line); cursor: pointer; }
#traj-list li:hover { background: #f0f4fb; }
#traj-list li.selected { background: #e4ecfb; box-shadow: inset 3px 0 0 var(--accent); }
#traj-list .prompt { white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
#traj-list .meta { font-size: 12px; color: var(--muted); }
.badge { display: inline-block; font-size: 11px; padding: 0 6px; border-radius: 9px; margin-right: 6px;
  color: #fff; font-weight: 600; vertical-align: 1px; }
.badge.kept { background: var(--ok); } .badge.rejected { background: var(--bad); }
#detail { overflow-y: auto; background: var(--card); border: 1px solid var(--line); border-radius: 8px;
  padding: 14px 18px; }
#detail .reason { color: var(--bad); font-weight: 600; margin: 4px 0 8px; }
#detail dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; margin: 8px 0 14px;
  font-size: 13px; }
#detail dt { color: var(--muted); } #detail dd { margin: 0; }
.turn { border: 1px solid var(--line); border-left-width: 4px; border-radius: 6px; margin: 10px 0;
  padding: 8px 12px; }
.turn .role { font-size: 11px; font-weight: 700; text-transform: uppercase; letter-spacing: .05em;
  color: var(--muted); margin-bottom: 4px; }
.turn-system { border-left-color: #9aa4b2; background: #fafbfc; }
.turn-human { border-left-color: var(--accent); }
.turn-gpt { border-left-color: var(--ok); }
.turn-tool { border-left-color: var(--warn); background: #fffcf6; }
pre { margin: 0; white-space: pre-wrap; word-break: break-word;
  font: 12.5px/1.4 ui-monospace, "DejaVu Sans Mono", monospace; }
.text { white-space: pre-wrap; word-break: break-word; }
.reasoning { border-left: 3px solid var(--reason); background: #f6f1fd; color: #4b3382; font-style: italic;
  padding: 6px 10px; margin: 4px 0 8px; border-radius: 4px; white-space: pre-wrap; }
.reasoning::before { content: "reasoning"; display: block; font-style: normal; font-size: 11px;
  font-weight: 700; text-transform: uppercase; letter-spacing: .05em; color: var(--reason); }
.call { border: 1px dashed #b9c3d3; border-radius: 6px; margin-top: 6px; padding: 6px 10px; background: #f8fafd; }
.call .name { font-weight: 600; font-family: ui-monospace, "DejaVu Sans Mono", monospace; }
.call .bad-json { color: var(--bad); font-size: 12px; }
details > summary { cursor: pointer; color: var(--muted); }
"""

SCRIPT = r"""
"use strict";
const DATA = JSON.parse(document.getElementById("report-data").textContent);
const SVGNS = "http://www.w3.org/2000/svg";

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value; else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}
function svg(tag, attrs, text) {
  const node = document.createElementNS(SVGNS, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
  if (text !== undefined) node.textContent = text;
  return node;
}
const fmt = (n) => (n === null || n === undefined) ? "-" : Number(n).toLocaleString("en-US");
const pct = (x) => (x === null || x === undefined) ? "-" : (100 * x).toFixed(1) + "%";
function dur(s) {
  if (s === null || s === undefined) return "-";
  if (s < 60) return s.toFixed(1) + "s";
  const m = Math.floor(s / 60), h = Math.floor(m / 60);
  return h ? `${h}h ${String(m % 60).padStart(2, "0")}m` : `${m}m ${String(Math.round(s % 60)).padStart(2, "0")}s`;
}
const clipLabel = (t, n) => t.length > n ? t.slice(0, n - 1) + "…" : t;

// -- summary ------------------------------------------------------------------------------------
function renderSummary() {
  const run = DATA.run, s = DATA.statistics, f = s.failures || {}, tok = s.tokens || {};
  document.getElementById("title").textContent = "trajkit report: " + run.name;
  document.getElementById("subtitle").textContent = [
    run.model && ("model " + run.model), run.distribution && ("distribution " + run.distribution),
    run.dataset_file && ("dataset " + run.dataset_file), "trajkit " + run.trajkit_version,
    "generated " + run.generated].filter(Boolean).join(" · ");
  const cards = [
    ["dataset rows", fmt(s.dataset_rows)], ["done", fmt(s.done)], ["kept", fmt(s.kept), "ok"],
    ["rejected", fmt(s.rejected), s.rejected ? "bad" : ""], ["pending", fmt(s.pending), s.pending ? "warn" : ""],
    ["failing", fmt(f.failing || 0), f.failing ? "bad" : ""], ["failed attempts", fmt(f.failed_attempts || 0)],
    ["reasoning coverage", pct(s.reasoning_coverage)], ["api calls", fmt(s.api_calls)],
    ["tokens", fmt(tok.total)], ["cost", "$" + Number(s.cost || 0).toFixed(4)],
    ["spent", "$" + Number((s.spent || {}).cost || 0).toFixed(4)],
    ["wall time", dur(s.wall_seconds)], ["invocations", fmt(s.invocations)],
    ["invalid tool calls", fmt(s.invalid_tool_calls)],
  ];
  const box = document.getElementById("summary");
  for (const [label, value, cls] of cards) {
    box.append(el("div", {class: "card", "data-key": label},
      el("div", {class: "label"}, label), el("div", {class: "value " + (cls || "")}, value)));
  }
}

// -- charts -------------------------------------------------------------------------------------
function chartBox(id, title, legend) {
  const box = el("div", {class: "chart", id});
  box.append(el("h3", {}, title));
  document.getElementById("charts").append(box);
  if (legend) {
    const line = el("div", {class: "legend"});
    for (const [cls, text] of legend) line.append(el("i", {style: `background: var(--${cls})`}), text);
    box.legendLine = line;
  }
  return box;
}
function finish(box, root) {
  box.append(root);
  if (box.legendLine) box.append(box.legendLine);
}
function empty(box, text) { box.append(el("div", {class: "empty"}, text)); }

// Horizontal bars: rows of {label, parts: [{value, cls, title}], note}. Drawn at the box's own width
// so text keeps its size whatever the layout; long labels (rejection reasons) go above their bar.
const chartWidth = (box) => Math.max(320, box.clientWidth - 28);
function barsChart(box, rows, labelsAbove) {
  if (!rows.length) return empty(box, "nothing to show");
  const W = chartWidth(box), noteW = 110, rowH = labelsAbove ? 36 : 22, offset = labelsAbove ? 14 : 0;
  const labelW = labelsAbove ? 0 : Math.min(210, Math.round(W * 0.36));
  const barW = W - labelW - noteW, chars = Math.floor(((labelsAbove ? W : labelW) - 10) / 6.6);
  const max = Math.max(1, ...rows.map(r => r.parts.reduce((a, p) => a + p.value, 0)));
  const root = svg("svg", {viewBox: `0 0 ${W} ${rows.length * rowH + 6}`, role: "img"});
  rows.forEach((row, i) => {
    const y = 3 + i * rowH;
    const label = labelsAbove ? svg("text", {x: 0, y: y + 10}, clipLabel(row.label, chars))
      : svg("text", {x: labelW - 8, y: y + 14, "text-anchor": "end"}, clipLabel(row.label, chars));
    label.append(svg("title", {}, row.label));
    root.append(label);
    let x = labelW;
    for (const part of row.parts) {
      if (!part.value) continue;
      const w = Math.max(1, barW * part.value / max);
      const rect = svg("rect", {class: "bar " + part.cls, x, y: y + offset + 3, width: w, height: 15, rx: 2});
      rect.append(svg("title", {}, part.title));
      root.append(rect);
      x += w;
    }
    root.append(svg("text", {x: x + 6, y: y + offset + 14, class: "dim"}, row.note));
  });
  finish(box, root);
}

// Vertical histogram of integer bins {lo, hi, count}.
function histogramChart(box, bins, unit) {
  if (!bins.length) return empty(box, "no trajectories");
  const W = chartWidth(box), H = 190, left = 40, bottom = 34, top = 10;
  const plotW = W - left - 8, plotH = H - top - bottom;
  const max = Math.max(1, ...bins.map(b => b.count));
  const root = svg("svg", {viewBox: `0 0 ${W} ${H}`, role: "img"});
  root.append(svg("line", {class: "axis", x1: left, y1: top + plotH, x2: W - 8, y2: top + plotH}));
  root.append(svg("text", {x: left - 6, y: top + 8, "text-anchor": "end", class: "dim"}, fmt(max)));
  root.append(svg("text", {x: left - 6, y: top + plotH, "text-anchor": "end", class: "dim"}, "0"));
  const bw = plotW / bins.length;
  const every = Math.ceil(bins.length / 6);
  const range = (b) => b.lo === b.hi ? fmt(b.lo) : `${fmt(b.lo)}–${fmt(b.hi)}`;
  bins.forEach((b, i) => {
    const h = plotH * b.count / max, x = left + i * bw, w = Math.max(1, Math.min(bw - 2, 56));
    if (b.count) {
      const rect = svg("rect", {class: "bar neutral", x: x + (bw - w) / 2, y: top + plotH - h, width: w, height: h, rx: 1});
      rect.append(svg("title", {}, `${range(b)} ${unit}: ${fmt(b.count)} trajectories`));
      root.append(rect);
    }
    if (i % every === 0) {
      const at = b.lo === b.hi ? x + bw / 2 : x;  // a value under its bar, a range's start at its edge
      root.append(svg("text", {x: at, y: top + plotH + 14, "text-anchor": "middle", class: "dim"}, fmt(b.lo)));
    }
  });
  root.append(svg("text", {x: left + plotW / 2, y: H - 4, "text-anchor": "middle", class: "dim"},
    `${unit} per trajectory (trajectories on the vertical axis)`));
  finish(box, root);
}

function renderCharts() {
  const c = DATA.charts;
  const used = c.tools.filter(t => t.success + t.failure > 0);
  const unused = c.tools.length - used.length;
  const tools = chartBox("chart-tools", "Tool calls and success rate", [["ok", "succeeded"], ["bad", "failed"]]);
  barsChart(tools, used.map(t => {
    const n = t.success + t.failure;
    return {label: t.name, note: `${fmt(n)} · ${pct(t.success / n)} ok`, parts: [
      {value: t.success, cls: "ok", title: `${t.name}: ${fmt(t.success)} succeeded`},
      {value: t.failure, cls: "bad", title: `${t.name}: ${fmt(t.failure)} failed`}]};
  }));
  if (unused) tools.append(el("div", {class: "legend"}, `${unused} offered tools never called`));

  histogramChart(chartBox("chart-turns", "Turns (model calls) per trajectory"), c.api_calls, "api calls");
  histogramChart(chartBox("chart-tokens", "Tokens per trajectory"), c.tokens, "tokens");

  const failures = chartBox("chart-failures", "Failed attempts by error class",
    [["bad", "rows still failing"], ["warn", "other failed attempts"]]);
  const attempts = (n) => `${fmt(n)} attempt${n === 1 ? "" : "s"}`;
  barsChart(failures, c.failures.map(f => ({label: f.name, note: attempts(f.attempts), parts: [
    {value: f.failing, cls: "bad", title: `${f.name}: ${fmt(f.failing)} rows still failing`},
    {value: f.attempts - f.failing, cls: "warn", title: `${f.name}: ${fmt(f.attempts - f.failing)} other failed attempts`}]})));
  for (const [cls, message] of Object.entries(c.failure_samples)) {
    failures.append(el("div", {class: "legend"}, `${cls}: ${clipLabel(message, 160)}`));
  }

  barsChart(chartBox("chart-rejections", "Rejections by reason"), c.rejections.map(r => ({
    label: r.name, note: fmt(r.count), parts: [{value: r.count, cls: "bad", title: `${r.name}: ${fmt(r.count)}`}]})), true);
  const total = c.backends.reduce((a, b) => a + b.count, 0);
  barsChart(chartBox("chart-backends", "Sandbox backends"), c.backends.map(b => ({
    label: b.name, note: `${fmt(b.count)} · ${pct(b.count / total)}`,
    parts: [{value: b.count, cls: "neutral", title: `${b.name}: ${fmt(b.count)} trajectories`}]})));
}

// -- trajectory browser -------------------------------------------------------------------------
const ITEMS = DATA.browse.items;
const state = {query: "", status: "", tool: "", backend: "", selected: null};

function haystack(t) {
  if (t._hay === undefined) {
    const parts = [String(t.index), t.work_id, t.reason || ""];
    for (const turn of t.turns) {
      parts.push(turn.value, turn.reasoning || "", turn.name || "");
      for (const call of turn.tool_calls || []) parts.push(call.name, call.arguments);
    }
    t._hay = parts.join("\n").toLowerCase();
  }
  return t._hay;
}
function firstPrompt(t) {
  const human = t.turns.find(turn => turn.from === "human");
  return human ? human.value : "(no prompt)";
}
function options(select, label, values, counts) {
  select.append(el("option", {value: ""}, `all ${label}`));
  for (const v of values) select.append(el("option", {value: v}, counts ? `${v} (${fmt(counts[v] || 0)})` : v));
}
function matches(t) {
  return (!state.status || t.status === state.status) &&
    (!state.tool || t.tools.includes(state.tool)) &&
    (!state.backend || t.backend === state.backend) &&
    (!state.query || haystack(t).includes(state.query));
}

function renderList() {
  const list = document.getElementById("traj-list");
  list.replaceChildren();
  const shown = ITEMS.filter(matches);
  for (const t of shown) {
    const item = el("li", {"data-index": t.index, "data-status": t.status, title: t.reason},
      el("div", {class: "prompt"}, el("span", {class: "badge " + t.status}, t.status),
        `#${t.index} `, firstPrompt(t)),
      el("div", {class: "meta"}, [`${fmt(t.api_calls)} calls`, `${fmt(t.tokens)} tokens`, t.backend,
        t.tools.join(", ") || "no tools"].join(" · ")));
    item.addEventListener("click", () => select(t));
    if (t === state.selected) item.classList.add("selected");
    list.append(item);
  }
  document.getElementById("shown-count").textContent = `${fmt(shown.length)} of ${fmt(ITEMS.length)} shown`;
  if (!shown.includes(state.selected)) select(shown[0] || null);
}

function select(t) {
  state.selected = t;
  for (const li of document.querySelectorAll("#traj-list li")) {
    li.classList.toggle("selected", t !== null && li.dataset.index === String(t.index) && li.dataset.status === t.status);
  }
  renderDetail(t);
}

function pretty(text) {
  try { return {text: JSON.stringify(JSON.parse(text), null, 2), ok: true}; }
  catch (e) { return {text, ok: false}; }
}
function renderTurn(turn) {
  const role = turn.from === "tool" ? `tool · ${turn.name || "?"} · ${turn.tool_call_id || ""}` : turn.from;
  const box = el("div", {class: "turn turn-" + turn.from}, el("div", {class: "role"}, role));
  if (turn.reasoning) box.append(el("div", {class: "reasoning"}, turn.reasoning));
  if (turn.from === "system") {
    box.append(el("details", {}, el("summary", {}, clipLabel(turn.value, 90)), el("div", {class: "text"}, turn.value)));
  } else if (turn.from === "tool") {
    const body = turn.value.trim().match(/^[[{]/) ? pretty(turn.value) : {text: turn.value};
    box.append(el("pre", {}, body.text));
  } else if (turn.value) {
    box.append(el("div", {class: "text"}, turn.value));
  }
  for (const call of turn.tool_calls || []) {
    const args = pretty(call.arguments);
    box.append(el("div", {class: "call"},
      el("div", {}, "→ ", el("span", {class: "name"}, call.name), el("span", {class: "muted"}, `  ${call.id}`)),
      args.ok ? null : el("div", {class: "bad-json"}, "arguments are not valid JSON:"),
      el("pre", {class: "args"}, args.text)));
  }
  return box;
}
function renderDetail(t) {
  const detail = document.getElementById("detail");
  detail.replaceChildren();
  if (!t) { detail.append(el("p", {class: "muted"}, "No trajectory matches.")); return; }
  detail.append(el("h2", {}, el("span", {class: "badge " + t.status}, t.status), `prompt #${t.index}`));
  if (t.reason) detail.append(el("div", {class: "reason"}, "rejected: " + t.reason));
  const facts = [["work id", t.work_id], ["completed", t.completed ? "yes" : "no (partial)"],
    ["finish reason", t.finish_reason], ["api calls", fmt(t.api_calls)], ["tokens", fmt(t.tokens)],
    ["cost", t.cost === null ? "not reported" : "$" + Number(t.cost).toFixed(5)], ["duration", dur(t.duration_s)],
    ["backend", t.backend + (t.image ? ` (${t.image})` : "")], ["toolsets", t.toolsets.join(", ")],
    ["tools called", t.tools.join(", ") || "none"]];
  for (const [k, v] of Object.entries(t.metadata)) facts.push([k, typeof v === "string" ? v : JSON.stringify(v)]);
  const dl = el("dl");
  for (const [k, v] of facts) dl.append(el("dt", {}, k), el("dd", {}, v));
  detail.append(dl);
  for (const turn of t.turns) detail.append(renderTurn(turn));
  detail.scrollTop = 0;
}

function renderBrowser() {
  const b = DATA.browse, notes = [];
  if (b.embedded < b.total) {
    notes.push(`Showing the first ${fmt(b.embedded)} of ${fmt(b.total)} trajectories (dataset order) ` +
      `to keep this page small; the summary and charts cover all of them. ` +
      `trajkit report --max-conversations N embeds more.`);
  }
  if (b.note) notes.push(b.note);
  if (notes.length) {
    const note = document.getElementById("cap-note");
    note.hidden = false;
    note.textContent = notes.join(" ");
  }
  const statusCounts = {}, tools = new Set(), backends = new Set();
  for (const t of ITEMS) {
    statusCounts[t.status] = (statusCounts[t.status] || 0) + 1;
    t.tools.forEach(x => tools.add(x));
    if (t.backend) backends.add(t.backend);
  }
  options(document.getElementById("status-filter"), "statuses", ["kept", "rejected"], statusCounts);
  options(document.getElementById("tool-filter"), "tools", [...tools].sort());
  options(document.getElementById("backend-filter"), "backends", [...backends].sort());
  const bind = (id, key, event) => document.getElementById(id).addEventListener(event, (e) => {
    state[key] = key === "query" ? e.target.value.trim().toLowerCase() : e.target.value;
    renderList();
  });
  bind("search", "query", "input");
  bind("status-filter", "status", "change");
  bind("tool-filter", "tool", "change");
  bind("backend-filter", "backend", "change");
  renderList();
}

renderSummary();
renderCharts();
renderBrowser();
document.body.dataset.ready = "1";
"""
