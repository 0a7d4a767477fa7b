"""The built-in ``web`` toolset: ``web_search`` through the run's search provider, ``web_extract``
reading pages as Markdown (through the provider when it reads pages, locally otherwise).

Pages are fetched from the runner, never from a sandbox, under the run's network policy
(:mod:`trajkit.tools.network`): public addresses only unless ``--web.allow_hosts`` lets a host through,
checked after resolution and on every redirect, with limits on size, time, redirects and
connections per host (:mod:`trajkit.tools.fetch`). The ``vision`` and ``image_gen`` toolsets fetch
under the same settings. Pages are cached per run by URL; a failed search or fetch is a tool
error the model sees, never a failed session.
"""

from __future__ import annotations

import importlib.util
import json
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator

from trajkit import hookimpl
from trajkit.config.settings import StrictSettings
from trajkit.plugins.toolsets import STRING, object_schema, string_arg
from trajkit.plugins.web.page_text import LIBRARIES
from trajkit.sandbox import ByteSize
from trajkit.tools import Tool, ToolContext, ToolError, ToolRun, Toolset, ToolsetError
from trajkit.tools.network import parse_host_port
from trajkit.tools.search import PageFailure, SearchError

if TYPE_CHECKING:
    from trajkit.config.run_config import RunConfig
    from trajkit.plugins.web.pages import WebRun


@hookimpl
def trajkit_toolsets() -> list[Toolset]:
    return [WEB]


class WebSettings(StrictSettings):
    search_provider: str | None = None
    """The search provider web_search asks (searxng, brave, exa, tavily, firecrawl, or a plugin's;
    `trajkit plugins` lists them). Required when the web toolset can be drawn."""
    extract_with: str = "auto"
    """How web_extract reads pages: 'auto' (through the search provider when it reads pages, as
    tavily and firecrawl do, else locally), 'local' (trafilatura and pypdf in the runner), or a
    search provider's name."""
    allow_hosts: list[str] = Field([])
    """HOST:PORT entries the web, vision and image tools may reach even at a private or loopback
    address (an intranet service, a test server), comma-separated."""
    max_page_bytes: ByteSize = Field(10 << 20, gt=0)
    """Most bytes of one fetched page or image, enforced while it streams in (e.g. 10m)."""
    fetch_timeout: float = Field(30.0, gt=0)
    """Seconds one fetch may take, redirects and body included (also the limit on reading it)."""
    max_redirects: int = Field(5, ge=0, le=20)
    """Redirects followed per fetch, each checked again."""
    connections_per_host: int = Field(4, ge=1)
    """Connections open to one host at once, across the run's sessions."""
    char_limit: int = Field(8000, ge=100)
    """Characters of each page's text when web_extract is not given char_limit."""
    max_urls: int = Field(5, ge=1)
    """URLs one web_extract call may read."""
    max_results: int = Field(10, ge=1, le=50)
    """Most results one web_search call returns."""
    cached_pages: int = Field(256, ge=0)
    """Pages kept in the run's cache by URL (0: none)."""
    pdf_pages: int = Field(50, ge=1)
    """Pages of a PDF read at most."""
    parallel_reads: int = Field(8, ge=1)
    """Pages fetched and read at once across the run's sessions: what page reading can hold in
    memory is about this many times max_page_bytes (and their parsed trees)."""

    @field_validator("allow_hosts")
    @classmethod
    def _host_ports(cls, value: list[str]) -> list[str]:
        for entry in value:
            parse_host_port(entry)  # a ValueError saying what is wrong
        return value


def web_settings(config: RunConfig | None) -> WebSettings:
    """The run's ``web`` settings (its network rules serve the vision and image tools too)."""
    found = config.toolset_options.get("web") if config is not None else None
    return found if isinstance(found, WebSettings) else WebSettings()


class WebToolset(Toolset):
    Settings = WebSettings

    def problem(self, settings: Any) -> str | None:
        missing = [name for name in LIBRARIES if importlib.util.find_spec(name) is None]
        if missing:
            return f"reading pages needs {' and '.join(missing)}: pip install 'trajkit[web]'"
        if not settings.search_provider:
            return (
                "no search provider is set: pass --web.search_provider NAME (searxng with"
                " --searxng.url, or brave, exa, tavily or firecrawl with its key in the environment)"
            )
        return None

    async def start(self, run: ToolRun) -> None:
        settings: WebSettings = run.settings_of(self)
        problem = self.problem(settings)
        if problem:
            raise ToolsetError(f"web: {problem}")
        from trajkit.plugins.web.pages import open_web

        web = open_web(run, settings)
        run.resources[self.name] = web
        run.on_close(web.aclose)


def _web_run(ctx: ToolContext) -> WebRun:
    from trajkit.plugins.web.pages import WebRun

    web = ctx.session.run.resources.get("web")
    if not isinstance(web, WebRun):
        raise ToolError("the web tools were not started for this run")
    return web


def _count(args: dict[str, Any], key: str, default: int, most: int) -> int:
    value = args.get(key, default)
    if value is None:
        return min(default, most)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 1:
        raise ToolError(f"argument '{key}' must be a positive integer")
    return min(int(value), most)


async def web_search(args: dict[str, Any], ctx: ToolContext) -> str:
    web = _web_run(ctx)
    query = string_arg(args, "query").strip()
    if not query:
        raise ToolError("argument 'query' is empty")
    limit = _count(args, "limit", 5, web.settings.max_results)
    try:
        found = await web.provider.search(query, limit)
    except SearchError as exc:
        raise ToolError(f"search failed: {exc}") from None
    results = [
        {"position": n, "title": h.title, "url": h.url, "snippet": h.snippet} for n, h in enumerate(found, 1)
    ]
    return json.dumps({"query": query, "results": results}, ensure_ascii=False)


async def web_extract(args: dict[str, Any], ctx: ToolContext) -> str:
    web = _web_run(ctx)
    urls = _urls(args.get("urls"), web.settings.max_urls)
    char_limit = _count(args, "char_limit", web.settings.char_limit, 1 << 30)
    pages = await web.read(urls)
    failures = [page.error for page in pages if isinstance(page, PageFailure)]
    if len(failures) == len(pages):
        raise ToolError("; ".join(failures))
    from trajkit.plugins.web.pages import extract_json

    return extract_json(pages, char_limit, ctx.output_cap)


def _urls(value: Any, most: int) -> list[str]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(isinstance(u, str) for u in items):
        raise ToolError("argument 'urls' must be a list of URLs")
    urls = list(dict.fromkeys(u.strip() for u in items if u.strip()))
    if not urls:
        raise ToolError("argument 'urls' holds no URL")
    if len(urls) > most:
        raise ToolError(f"at most {most} URLs per call ({len(urls)} given)")
    return urls


TOOLS = (
    Tool(
        "web_search",
        "Search the web. Returns up to `limit` results, each with its title, URL and a snippet.",
        object_schema(
            ["query"],
            query={"type": "string", "description": "what to search for"},
            limit={"type": "integer", "description": "how many results (default 5)", "minimum": 1},
        ),
        web_search,
    ),
    Tool(
        "web_extract",
        "Read web pages (HTML or PDF) and return each one's main text as Markdown, with its title"
        " and final URL. Pass the URLs to read; a page that cannot be read comes back with an error.",
        object_schema(
            ["urls"],
            urls={"type": "array", "items": STRING, "description": "the pages' URLs"},
            char_limit={"type": "integer", "description": "characters of text per page", "minimum": 100},
        ),
        web_extract,
    ),
)

WEB = WebToolset("web", "search the web and read pages", TOOLS)
