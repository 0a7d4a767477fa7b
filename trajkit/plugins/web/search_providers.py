"""Built-in web search providers: SearXNG (self-hosted) and the hosted Brave, Exa, Tavily and
Firecrawl APIs, each written against the service's documented HTTP API.

Tavily and Firecrawl also read pages (``extracts``): when one of them is the run's provider,
``web_extract`` goes through it. Every hosted provider's ``base_url`` can point at a compatible
service (a proxy, a self-hosted Firecrawl).
"""

from __future__ import annotations

import asyncio
import re
from typing import Any, Literal

from trajkit import hookimpl
from trajkit.config.settings import StrictSettings
from trajkit.tools.search import Page, PageFailure, SearchError, SearchHit, SearchProvider

SNIPPET_CHARS = 600
TAG = re.compile(r"<[^>]+>")


@hookimpl
def trajkit_search_providers() -> list[type[SearchProvider]]:
    return [SearXNG, Brave, Exa, Tavily, Firecrawl]


def plain(text: Any, limit: int = SNIPPET_CHARS) -> str:
    """Text without markup, entities or runs of blanks, at most ``limit`` characters."""
    import html

    flat = " ".join(html.unescape(TAG.sub("", str(text or ""))).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def hits(items: Any, limit: int, snippet: Any) -> list[SearchHit]:
    """Search hits from a service's result objects (those without a URL are skipped)."""
    found = []
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and isinstance(item.get("url"), str) and item["url"]:
            found.append(SearchHit(plain(item.get("title"), 300), item["url"], plain(snippet(item))))
    return found[:limit]


class SearXNGSettings(StrictSettings):
    url: str | None = None
    """The SearXNG instance's address, e.g. http://localhost:8888 (with the json format enabled
    under search.formats in its settings.yml)."""


class SearXNG(SearchProvider):
    name = "searxng"
    description = "a SearXNG instance's JSON API (self-hosted, no key)"
    Settings = SearXNGSettings

    @classmethod
    def problem(cls, settings: Any) -> str | None:
        if not settings.url:
            return "set --searxng.url to the instance's address (e.g. http://localhost:8888)"
        return None

    async def search(self, query: str, limit: int) -> list[SearchHit]:
        url = f"{self.settings.url.rstrip('/')}/search"
        response = await self.request(url, params={"q": query, "format": "json"})
        if response.status == 403:  # an instance that serves HTML only
            raise self.error(
                "the instance refuses the json format (403): add json to search.formats in its settings.yml"
            )
        answer = self.json_of(response)
        return hits(
            answer.get("results") if isinstance(answer, dict) else None, limit, lambda i: i.get("content")
        )


class BraveSettings(StrictSettings):
    base_url: str = "https://api.search.brave.com/res/v1"
    """The Brave Search API's address."""


class Brave(SearchProvider):
    name = "brave"
    description = "the Brave Search API"
    Settings = BraveSettings
    key_variable = "BRAVE_API_KEY"

    async def search(self, query: str, limit: int) -> list[SearchHit]:
        answer = await self.call(
            f"{self.settings.base_url.rstrip('/')}/web/search",
            params={"q": query, "count": str(min(limit, 20))},
            headers={"Accept": "application/json", "X-Subscription-Token": self.key or ""},
        )
        web = answer.get("web") if isinstance(answer, dict) else None
        return hits(
            web.get("results") if isinstance(web, dict) else None, limit, lambda i: i.get("description")
        )


class ExaSettings(StrictSettings):
    base_url: str = "https://api.exa.ai"
    """The Exa API's address."""


class Exa(SearchProvider):
    name = "exa"
    description = "the Exa search API"
    Settings = ExaSettings
    key_variable = "EXA_API_KEY"

    async def search(self, query: str, limit: int) -> list[SearchHit]:
        answer = await self.call(
            f"{self.settings.base_url.rstrip('/')}/search",
            method="POST",
            json={"query": query, "numResults": limit, "contents": {"highlights": {"numSentences": 3}}},
            headers={"x-api-key": self.key or ""},
        )
        results = answer.get("results") if isinstance(answer, dict) else None
        return hits(results, limit, _exa_snippet)


def _exa_snippet(item: dict[str, Any]) -> str:
    highlights = item.get("highlights")
    if isinstance(highlights, list) and highlights:
        return " … ".join(str(h) for h in highlights)
    return str(item.get("summary") or item.get("text") or "")


class TavilySettings(StrictSettings):
    base_url: str = "https://api.tavily.com"
    """The Tavily API's address."""


class Tavily(SearchProvider):
    name = "tavily"
    description = "the Tavily search and extract API (web_extract goes through it too)"
    Settings = TavilySettings
    key_variable = "TAVILY_API_KEY"
    extracts = True

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key or ''}"}

    async def search(self, query: str, limit: int) -> list[SearchHit]:
        answer = await self.call(
            f"{self.settings.base_url.rstrip('/')}/search",
            method="POST",
            json={"query": query, "max_results": min(limit, 20), "search_depth": "basic"},
            headers=self._auth(),
        )
        results = answer.get("results") if isinstance(answer, dict) else None
        return hits(results, limit, lambda i: i.get("content"))

    async def extract(self, urls: list[str]) -> list[Page | PageFailure]:
        answer = await self.call(
            f"{self.settings.base_url.rstrip('/')}/extract",
            method="POST",
            json={"urls": urls, "format": "markdown", "extract_depth": "basic"},
            headers=self._auth(),
        )
        found: dict[str, Page | PageFailure] = {}
        for item in _dicts(answer, "results"):
            url = str(item.get("url") or "")
            found[url] = Page(url, url, plain(item.get("title"), 300), str(item.get("raw_content") or ""))
        for item in _dicts(answer, "failed_results"):
            url = str(item.get("url") or "")
            found[url] = PageFailure(url, plain(item.get("error") or "extraction failed", 300))
        return [found.get(url) or PageFailure(url, "tavily returned nothing for it") for url in urls]


