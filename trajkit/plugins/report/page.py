"""trajkit's HTML pages (``trajkit report``, ``trajkit compare``): each one self-contained file.

The markup is jinja2 templates (``templates/page.html`` of this package, the frame every page
extends, holding the Content-Security-Policy that forbids every fetch; a page's own template in its
plugin's ``templates``), the style and the scripts are static files (``static``: the shared ones
here, a page's own in its plugin's), all package data and all inlined, and the page's data is
embedded as JSON its script reads.
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


SHARED = "trajkit.plugins.report"
"""The package of the frame every page extends and of the shared style and scripts."""


@functools.cache
def asset(package: str, name: str) -> str:
    """A file of a page's style and scripts: ``package``'s ``static/name``, else the shared one."""
    for source in dict.fromkeys((package, SHARED)):
        path = importlib.resources.files(source).joinpath("static", name)
        if path.is_file():
            return path.read_text(encoding="utf-8")
    raise FileNotFoundError(f"no static file {name!r} in {package} or {SHARED}")


@functools.cache
def templates(package: str) -> jinja2.Environment:
    """The templates of ``package``, then the shared ones (``page.html``)."""
    import jinja2

    loaders = [jinja2.PackageLoader(source, "templates") for source in dict.fromkeys((package, SHARED))]
    return jinja2.Environment(
        loader=jinja2.ChoiceLoader(loaders),
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
    package: str = SHARED,
    **context: Any,
) -> str:
    """A page from ``package``'s template: the static ``styles`` and ``scripts`` inlined, ``data``
    embedded as JSON in the element ``data_id``; everything else in ``context`` is escaped by jinja2."""
    from markupsafe import Markup

    return (
        templates(package)
        .get_template(template)
        .render(
            title=title,
            data_id=data_id,
            # files of this package, and JSON made safe inside <script>: inserted as they are
            style=Markup("".join(asset(package, name) for name in styles)),
            script=Markup("".join(asset(package, name) for name in scripts)),
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
