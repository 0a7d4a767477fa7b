"""A fetched page's main text as Markdown: HTML through trafilatura (navigation, sidebars, footers
and other boilerplate left out), PDF through pypdf, plain text as it is.

Both libraries are imported on first use; the functions here are synchronous and CPU-bound, so
the ``web`` toolset runs them in a worker thread under a time limit.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trajkit.tools.fetch import Response

HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
TEXT_TYPES = frozenset({"application/json", "application/xml", "application/x-yaml", "application/yaml"})
PDF = "application/pdf"
LIBRARIES = ("trafilatura", "lxml_html_clean", "pypdf")
"""What local extraction needs (the ``web`` extra: ``pip install 'trajkit[web]'``)."""


def readable(kind: str) -> bool:
    """Whether a page of media type ``kind`` can be read ("" for an answer that names none)."""
    return kind in ("", PDF) or kind in HTML_TYPES or kind in TEXT_TYPES or kind.startswith("text/")


def page_text(response: Response, max_pdf_pages: int) -> tuple[str, str]:
    """(title, Markdown text) of a fetched page; ``ValueError`` when it holds no text at all."""
    kind = response.content_type or _sniff(response.body)
    if kind == PDF or response.body.startswith(b"%PDF-"):
        return pdf_text(response.body, max_pdf_pages)
    if kind in HTML_TYPES:
        return html_text(_decoded(response), response.url)
    return "", _decoded(response)


def _sniff(body: bytes) -> str:
    head = body[:512].lstrip().lower()
    if head.startswith(b"%pdf-"):
        return PDF
    if head.startswith((b"<!doctype html", b"<html")) or b"<body" in head:
        return "text/html"
    return "text/plain"


def _decoded(response: Response) -> str:
    try:
        return response.body.decode(response.charset or "utf-8", "replace")
    except LookupError:  # a charset Python does not know
        return response.body.decode("utf-8", "replace")


def html_text(html: str, url: str) -> tuple[str, str]:
    """The page's main content as Markdown, links and formatting kept; the whole page's visible
    text when no main content can be told apart."""
    import trafilatura

    document: Any = trafilatura.extract_with_metadata(
        html,
        url=url,
        output_format="markdown",
        include_comments=False,
        include_links=True,
        include_formatting=True,
        include_tables=True,
    )
    if document is not None and document.text:
        return str(document.title or ""), str(document.text)
    metadata = trafilatura.extract_metadata(html)
    title = str(metadata.title or "") if metadata is not None else ""
    text = trafilatura.html2txt(html) or ""
    if not text.strip():
        raise ValueError("the page has no text")
    return title, text


def pdf_text(data: bytes, max_pages: int) -> tuple[str, str]:
    """The text of the PDF's first ``max_pages`` pages, and its title."""
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            reader.decrypt("")  # many PDFs are "encrypted" with an empty password
        pages = reader.pages
        texts = [(page.extract_text() or "").strip() for page in pages[:max_pages]]
        title = str(reader.metadata.title or "") if reader.metadata is not None else ""
        total = len(pages)
    except (PdfReadError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"the PDF cannot be read ({type(exc).__name__})") from None
    text = "\n\n".join(t for t in texts if t)
    if total > max_pages:
        text += f"\n\n[... {total - max_pages} more pages not read]"
    if not text.strip():
        raise ValueError("the PDF has no text layer (a scan?)")
    return title, text