def _dicts(answer: Any, key: str) -> list[dict[str, Any]]:
    items = answer.get(key) if isinstance(answer, dict) else None
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []


FIRECRAWL_CLOUD = "https://api.firecrawl.dev"


class FirecrawlSettings(StrictSettings):
    base_url: str = FIRECRAWL_CLOUD
    """The Firecrawl API's address (a self-hosted instance may need no key)."""
    api_version: Literal["v1", "v2"] = "v2"
    """The API version the service speaks."""


class Firecrawl(SearchProvider):
    name = "firecrawl"
    description = "the Firecrawl search and scrape API (web_extract goes through it too)"
    Settings = FirecrawlSettings
    key_variable = "FIRECRAWL_API_KEY"
    extracts = True

    @classmethod
    def problem(cls, settings: Any) -> str | None:
        if settings.base_url.rstrip("/") != FIRECRAWL_CLOUD:
            return None  # a self-hosted instance may run without keys
        return super().problem(settings)

    def _endpoint(self, path: str) -> str:
        return f"{self.settings.base_url.rstrip('/')}/{self.settings.api_version}/{path}"

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}

    async def search(self, query: str, limit: int) -> list[SearchHit]:
        answer = await self.call(
            self._endpoint("search"),
            method="POST",
            json={"query": query, "limit": limit},
            headers=self._auth(),
        )
        data = answer.get("data") if isinstance(answer, dict) else None
        items = data.get("web") if isinstance(data, dict) else data  # v2 groups results by source
        return hits(items, limit, lambda i: i.get("description") or i.get("snippet"))

    async def extract(self, urls: list[str]) -> list[Page | PageFailure]:
        return list(await asyncio.gather(*(self._scrape(url) for url in urls)))

    async def _scrape(self, url: str) -> Page | PageFailure:
        try:
            answer = await self.call(
                self._endpoint("scrape"),
                method="POST",
                json={"url": url, "formats": ["markdown"], "onlyMainContent": True},
                headers=self._auth(),
            )
        except SearchError as exc:
            return PageFailure(url, str(exc))
        data = answer.get("data") if isinstance(answer, dict) else None
        if not isinstance(data, dict) or not isinstance(data.get("markdown"), str):
            error = answer.get("error") if isinstance(answer, dict) else None
            return PageFailure(url, plain(error or "firecrawl returned no text", 300))
        meta: dict[str, Any] = data["metadata"] if isinstance(data.get("metadata"), dict) else {}
        final = str(meta.get("url") or meta.get("sourceURL") or url)
        return Page(url, final, plain(meta.get("title"), 300), data["markdown"])
