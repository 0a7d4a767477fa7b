"""Web search providers: what the ``web`` toolset asks for search results and, for providers that
offer it, for the text of pages.

A provider is a plugin class (hook ``trajkit_search_providers``) with a ``name``, its settings as
a pydantic ``Settings`` model (``--NAME.KEY``, ``[search_options.NAME]``) and the environment
variable its API key comes from (``key_variable``). Keys are read from the environment only, so
they never reach a run's saved configuration; a provider's messages must never contain its key
(:meth:`SearchProvider.error` removes it from whatever a service answered).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import orjson

from trajkit.config.settings import StrictSettings
from trajkit.tools import NoSettings

if TYPE_CHECKING:
    from trajkit.tools.fetch import Fetcher, Response


class SearchError(Exception):
    """A search or an extraction failed; the message goes back to the model as a tool error."""


@dataclass(frozen=True)
class SearchHit:
    title: str
    url: str
    snippet: str


@dataclass(frozen=True)
class Page:
    """One page's main text, as Markdown."""

    url: str
    """The URL asked for."""
    final_url: str
    """Where the text came from, after redirects."""
    title: str
    text: str


@dataclass(frozen=True)
class PageFailure:
    url: str
    error: str


class SearchProvider:
    """A web search service.

    The ``web`` toolset makes one instance per run, in each process where sessions run, with the
    provider's validated settings, its key (None when ``key_variable`` is None or unset) and an
    HTTP client for the service's API (requests to the address the settings name, wherever it
    is; redirects are not followed; the run's time and size limits apply).
    """

    name: ClassVar[str]
    description: ClassVar[str] = ""
    Settings: ClassVar[type[StrictSettings]] = NoSettings
    key_variable: ClassVar[str | None] = None
    """The environment variable that holds the API key; None for a service that needs none."""
    key_required: ClassVar[bool] = True
    """Whether the service refuses requests without a key (a self-hosted one may not)."""
    extracts: ClassVar[bool] = False
    """Whether :meth:`extract` reads pages (then ``web_extract`` goes through the service)."""

    def __init__(self, settings: Any, key: str | None, http: Fetcher) -> None:
        self.settings = settings
        self.key = key
        self.http = http

    @classmethod
    def problem(cls, settings: Any) -> str | None:
        """Why the provider cannot serve with ``settings`` (a setting or key missing), saying what
        to set; None when it can. Quick, and without reaching the network."""
        if cls.key_variable and cls.key_required and not os.environ.get(cls.key_variable):
            return f"set ${cls.key_variable} to its API key"
        return None

    @classmethod
    def key_from_environment(cls) -> str | None:
        return (os.environ.get(cls.key_variable) or None) if cls.key_variable else None

    async def search(self, query: str, limit: int) -> list[SearchHit]:
        """At most ``limit`` results for ``query``; :class:`SearchError` when the service fails."""
        raise NotImplementedError

    async def extract(self, urls: list[str]) -> list[Page | PageFailure]:
        """The main text of each URL, in order (only for providers with ``extracts``)."""
        raise SearchError(f"{self.name} does not read pages")

    # -- helpers for implementations ---------------------------------------------------------

    def error(self, text: str) -> SearchError:
        """A :class:`SearchError` naming the provider, with its key removed from ``text``."""
        if self.key:
            text = text.replace(self.key, "[REDACTED]")
        return SearchError(f"{self.name}: {text}")

    async def call(self, url: str, **request: Any) -> Any:
        """The JSON answer of one API request (``method``, ``json``, ``params``, ``headers`` as
        :meth:`Fetcher.fetch` takes them); :class:`SearchError` for a failure of any kind."""
        return self.json_of(await self.request(url, **request))

    async def request(self, url: str, **request: Any) -> Response:
        """The answer of one API request, whatever its status; :class:`SearchError` when there is none."""
        from trajkit.tools.fetch import FetchError

        try:
            return await self.http.fetch(url, **request)
        except FetchError as exc:
            raise self.error(str(exc)) from None

    def json_of(self, response: Response) -> Any:
        """The JSON body of a successful answer; :class:`SearchError` for a failed or garbled one."""
        if response.status >= 400:
            raise self.error(f"the service answered {response.status}: {response.excerpt()}")
        try:
            return orjson.loads(response.body)
        except ValueError:
            raise self.error(
                f"the answer is not JSON ({response.content_type or 'no content type'})"
            ) from None
