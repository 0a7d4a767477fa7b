"""The ``trajkit report`` page: one self-contained HTML file (inline CSS and JS, data as embedded JSON)."""

from __future__ import annotations

import html
import json
from typing import Any

from trajkit.plugins.report_script import SCRIPT


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
