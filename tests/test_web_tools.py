"""The ``web`` toolset as a model uses it, against loopback servers: search through SearXNG and
the hosted APIs (keys from the environment, sent where each API wants them, never shown), pages
read as Markdown without their boilerplate, PDFs, redirects, failures as tool errors, the cache."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.web_servers import WebSite
from trajkit import hookimpl
from trajkit.config.cli_options import plugin_options
from trajkit.config.resolve import ConfigurationError, resolve
from trajkit.config.settings import StrictSettings
from trajkit.manager import PluginError, PluginHost, load_plugins
from trajkit.plugins.local.sandbox import LocalBackend
from trajkit.plugins.web import toolset as web
from trajkit.sandbox import SandboxSpec
from trajkit.tools import (
    ToolContext,
    ToolError,
    ToolSession,
    ToolsetError,
    close_session,
    open_toolsets,
    schemas_markdown,
)
from trajkit.tools.search import SearchHit, SearchProvider

KEYS = {
    "BRAVE_API_KEY": "brave-test-key-123",
    "EXA_API_KEY": "exa-test-key-123",
    "TAVILY_API_KEY": "tavily-test-key-123",
}


@contextlib.asynccontextmanager
async def tools(
    tmp_path: Path, *names: str, output_cap: int = 16 * 1024, host: PluginHost | None = None, **given: Any
) -> AsyncIterator[ToolContext]:
    """A tool context of a run with ``given`` settings whose toolsets ``names`` were started."""
    host = host or load_plugins(entry_points=False)
    config = resolve(host, given)
    run = await open_toolsets([host.toolsets[name] for name in names], config, host)
    backend = LocalBackend({"root": str(tmp_path), "isolation": "none"})
    sandbox = await backend.create(SandboxSpec(run_id="web", work_id="w0"))
    session = ToolSession(run)
    try:
        yield ToolContext(sandbox, timeout=30, output_cap=output_cap, session=session)
    finally:
        await close_session(session, sandbox)
        await run.aclose()
        await backend.aclose()


def web_options(site: WebSite, provider: str = "searxng", **more: Any) -> dict[str, Any]:
    return {
        "toolset_options": {"web": {"search_provider": provider, "allow_hosts": [site.host_port], **more}},
        "search_options": {
            "searxng": {"url": f"{site.url}/searxng"},
            "brave": {"base_url": f"{site.url}/brave/res/v1"},
            "exa": {"base_url": f"{site.url}/exa"},
            "tavily": {"base_url": f"{site.url}/tavily"},
            "firecrawl": {"base_url": f"{site.url}/firecrawl"},
        },
    }


async def call(ctx: ToolContext, tool: str, **args: Any) -> Any:
    function = {"web_search": web.web_search, "web_extract": web.web_extract}[tool]
    return json.loads(await function(args, ctx))


async def test_searxng_search_gives_title_url_and_snippet(tmp_path: Path) -> None:
    async with WebSite().serving() as site, tools(tmp_path, "web", **web_options(site)) as ctx:
        found = await call(ctx, "web_search", query="lighthouse keepers", limit=3)
        assert found["query"] == "lighthouse keepers"
        assert found["results"][0] == {
            "position": 1,
            "title": "Result 1 for lighthouse keepers",
            "url": f"{site.url}/article?n=1",
            "snippet": "snippet 1 about lighthouse keepers",
        }
        assert len(found["results"]) == 3
        capped = await call(ctx, "web_search", query="x", limit=500)
        assert len(capped["results"]) == 8  # all the instance had; max_results (10) caps the ask
        with pytest.raises(ToolError, match="'limit' must be a positive integer"):
            await call(ctx, "web_search", query="x", limit=-1)
    assert site.requests[0].query == {"q": "lighthouse keepers", "format": "json"}


@pytest.mark.parametrize(
    ("provider", "header", "key"),
    [
        ("brave", "X-Subscription-Token", "brave-test-key-123"),
        ("exa", "x-api-key", "exa-test-key-123"),
        ("tavily", "Authorization", "Bearer tavily-test-key-123"),
    ],
)
async def test_hosted_apis_get_their_key_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, provider: str, header: str, key: str
) -> None:
    for name, value in KEYS.items():
        monkeypatch.setenv(name, value)
    async with WebSite().serving() as site, tools(tmp_path, "web", **web_options(site, provider)) as ctx:
        found = await call(ctx, "web_search", query="grace darling", limit=2)
        assert [hit["url"] for hit in found["results"]] == [
            f"{site.url}/article?n=1",
            f"{site.url}/article?n=2",
        ]
        assert "grace darling" in found["results"][0]["snippet"]
        assert "<strong>" not in found["results"][0]["snippet"]  # Brave's markup is taken out
    assert site.requests[-1].headers[header] == key


async def test_firecrawl_speaks_v1_and_v2_and_reads_pages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FIRECRAWL_API_KEY", "firecrawl-test-key-123")
    async with WebSite().serving() as site:
        for version in ("v1", "v2"):
            options = web_options(site, "firecrawl")
            options["search_options"]["firecrawl"] = {
                "base_url": f"{site.url}/firecrawl",
                "api_version": version,
            }
            async with tools(tmp_path, "web", **options) as ctx:
                found = await call(ctx, "web_search", query="bell rock", limit=2)
                assert found["results"][1]["snippet"] == "snippet 2 about bell rock"
                read = await call(ctx, "web_extract", urls=["https://example.org/page"])
                assert read["results"][0]["title"] == "Scraped"
                assert read["results"][0]["final_url"] == "https://example.org/page#final"
                assert read["results"][0]["content"].startswith("# Scraped by firecrawl")
            assert site.requests[-1].path == f"/firecrawl/{version}/scrape"
            assert site.requests[-1].headers["Authorization"] == "Bearer firecrawl-test-key-123"


async def test_tavily_reads_pages_unless_extraction_is_local(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TAVILY_API_KEY", KEYS["TAVILY_API_KEY"])
    async with WebSite().serving() as site:
        async with tools(tmp_path, "web", **web_options(site, "tavily")) as ctx:
            read = await call(
                ctx,
                "web_extract",
                urls=["https://example.org/a", "https://example.org/fail", "http://10.0.0.5/"],
            )
            first, failed, refused = read["results"]
            assert first["content"] == "# Extracted by tavily\n\ntext of https://example.org/a"
            assert failed == {"url": "https://example.org/fail", "error": "could not fetch"}
            assert "10.0.0.5 is a private address" in refused["error"]  # never handed to the service
            assert site.requests[-1].body["urls"] == ["https://example.org/a", "https://example.org/fail"]
        async with tools(tmp_path, "web", **web_options(site, "tavily", extract_with="local")) as ctx:
            read = await call(ctx, "web_extract", urls=[f"{site.url}/article"])
            assert "Grace Darling" in read["results"][0]["content"]
        options = web_options(site, "searxng", extract_with="tavily")
        async with tools(tmp_path, "web", **options) as ctx:
            read = await call(ctx, "web_extract", urls=["https://example.org/b"])
            assert read["results"][0]["content"].endswith("text of https://example.org/b")


async def test_a_page_is_its_main_text_as_markdown_without_the_boilerplate(tmp_path: Path) -> None:
    async with WebSite().serving() as site, tools(tmp_path, "web", **web_options(site)) as ctx:
        read = await call(ctx, "web_extract", urls=[f"{site.url}/redirect?hops=2"])
    [page] = read["results"]
    assert page["url"] == f"{site.url}/redirect?hops=2"
    assert page["final_url"] == f"{site.url}/article"
    assert page["title"] == "Lighthouses of the North Sea"
    text = page["content"]
    assert "The keepers of the Longstone lighthouse logged every passing ship" in text
    assert "**Forfarshire**" in text and "[her biography](https://example.org/grace)" in text
    assert "- Longstone, lit 1826" in text
    for boilerplate in ("NAVIGATION-BOILERPLATE", "SIDEBAR-BOILERPLATE", "FOOTER-BOILERPLATE", "newsletter"):
        assert boilerplate not in text


async def test_pdfs_and_text_are_read_and_what_cannot_be_read_is_an_error_per_page(tmp_path: Path) -> None:
    async with (
        WebSite().serving() as site,
        tools(tmp_path, "web", **web_options(site, max_page_bytes="1m")) as ctx,
    ):
        read = await call(
                ctx,
                "web_extract",
                urls=[f"{site.url}/report.pdf", f"{site.url}/notes.txt", f"{site.url}/video",
                      f"{site.url}/missing", f"{site.url}/huge"],
            )  # fmt: skip
        pdf, notes, video, missing, huge = read["results"]
        assert pdf["title"] == "Lighthouse Report"
        assert (
            pdf["content"]
            == "Quarterly report of the lighthouse keepers\n\nAppendix: the keepers and their ledgers"
        )
        assert notes["content"] == "plain notes, line one\nline two"
        assert video["error"].endswith("its content type is video/mp4")
        assert missing["error"] == f"{site.url}/missing answered 404"
        assert "more than the 1048576 bytes allowed" in huge["error"]
        with pytest.raises(ToolError, match=re.escape("10.9.9.9 is a private address")):
            await call(ctx, "web_extract", urls=["http://10.9.9.9/"])  # every page failed
        with pytest.raises(ToolError, match="at most 5 URLs"):
            await call(ctx, "web_extract", urls=[f"{site.url}/a{n}" for n in range(6)])
        with pytest.raises(ToolError, match="'urls' must be a list"):
            await call(ctx, "web_extract", urls=[1, 2])


async def test_the_web_settings_bound_what_one_call_does(tmp_path: Path) -> None:
    limits = {"max_redirects": 1, "max_urls": 2, "max_results": 2, "cached_pages": 0, "pdf_pages": 1,
              "connections_per_host": 3}  # fmt: skip
    reads = 0
    async with WebSite().serving() as site, tools(tmp_path, "web", **web_options(site, **limits)) as ctx:
        web_run = ctx.session.run.resources["web"]
        assert web_run.pages.limits.connections_per_host == 3
        original = web_run._read_one

        async def counted(url: str) -> Any:
            nonlocal reads
            reads += 1
            return await original(url)

        web_run._read_one = counted
        assert len((await call(ctx, "web_search", query="x", limit=5))["results"]) == 2
        with pytest.raises(ToolError, match="at most 2 URLs per call"):
            await call(ctx, "web_extract", urls=[f"{site.url}/a", f"{site.url}/b", f"{site.url}/c"])
        with pytest.raises(ToolError, match="more than 1 redirects"):
            await call(ctx, "web_extract", urls=[f"{site.url}/redirect?hops=2"])
        pdf = (await call(ctx, "web_extract", urls=[f"{site.url}/report.pdf"]))["results"][0]
        assert pdf["content"] == "Quarterly report of the lighthouse keepers\n\n[... 1 more pages not read]"
        await call(ctx, "web_extract", urls=[f"{site.url}/report.pdf"])
    assert reads == 3  # nothing is cached


async def test_pages_read_at_once_are_bounded_across_the_run(tmp_path: Path) -> None:
    async with (
        WebSite().serving() as site,
        tools(tmp_path, "web", **web_options(site, parallel_reads=2)) as ctx,
    ):
        calls = [
            call(ctx, "web_extract", urls=[f"{site.url}/wait/{n}-{m}" for m in range(3)]) for n in range(3)
        ]
        answers = await asyncio.gather(*calls)
    assert [page["content"] for page in answers[2]["results"]] == ["page 2-0", "page 2-1", "page 2-2"]
    assert site.most_waiting == 2  # nine pages asked by three sessions at once, two read at a time


async def test_a_slow_page_is_a_tool_error_within_the_time_limit(tmp_path: Path) -> None:
    async with (
        WebSite().serving() as site,
        tools(tmp_path, "web", **web_options(site, fetch_timeout=1)) as ctx,
    ):
        with pytest.raises(ToolError, match="no complete answer within 1s"):
            await call(ctx, "web_extract", urls=[f"{site.url}/slow"])


async def test_pages_are_cached_per_run_and_read_once_for_sessions_asking_together(tmp_path: Path) -> None:
    reads: list[str] = []
    async with WebSite().serving() as site, tools(tmp_path, "web", **web_options(site)) as ctx:
        web_run = ctx.session.run.resources["web"]
        original = web_run._read_one

        async def counted(url: str) -> Any:
            reads.append(url)
            return await original(url)

        web_run._read_one = counted
        url = f"{site.url}/article"
        answers = await asyncio.gather(*(call(ctx, "web_extract", urls=[url]) for _ in range(5)))
        again = await call(ctx, "web_extract", urls=[url, f"{site.url}/notes.txt"])
        await call(ctx, "web_extract", urls=[f"{site.url}/missing", url])
        await call(ctx, "web_extract", urls=[f"{site.url}/missing", url])
    assert all(answer == answers[0] for answer in answers)
    assert again["results"][0] == answers[0]["results"][0]
    # the page once for six calls; a failure is not kept, so the missing page is asked twice
    assert reads == [url, f"{site.url}/notes.txt", f"{site.url}/missing", f"{site.url}/missing"]


async def test_the_result_fits_the_output_cap_as_whole_json(tmp_path: Path) -> None:
    async with (
        WebSite().serving() as site,
        tools(tmp_path, "web", output_cap=700, **web_options(site, char_limit=100)) as ctx,
    ):
        urls = [f"{site.url}/article", f"{site.url}/report.pdf"]
        text = await web.web_extract({"urls": urls}, ctx)
        assert len(text.encode()) <= 700
        read = json.loads(text)
        assert [page["title"] for page in read["results"]] == [
            "Lighthouses of the North Sea",
            "Lighthouse Report",
        ]
        asked = json.loads(await web.web_extract({"urls": urls[:1], "char_limit": 120}, ctx))
        assert len(asked["results"][0]["content"]) < 200


async def test_a_failing_search_is_a_tool_error_that_never_shows_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TAVILY_API_KEY", "wrong-key-but-secret-456")  # the service echoes it back
    async with WebSite().serving() as site, tools(tmp_path, "web", **web_options(site, "tavily")) as ctx:
        with pytest.raises(ToolError) as caught:
            await call(ctx, "web_search", query="x")
        assert site.requests[-1].headers["Authorization"] == "Bearer wrong-key-but-secret-456"
    assert "tavily: the service answered 401" in str(caught.value)
    assert "Unauthorized: Bearer [REDACTED] is invalid" in str(caught.value)
    assert "wrong-key-but-secret-456" not in str(caught.value)
    async with tools(tmp_path, "web", **web_options(site, "tavily")) as ctx:  # the server is gone
        with pytest.raises(ToolError, match=r"search failed: tavily: .* cannot connect to 127\.0\.0\.1"):
            await call(ctx, "web_search", query="x")


def test_what_a_run_must_set_for_the_web_toolset(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    host = load_plugins(entry_points=False)
    toolset = host.toolsets["web"]
    assert "pass --web.search_provider NAME" in (toolset.problem(toolset.Settings()) or "")
    assert toolset.problem(toolset.Settings(search_provider="searxng")) is None
    assert not toolset.optional  # a run that can draw web without a provider stops, saying this
    monkeypatch.delenv("EXA_API_KEY", raising=False)

    async def start(**given: Any) -> str:
        with pytest.raises(ToolsetError) as caught:
            async with tools(tmp_path, "web", **given):
                pass
        return str(caught.value)

    assert asyncio.run(start(toolset_options={"web": {"search_provider": "exa"}})) == (
        "web: search provider 'exa': set $EXA_API_KEY to its API key"
    )
    assert "set --searxng.url" in asyncio.run(start(toolset_options={"web": {"search_provider": "searxng"}}))
    assert (
        "no search provider is called 'bing' (installed: brave, exa, firecrawl, searxng, tavily)"
        in asyncio.run(start(toolset_options={"web": {"search_provider": "bing"}}))
    )
    with pytest.raises(ConfigurationError, match="allow_hosts"):
        resolve(host, {"toolset_options": {"web": {"allow_hosts": ["intranet.example"]}}})
    providers: dict[str, type[SearchProvider]] = host.search_providers
    assert {name: cls.key_variable for name, cls in providers.items()} == {
        "searxng": None,
        "brave": "BRAVE_API_KEY",
        "exa": "EXA_API_KEY",
        "tavily": "TAVILY_API_KEY",
        "firecrawl": "FIRECRAWL_API_KEY",
    }


class CatalogueSettings(StrictSettings):
    entries: int = 3
    """How many entries the catalogue holds."""


class Catalogue(SearchProvider):
    """A third party's provider: its settings become flags, its key comes from the environment."""

    name = "catalogue"
    Settings = CatalogueSettings
    key_variable = "CATALOGUE_KEY"

    async def search(self, query: str, limit: int) -> list[SearchHit]:
        count = min(limit, self.settings.entries)
        return [
            SearchHit(f"{query} #{n}", f"https://catalogue.example/{n}?key={self.key}", "")
            for n in range(count)
        ]


