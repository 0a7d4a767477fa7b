"""What the ``web`` toolset opens for a run and how it reads pages: the search providers, the
page fetcher under the run's network rules, the run's cache of pages by URL, and the answer of
``web_extract``. Imported when a run starts the toolset, not when the plugins are loaded.
"""

from __future__ import annotations

import asyncio
import collections
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from trajkit.plugins.web.page_text import page_text, readable
from trajkit.plugins.web.toolset import WebSettings
from trajkit.sandbox import cap_text
from trajkit.tools import ToolRun, ToolsetError
from trajkit.tools.fetch import Fetcher, FetchError, Limits
from trajkit.tools.network import NetworkPolicy, public
from trajkit.tools.search import Page, PageFailure, SearchError, SearchProvider

ALLOW_HINT = " (tools reach public addresses only; --web.allow_hosts HOST:PORT lets one through)"


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


def open_web(run: ToolRun, settings: WebSettings) -> WebRun:
    """The web tools' resources for ``run``: its search provider (and the one that reads pages,
    if any), the page fetcher and the cache; the caller registers their closing."""
    provider = make_provider(run, settings.search_provider or "", settings.fetch_timeout)
    reader: SearchProvider | None = None
    if settings.extract_with == "auto":
        reader = provider if provider.extracts else None
    elif settings.extract_with != "local":
        reader = make_provider(run, settings.extract_with, settings.fetch_timeout)
        if not reader.extracts:
            raise ToolsetError(f"web: --web.extract_with {reader.name}: that provider does not read pages")
    limit = run.config.tool_output_cap if run.config is not None else 16 * 1024
    reading = asyncio.Semaphore(settings.parallel_reads)
    cache = PageCache(settings.cached_pages)
    return WebRun(settings, provider, reader, page_fetcher(settings), cache, limit, reading)


def make_provider(run: ToolRun, name: str, timeout: float) -> SearchProvider:
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
