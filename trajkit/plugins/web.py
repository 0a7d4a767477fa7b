"""The built-in ``web`` toolset: ``web_search`` through the run's search provider, ``web_extract``
reading pages as Markdown (through the provider when it reads pages, locally otherwise).

Pages are fetched from the runner, never from a sandbox, under the run's network policy
(:mod:`trajkit.network`): public addresses only unless ``--web.allow_hosts`` lets a host through,
checked after resolution and on every redirect, with limits on size, time, redirects and
connections per host (:mod:`trajkit.fetch`). The ``vision`` and ``image_gen`` toolsets fetch
under the same settings. Pages are cached per run by URL; a failed search or fetch is a tool
error the model sees, never a failed session.
"""

from __future__ import annotations

import asyncio
import collections
import importlib.util
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator

from trajkit import hookimpl
from trajkit.fetch import Fetcher, FetchError, Limits, public
from trajkit.network import NetworkPolicy, parse_host_port
from trajkit.plugins.page_text import LIBRARIES, page_text, readable
from trajkit.plugins.toolsets import STRING, object_schema, string_arg
from trajkit.sandbox import ByteSize, cap_text
from trajkit.search import Page, PageFailure, SearchError, SearchProvider
from trajkit.settings import StrictSettings
from trajkit.tools import Tool, ToolContext, ToolError, ToolRun, Toolset, ToolsetError

if TYPE_CHECKING:
    from trajkit.config import RunConfig

ALLOW_HINT = " (tools reach public addresses only; --web.allow_hosts HOST:PORT lets one through)"


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


def page_fetcher(
    settings: WebSettings, *, max_bytes: int | None = None, extra_allow: Sequence[str] = ()
) -> Fetcher:
    """A fetcher for URLs a model chose, under the run's network policy and limits."""
    policy = NetworkPolicy.allowing([*settings.allow_hosts, *extra_allow], hint=ALLOW_HINT)
    limits = Limits(
        max_bytes=max_bytes or settings.max_page_bytes,
        timeout=settings.fetch_timeout,
        max_redirects=settings.max_redirects,
        connections_per_host=settings.connections_per_host,
    )
    return Fetcher(policy, limits)


def api_fetcher(timeout: float, max_bytes: int = 32 << 20) -> Fetcher:
    """A fetcher for an endpoint the configuration names: any address, no redirects."""
    return Fetcher(NetworkPolicy(guard=False), Limits(max_bytes=max_bytes, timeout=timeout, max_redirects=0))


Loader = Callable[[list[str]], Awaitable[list[Page | PageFailure]]]


@dataclass
class PageCache:
    """Pages by URL for the run, least recently used first out; a URL being read is read once
    for every session that asks. Failures are not kept."""

    size: int
    entries: collections.OrderedDict[str, asyncio.Future[Page | PageFailure]] = field(
        default_factory=collections.OrderedDict
    )
    loading: set[asyncio.Task[None]] = field(default_factory=set)

    async def pages(self, urls: list[str], load: Loader) -> list[Page | PageFailure]:
        waiting = {url: self.entries.get(url) for url in urls}
        missing = [url for url, future in waiting.items() if future is None]
        if missing:
            loop = asyncio.get_running_loop()
            futures = {url: loop.create_future() for url in missing}
            waiting.update(futures)
            if self.size:
                self.entries.update(futures)
            task = asyncio.ensure_future(self._fill(missing, futures, load))
            self.loading.add(task)
            task.add_done_callback(self.loading.discard)
        for url in urls:
            if url in self.entries:
                self.entries.move_to_end(url)
        while len(self.entries) > self.size:
            self.entries.popitem(last=False)
        return [await asyncio.shield(waiting[url]) for url in urls]  # type: ignore[arg-type]

    async def _fill(
        self, urls: list[str], futures: dict[str, asyncio.Future[Page | PageFailure]], load: Loader
    ) -> None:
        try:
            results: Sequence[Page | PageFailure] = await load(urls)
            if len(results) != len(urls):
                raise ValueError(f"{len(results)} answers for {len(urls)} pages")
        except Exception as exc:  # a broken provider: every page of the call fails, the session goes on
            results = [PageFailure(url, f"{type(exc).__name__}: {exc}") for url in urls]
        except BaseException:  # cancelled (the run is closing): nothing is kept, nobody waits
            for url, future in futures.items():
                if self.entries.get(url) is future:
                    del self.entries[url]
                future.cancel()
            raise
        for url, result in zip(urls, results, strict=True):
            if isinstance(result, PageFailure) and self.entries.get(url) is futures[url]:
                del self.entries[url]
            futures[url].set_result(result)


