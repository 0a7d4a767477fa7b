"""The ``trajkit compare --html`` page: one self-contained file in the style of the report.

The markup is a jinja2 template (``templates/compare.html``): the differences, the runs and the
tables of :mod:`trajkit.plugins.compare_tables` are rendered there, escaped by jinja2. The charts
are drawn by ``static/compare.js`` from the comparison embedded as JSON; style and scripts are
the report's (``static/page.css``, ``static/page.js``) plus the page's own, all inline, so the page
fetches nothing and its Content-Security-Policy forbids every fetch.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from trajkit import __version__
from trajkit.plugins.compare_tables import (
    DIFFERENCES_HEADING,
    distinct,
    rows_sentence,
    run_state,
    sections,
    short,
)
from trajkit.plugins.report_page import asset, embed_json


def render_page(data: dict[str, Any]) -> str:
    import jinja2
    from markupsafe import Markup

    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("trajkit.plugins", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    environment.filters["short"] = short
    environment.filters["state"] = run_state
    template = environment.get_template("compare.html")
    return template.render(
        data=data,
        title="trajkit compare: " + " · ".join(run["label"] for run in data["runs"]),
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        version=__version__,
        differences_heading=DIFFERENCES_HEADING,
        differences=[distinct(difference) for difference in data["differences"]],
        rows_sentence=rows_sentence(data),
        sections=sections(data),
        # trusted files of this package and JSON made safe inside <script>: inserted as they are
        style=Markup(asset("page.css") + asset("compare.css")),
        script=Markup(asset("page.js") + asset("compare.js")),
        embedded=Markup(embed_json(data)),
    )
