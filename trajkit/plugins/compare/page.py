"""The ``trajkit compare --html`` page: one self-contained file in the style of the report.

The markup is a jinja2 template (``templates/compare.html`` of this package, extending the
report's frame through :func:`trajkit.plugins.report.page.render_page`): the differences, the runs and the tables of
:mod:`trajkit.plugins.compare.tables` are rendered there, escaped by jinja2. The charts are drawn
by ``static/compare.js`` from the comparison embedded as JSON; style and helpers are the report's
(``page.css``, ``page.js``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from trajkit import __version__
from trajkit.plugins.compare.tables import (
    DIFFERENCES_HEADING,
    distinct,
    rows_sentence,
    run_state,
    sections,
    short,
)
from trajkit.plugins.report.page import render_page


def render_comparison(data: dict[str, Any]) -> str:
    return render_page(
        "compare.html",
        title="trajkit compare: " + " · ".join(run["label"] for run in data["runs"]),
        data_id="compare-data",
        data=data,
        styles=["page.css", "compare.css"],
        scripts=["page.js", "compare.js"],
        package="trajkit.plugins.compare",
        comparison=data,
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        version=__version__,
        differences_heading=DIFFERENCES_HEADING,
        differences=[
            (what, {label: short(value, 120) for label, value in values.items()})
            for what, values in map(distinct, data["differences"])
        ],
        rows_sentence=rows_sentence(data),
        sections=sections(data),
        state=[run_state(run) for run in data["runs"]],
    )