class CataloguePlugin:
    @hookimpl
    def trajkit_search_providers(self) -> list[type[SearchProvider]]:
        return [Catalogue]


async def test_a_plugin_adds_a_search_provider_with_settings_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = load_plugins(entry_points=False, extra=[("catalogue-plugin", CataloguePlugin())])
    flags = {opt for param in plugin_options(host) for opt in param.opts}
    assert {"--catalogue.entries", "--search_option"} <= flags
    monkeypatch.setenv("CATALOGUE_KEY", "cat-key")
    given = {
        "toolset_options": {"web": {"search_provider": "catalogue"}},
        "search_options": {"catalogue": {"entries": 2}},
    }
    async with tools(tmp_path, "web", host=host, **given) as ctx:
        found = await call(ctx, "web_search", query="maps", limit=5)
    assert [hit["url"] for hit in found["results"]] == [
        "https://catalogue.example/0?key=cat-key",
        "https://catalogue.example/1?key=cat-key",
    ]
    with pytest.raises(
        ConfigurationError,
        match=re.escape("--catalogue.entries=many: search provider 'catalogue' expects entries to be int"),
    ):
        resolve(host, {"search_options": {"catalogue": {"entries": "many"}}})

    class Impostor(Catalogue):
        name = "searxng"

    class ImpostorPlugin:
        @hookimpl
        def trajkit_search_providers(self) -> list[type[SearchProvider]]:
            return [Impostor]

    clash = load_plugins(entry_points=False, extra=[("impostor", ImpostorPlugin())])
    with pytest.raises(
        PluginError,
        match=re.escape(
            "search provider 'searxng' is registered twice: by trajkit.plugins.web.search_providers and by impostor"
        ),
    ):
        _ = clash.search_providers


def web_tool_schemas() -> str:
    toolsets = load_plugins(entry_points=False).toolsets
    return schemas_markdown(tool for name in ("web", "vision", "image_gen") for tool in toolsets[name].tools)


def test_the_documented_schemas_are_the_tools_schemas() -> None:
    page = (Path(__file__).resolve().parent.parent / "docs" / "web.md").read_text()
    generated = page[page.index("## Schemas\n") :].split("\n\n", 2)[2]
    assert generated == web_tool_schemas(), (
        "stale: regenerate docs/web.md's last section from tests.test_web_tools.web_tool_schemas()"
    )
