"""The ``trajkit report`` page: one self-contained HTML file (inline CSS and JS, data as embedded JSON)."""

from __future__ import annotations

import functools
import html
import importlib.resources
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


@functools.cache
def asset(name: str) -> str:
    """A file of the pages' shared style and scripts (``trajkit/plugins/static``, package data)."""
    return importlib.resources.files("trajkit.plugins").joinpath("static", name).read_text(encoding="utf-8")


def render_html(data: dict[str, Any]) -> str:
    return (
        PAGE.replace("__TITLE__", html.escape(f"trajkit report: {data['run']['name']}"))
        .replace("__STYLE__", asset("page.css"))
        .replace("__SCRIPT__", asset("page.js") + SCRIPT)
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