@dataclass
class WebRun:
    """What the web tools share for the run (``run.resources["web"]``)."""

    settings: WebSettings
    provider: SearchProvider
    reader: SearchProvider | None
    """The provider web_extract goes through; None reads pages locally."""
    pages: Fetcher
    cache: PageCache
    text_limit: int
    """Characters of a page's text kept: more can never reach the model (the output cap)."""
    reading: asyncio.Semaphore
    """Pages fetched and read at once across the run's sessions (``parallel_reads``)."""

    async def read(self, urls: list[str]) -> list[Page | PageFailure]:
        return await self.cache.pages(urls, self._through_provider if self.reader else self._locally)

    async def _through_provider(self, urls: list[str]) -> list[Page | PageFailure]:
        assert self.reader is not None
        refused: dict[str, PageFailure] = {}
        for url in urls:
            try:
                self.pages.check(url)  # the provider fetches, but a private address is still refused
            except FetchError as exc:
                refused[url] = PageFailure(url, str(exc))
        asked = [url for url in urls if url not in refused]
        try:
            answers = await self.reader.extract(asked) if asked else []
        except SearchError as exc:
            return [refused.get(url) or PageFailure(url, str(exc)) for url in urls]
        found = dict(zip(asked, answers, strict=True))
        return [refused.get(url) or self._trimmed(found[url]) for url in urls]

    async def _locally(self, urls: list[str]) -> list[Page | PageFailure]:
        return list(await asyncio.gather(*(self._read_bounded(url) for url in urls)))

    async def _read_bounded(self, url: str) -> Page | PageFailure:
        async with self.reading:  # a page and its parsed tree are held only while it is read
            return await self._read_one(url)

    async def _read_one(self, url: str) -> Page | PageFailure:
        try:
            response = await self.pages.fetch(url, accept=readable)
        except FetchError as exc:
            return PageFailure(url, str(exc))
        if response.status >= 400:
            return PageFailure(url, f"{public(response.url)} answered {response.status}")
        try:
            title, text = await asyncio.wait_for(
                asyncio.to_thread(page_text, response, self.settings.pdf_pages), self.settings.fetch_timeout
            )
        except TimeoutError:
            return PageFailure(url, f"reading the page took more than {self.settings.fetch_timeout:g}s")
        except ValueError as exc:
            return PageFailure(url, f"{public(response.url)}: {exc}")
        return self._trimmed(Page(url, response.url, title, text))

    def _trimmed(self, page: Page | PageFailure) -> Page | PageFailure:
        if isinstance(page, Page) and len(page.text) > self.text_limit:
            return Page(page.url, page.final_url, page.title, page.text[: self.text_limit])
        return page

    async def aclose(self) -> None:
        for task in list(self.cache.loading):
            task.cancel()
        await self.pages.aclose()
        await self.provider.http.aclose()
        if self.reader is not None:
            await self.reader.http.aclose()


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
        provider = _provider(run, settings.search_provider or "", settings.fetch_timeout)
        reader: SearchProvider | None = None
        if settings.extract_with == "auto":
            reader = provider if provider.extracts else None
        elif settings.extract_with != "local":
            reader = _provider(run, settings.extract_with, settings.fetch_timeout)
            if not reader.extracts:
                raise ToolsetError(
                    f"web: --web.extract_with {reader.name}: that provider does not read pages"
                )
        limit = run.config.tool_output_cap if run.config is not None else 16 * 1024
        reading = asyncio.Semaphore(settings.parallel_reads)
        cache = PageCache(settings.cached_pages)
        web = WebRun(settings, provider, reader, page_fetcher(settings), cache, limit, reading)
        run.resources[self.name] = web
        run.on_close(web.aclose)


def _provider(run: ToolRun, name: str, timeout: float) -> SearchProvider:
    """The run's search provider called ``name``, made with its settings and key."""
    if run.plugins is None:
        from trajkit.manager import load_plugins

        run.plugins = load_plugins()
    providers = run.plugins.search_providers
    cls = providers.get(name)
    if cls is None:
        hint = run.plugins.package_hints.get(name)
        installed = f"pip install {hint}" if hint else f"installed: {', '.join(sorted(providers)) or 'none'}"
        raise ToolsetError(f"web: no search provider is called {name!r} ({installed})")
    settings = run.config.settings_of(cls) if run.config is not None else cls.Settings()
    problem = cls.problem(settings)
    if problem:
        raise ToolsetError(f"web: search provider {name!r}: {problem}")
    return cls(settings, cls.key_from_environment(), api_fetcher(timeout * 2))


def _web_run(ctx: ToolContext) -> WebRun:
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
    if all(isinstance(page, PageFailure) for page in pages):
        raise ToolError("; ".join(page.error for page in pages if isinstance(page, PageFailure)))
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


def extract_json(pages: Sequence[Page | PageFailure], char_limit: int, cap: int) -> str:
    """The results as JSON of at most ``cap`` bytes: each page's text cut to ``char_limit``
    characters, then shortened evenly until the whole fits (never JSON cut in the middle)."""
    budget = char_limit
    while True:
        results = [
            {"url": p.url, "final_url": p.final_url, "title": p.title, "content": cap_text(p.text, budget)}
            if isinstance(p, Page)
            else {"url": p.url, "error": p.error}
            for p in pages
        ]
        text = json.dumps({"results": results}, ensure_ascii=False)
        size = len(text.encode())
        if size <= cap or budget <= 64:
            return text
        budget = max(64, budget * cap // size - 32)


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
