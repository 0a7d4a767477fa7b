"""trajkit's HTML pages (``trajkit report``, ``trajkit compare``): each one self-contained file.

The markup is jinja2 templates (``trajkit/plugins/report/templates``: ``page.html``, the frame every page
extends, holding the Content-Security-Policy that forbids every fetch), the style and the shared
scripts are static files (``trajkit/plugins/report/static``), all package data and all inlined, and the
page's data is embedded as JSON its script reads.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import jinja2


def embed_json(data: Any) -> str:
    """JSON safe inside ``<script type="application/json">``: no ``<``, ``>`` or ``&`` left raw.

    ``</script>`` (or ``<!--``) in a prompt would otherwise end the element early and let the rest
    of the data be parsed as markup; the ``\\u003c`` escapes parse back to the same string.
    """
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


@functools.cache
def asset(name: str) -> str:
    """A file of the pages' style and scripts (``trajkit/plugins/report/static``)."""
    return (
        importlib.resources.files("trajkit.plugins.report")
        .joinpath("static", name)
        .read_text(encoding="utf-8")
    )


@functools.cache
def templates() -> jinja2.Environment:
    import jinja2

    return jinja2.Environment(
        loader=jinja2.PackageLoader("trajkit.plugins.report", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )


def render_page(
    template: str,
    *,
    title: str,
    data_id: str,
    data: Any,
    styles: list[str],
    scripts: list[str],
    **context: Any,
) -> str:
    """A page from its template: the static ``styles`` and ``scripts`` inlined, ``data`` embedded as
    JSON in the element ``data_id``; everything else in ``context`` is escaped by jinja2."""
    from markupsafe import Markup

    return (
        templates()
        .get_template(template)
        .render(
            title=title,
            data_id=data_id,
            # files of this package, and JSON made safe inside <script>: inserted as they are
            style=Markup("".join(asset(name) for name in styles)),
            script=Markup("".join(asset(name) for name in scripts)),
            embedded=Markup(embed_json(data)),
            **context,
        )
    )


def render_html(data: dict[str, Any]) -> str:
    """The ``trajkit report`` page."""
    return render_page(
        "report.html",
        title=f"trajkit report: {data['run']['name']}",
        data_id="report-data",
        data=data,
        styles=["page.css"],
        scripts=["page.js", "report.js"],
    )
