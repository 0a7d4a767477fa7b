"""What a run offers its prompts: the reference's distributions drawn over the toolsets installed
and configured here, --toolsets, --disabled_toolsets, distributions of the configuration file, and
what `trajkit distributions` says about each."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import plugin_env, read_jsonl, trajkit, write_jsonl
from trajkit import hookimpl
from trajkit.config.resolve import ConfigurationError, resolve
from trajkit.manager import PluginHost, load_plugins
from trajkit.tools.distributions import Distribution
from trajkit.tools.offer import OfferError, listing, markdown_table
from trajkit.tools.offer import resolve as resolve_offer

ROOT = Path(__file__).resolve().parent.parent
WITHOUT_BROWSER = "trajkit.plugins.browser.toolset"
"""Disabled in the tests of toolsets no installed plugin provides: the reference's distributions
name ``browser``, and these tests stand for a machine where its plugin is not there."""

# The reference agent's distributions, % inclusion per toolset (REFERENCE.md, section H).
REFERENCE = """
default: web 100, vision 100, image_gen 100, terminal 100, file 100, browser 100
image_gen: image_gen 90, vision 90, web 55, terminal 45
research: web 90, browser 70, vision 50, terminal 10
science: web 94, terminal 94, file 94, vision 65, browser 50, image_gen 15
development: terminal 80, file 80, web 30, vision 10
safe: web 80, browser 70, vision 60, image_gen 60
balanced: web 50, vision 50, image_gen 50, terminal 50, file 50, browser 50
minimal: web 100
terminal_only: terminal 100, file 100
terminal_web: terminal 100, file 100, web 100
creative: image_gen 90, vision 90, web 30
reasoning: web 90, file 60, terminal 20
browser_use: browser 100, web 80, vision 70
browser_only: browser 100
browser_tasks: browser 97, vision 12, terminal 15
terminal_tasks: terminal 97, file 97, web 97, browser 75, vision 50, image_gen 10
mixed_tasks: browser 92, terminal 92, file 92, web 35, vision 15, image_gen 15
"""

GATED_PLUGIN = '''
    import json

    from trajkit import hookimpl
    from trajkit.tools.distributions import Distribution
    from trajkit.config.settings import StrictSettings
    from trajkit.tools import Tool, Toolset


    class LookupSettings(StrictSettings):
        endpoint: str = ""
        """Where lookups go."""


    class Lookup(Toolset):
        """Off until an endpoint is set: left out of a run's draws meanwhile."""

        Settings = LookupSettings
        optional = True

        def problem(self, settings):
            return None if settings.endpoint else "no lookup endpoint: set --lookup.endpoint URL"


    class SearchSettings(StrictSettings):
        provider: str = ""
        """The search provider."""


    class Search(Toolset):
        """Needed wherever it is drawn: a run that may draw it stops until it is configured."""

        Settings = SearchSettings

        def problem(self, settings):
            return None if settings.provider else "no search provider: set --websearch.provider NAME"


    async def answer(args, ctx):
        return json.dumps({"answer": 42})


    LOOKUP = Lookup("lookup", "look things up", (Tool("lookup", "Look up.", {"type": "object"}, answer),))
    SEARCH = Search("websearch", "search", (Tool("websearch", "Search.", {"type": "object"}, answer),))


    @hookimpl
    def trajkit_toolsets():
        return [LOOKUP, SEARCH]


    @hookimpl
    def trajkit_distributions():
        return [
            Distribution("gated_mix", "terminal, files and lookups",
                         {"terminal": 0.5, "file": 0.5, "lookup": 0.5, "browser": 0.7}),
            Distribution("needs_search", "files and search", {"file": 0.5, "websearch": 0.5}),
        ]
'''


@pytest.fixture(scope="module")
def gated() -> PluginHost:
    namespace: dict[str, Any] = {}
    exec(re.sub(r"(?m)^    ", "", GATED_PLUGIN), namespace)  # the plugin's source, in this process

    class Plugin:
        trajkit_toolsets = staticmethod(hookimpl(namespace["trajkit_toolsets"]))
        trajkit_distributions = staticmethod(hookimpl(namespace["trajkit_distributions"]))

    return load_plugins(entry_points=False, extra=[("gated", Plugin())], blocked={WITHOUT_BROWSER})


def offer_for(host: PluginHost, **given: Any) -> Any:
    return resolve_offer(resolve(host, given), host)


def test_the_reference_distributions_exist_by_name_and_weight() -> None:
    registered = load_plugins(entry_points=False).distributions
    for line in REFERENCE.strip().splitlines():
        name, _, rest = line.partition(": ")
        weights = {ts: int(p) / 100 for ts, p in (item.split() for item in rest.split(", "))}
        assert dict(registered[name].probabilities) == weights, name
    own = {"sandboxed", "file_only", "code_only"}
    assert set(registered) == own | {line.partition(":")[0] for line in REFERENCE.strip().splitlines()}
    assert [name for name, d in registered.items() if d.default] == ["sandboxed"]


def test_toolsets_that_cannot_be_offered_are_left_out_and_said_once(gated: PluginHost) -> None:
    offer = offer_for(gated, distribution="gated_mix")
    assert dict(offer.distribution.probabilities) == {"terminal": 0.5, "file": 0.5}
    assert offer.left_out.keys() == {"lookup", "browser"}
    assert offer.notice() == (
        "distribution 'gated_mix': leaving out browser (no installed plugin provides it); "
        "lookup (no lookup endpoint: set --lookup.endpoint URL); offering terminal 67%, file 67% of prompts"
    )
    configured = offer_for(gated, distribution="gated_mix", toolset_options={"lookup": {"endpoint": "x"}})
    assert configured.distribution.drawn() == ["file", "lookup", "terminal"]
    assert configured.left_out.keys() == {"browser"}
    disabled = offer_for(gated, distribution="gated_mix", disabled_toolsets=["file"])
    assert disabled.distribution.drawn() == ["terminal"]
    assert disabled.left_out["file"].reason == "named by --disabled_toolsets"


def test_a_toolset_that_is_not_optional_stops_the_run_saying_what_to_set(gated: PluginHost) -> None:
    with pytest.raises(OfferError) as stopped:
        offer_for(gated, distribution="needs_search")
    assert str(stopped.value) == (
        "distribution 'needs_search' draws websearch for 50% of prompts, and websearch cannot run: "
        "no search provider: set --websearch.provider NAME (or leave it out with --disabled_toolsets "
        "websearch, or choose another distribution: trajkit distributions)"
    )
    fine = offer_for(gated, distribution="needs_search", toolset_options={"websearch": {"provider": "p"}})
    assert fine.distribution.drawn() == ["file", "websearch"]
    assert offer_for(
        gated, distribution="needs_search", disabled_toolsets=["websearch"]
    ).distribution.drawn() == ["file"]


def test_a_distribution_with_nothing_left_is_refused(gated: PluginHost) -> None:
    with pytest.raises(OfferError, match=r"'browser_only' can offer none of its toolsets here \(browser: no"):
        offer_for(gated, distribution="browser_only")
    with pytest.raises(OfferError, match=r"'terminal_only' can offer none.*named by --disabled_toolsets"):
        offer_for(gated, distribution="terminal_only", disabled_toolsets=["terminal", "file"])
    with pytest.raises(OfferError, match=r"unknown distribution 'reserach' \(did you mean research\?\)"):
        offer_for(gated, distribution="reserach")


def test_toolsets_offers_exactly_those_and_refuses_what_cannot_run(gated: PluginHost) -> None:
    offer = offer_for(gated, toolsets=["terminal", "file"])
    assert offer.fixed and dict(offer.distribution.probabilities) == {"terminal": 1.0, "file": 1.0}
    assert offer.record() == {
        "distribution": None,
        "probabilities": {"terminal": 1.0, "file": 1.0},
        "left_out": {},
    }
    with pytest.raises(
        OfferError, match=r"toolset 'lookup' cannot run: no lookup endpoint: set --lookup\.endpoint"
    ):
        offer_for(gated, toolsets=["terminal", "lookup"])
    with pytest.raises(
        OfferError, match=r"no installed plugin provides toolset 'browser' \(installed: code, file"
    ):
        offer_for(gated, toolsets=["browser"])
    with pytest.raises(OfferError, match="pass one of them"):
        offer_for(gated, toolsets=["file"], distribution="gated_mix")
    with pytest.raises(OfferError, match=r"--disabled_toolsets: no installed plugin provides toolset 'termnal' "
                       r"\(did you mean terminal\?\)"):  # fmt: skip
        offer_for(gated, disabled_toolsets=["termnal"])


def test_distributions_of_the_configuration_file(gated: PluginHost) -> None:
    offer = offer_for(gated, distributions={"mine": {"file": 0.9, "lookup": 0.2}}, distribution="mine")
    assert (
        offer.distribution.drawn() == ["file"]
        and offer.requested.description == "from the configuration file"
    )
    with pytest.raises(
        OfferError, match=r"'mine' of the configuration file: .*toolset 'fiel' \(did you mean file"
    ):
        offer_for(gated, distributions={"mine": {"fiel": 0.9}}, distribution="mine")
    with pytest.raises(
        OfferError, match="'research' of the configuration file is also registered by a plugin"
    ):
        offer_for(gated, distributions={"research": {"file": 0.9}})
    with pytest.raises(OfferError, match="gives every toolset probability 0"):
        offer_for(gated, distributions={"mine": {"file": 0}}, distribution="mine")
    with pytest.raises(ConfigurationError) as refused:
        resolve(
            gated, {"distributions": {"mine": {"file": 90}}}, {"distributions": "run.toml: distributions"}
        )
    assert "run.toml: distributions.mine.file=90: expects distributions.mine.file to be" in str(refused.value)
    assert "less than or equal to 1" in str(refused.value)


def test_the_default_distribution_is_the_one_a_plugin_marks(gated: PluginHost) -> None:
    assert offer_for(gated).requested.name == "sandboxed"

    class Rival:
        @staticmethod
        @hookimpl
        def trajkit_distributions() -> list[Distribution]:
            return [Distribution("mine", "", {"file": 1.0}, default=True)]

    rivals = load_plugins(entry_points=False, extra=[("rival", Rival())])
    with pytest.raises(
        OfferError, match="mine, sandboxed are each marked as the default: pass --distribution"
    ):
        offer_for(rivals)
    assert offer_for(rivals, distribution="mine").requested.name == "mine"


def test_the_listing_says_what_is_missing_and_why(gated: PluginHost) -> None:
    entries = {entry["name"]: entry for entry in listing(resolve(gated, {}), gated)}
    assert entries["gated_mix"]["missing"] == {
        "lookup": "no lookup endpoint: set --lookup.endpoint URL",
        "browser": "no installed plugin provides it",
    }
    assert entries["gated_mix"]["offered_here"] == pytest.approx({"terminal": 2 / 3, "file": 2 / 3})
    assert entries["needs_search"]["stops"] == ["websearch"] and entries["needs_search"]["offered_here"] == {}
    assert entries["browser_only"]["offered_here"] == {} and entries["sandboxed"]["default"]
    # research draws web, which cannot run without a search provider; with one, it is drawn
    assert entries["research"]["stops"] == ["web"] and entries["research"]["offered_here"] == {}
    searching = {"toolset_options": {"web": {"search_provider": "searxng"}}}
    entries = {entry["name"]: entry for entry in listing(resolve(gated, searching), gated)}
    assert entries["research"]["offered_here"].keys() == {"web", "vision", "terminal"}
    assert entries["research"]["missing"] == {"browser": "no installed plugin provides it"}


def test_the_readme_distributions_table_is_generated_from_the_code() -> None:
    readme = (ROOT / "README.md").read_text()
    marker = "<!-- distributions: trajkit distributions --markdown -->\n"
    start = readme.index(marker) + len(marker)
    assert readme[start : readme.index("\n\n", start) + 1] == markdown_table(load_plugins()), (
        "stale: paste `trajkit distributions --markdown` into README.md"
    )


# -- through the command line, with the plugin installed as a package ----------------------------


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {**plugin_env(tmp_path, "gated", GATED_PLUGIN), "TRAJKIT_DISABLE_PLUGINS": WITHOUT_BROWSER}


def run(tmp_path: Path, env: dict[str, str], *flags: str, rows: int = 12) -> tuple[int, str]:
    dataset = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"task {i}"} for i in range(rows)])
    result = trajkit(
        "run", "--dataset_file", str(dataset), "--run_name", "t", "--output_dir", str(tmp_path),
        "--quiet", "--overwrite", *flags, env=env, subprocess=True,
    )  # fmt: skip
    return result.returncode, result.stderr


def test_a_run_draws_over_what_it_can_offer_and_remembers_it(tmp_path: Path, env: dict[str, str]) -> None:
    code, stderr = run(tmp_path, env, "--distribution", "gated_mix")
    assert code == 0, stderr
    assert stderr.count("leaving out browser (no installed plugin provides it); lookup (no lookup") == 1
    records = read_jsonl(tmp_path / "t" / "trajectories.jsonl")
    offered = [tuple(r["toolsets_offered"]) for r in records]
    assert set(offered) <= {("file",), ("terminal",), ("file", "terminal")} and len(set(offered)) > 1
    assert all(set(r["tool_stats"]) == {"terminal", "process", "read_file", "write_file", "patch", "search_files"}
               for r in records)  # fmt: skip
    manifest = json.loads((tmp_path / "t" / "run.json").read_text())
    assert manifest["invocations"][-1]["offer"]["left_out"] == {
        "browser": "no installed plugin provides it",
        "lookup": "no lookup endpoint: set --lookup.endpoint URL",
    }
    dataset = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"task {i}"} for i in range(24)])
    resumed = trajkit(
        "run", "--dataset_file", str(dataset), "--run_name", "t", "--output_dir", str(tmp_path), "--quiet",
        "--resume", "--distribution", "gated_mix", "--lookup.endpoint", "http://x", env=env, subprocess=True,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming with the toolsets drawn changed from" in resumed.stderr
    offered = {t for r in read_jsonl(tmp_path / "t" / "trajectories.jsonl") for t in r["toolsets_offered"]}
    assert "lookup" in offered


def test_a_toolset_that_cannot_run_stops_the_run_before_it_writes(
    tmp_path: Path, env: dict[str, str]
) -> None:
    code, stderr = run(tmp_path, env, "--distribution", "needs_search")
    assert code == 2
    assert "websearch cannot run: no search provider: set --websearch.provider NAME" in stderr
    assert not (tmp_path / "t").exists()
    code, stderr = run(tmp_path, env, "--distribution", "needs_search", "--websearch.provider", "p")
    assert code == 0, stderr


def test_fixed_toolsets_for_every_prompt(tmp_path: Path, env: dict[str, str]) -> None:
    code, stderr = run(tmp_path, env, "--toolsets", "file,lookup", "--lookup.endpoint", "x", rows=6)
    assert code == 0, stderr
    records = read_jsonl(tmp_path / "t" / "trajectories.jsonl")
    assert all(r["toolsets_offered"] == ["file", "lookup"] for r in records) and len(records) == 6
    saved = json.loads((tmp_path / "t" / "run.json").read_text())["config"]
    assert saved["toolsets"] == ["file", "lookup"] and saved["distribution"] is None
    code, stderr = run(tmp_path, env, "--toolsets", "file,lookup")
    assert (
        code == 2 and "toolset 'lookup' cannot run: no lookup endpoint: set --lookup.endpoint URL" in stderr
    )


def test_the_distributions_command(tmp_path: Path, env: dict[str, str]) -> None:
    shown = trajkit("distributions", env=env, subprocess=True)
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    block = text[text.index("gated_mix:") : text.index("\n", text.index("here:", text.index("gated_mix:")))]
    assert block == (
        "gated_mix: terminal 50%, file 50%, lookup 50%, browser 70%\n"
        "    terminal, files and lookups\n"
        "    here: offers terminal 67%, file 67% (missing: browser, lookup)"
    )
    assert (
        "needs_search: file 50%, websearch 50%\n    files and search\n    here: a run stops until websearch"
        in text
    )
    assert "sandboxed (default): terminal 100%, file 100%, code 100%" in text
    assert "\n    lookup: no lookup endpoint: set --lookup.endpoint URL\n" in text
    config = tmp_path / "run.toml"
    config.write_text('[toolset_options.lookup]\nendpoint = "x"\n[distributions.mine]\nlookup = 0.5\n')
    as_json = trajkit("distributions", "--config", str(config), "--json", env=env, subprocess=True)
    entries = {e["name"]: e for e in map(json.loads, as_json.stdout.splitlines())}
    assert entries["mine"]["offered_here"] == {"lookup": 1.0} and entries["mine"]["missing"] == {}
    assert entries["gated_mix"]["missing"] == {"browser": "no installed plugin provides it"}
    listed = trajkit("run", "--list_distributions", "--websearch.provider", "p", env=env, subprocess=True)
    assert "needs_search: file 50%, websearch 50%\n    files and search\n" in listed.stdout
    assert "websearch" not in listed.stdout.split("needs_search:")[1].split("\n")[2]


def test_serve_offers_as_a_run_does(gated: PluginHost) -> None:
    """`trajkit serve --toolsets` and `--distribution` resolve as a run's: the same checks, the
    same toolsets left out."""
    from trajkit.run.runner import RunError
    from trajkit.serve.service import ServedAgent
    from trajkit.serve.settings import ServeSettings

    def served(**given: Any) -> ServedAgent:
        return ServedAgent(resolve(gated, {"model": "scripted", **given}), ServeSettings(), gated)

    assert [t.name for t in served(toolsets=["file"]).toolsets] == ["file"]
    mixed = served(distribution="gated_mix")
    assert sorted(t.name for t in mixed.toolsets) == ["file", "terminal"]
    assert mixed.config.distribution == "gated_mix" and "lookup" not in mixed.run_tools
    assert served().config.distribution == "sandboxed"
    with pytest.raises(RunError, match="websearch cannot run: no search provider"):
        served(distribution="needs_search")
    with pytest.raises(RunError, match="toolset 'lookup' cannot run"):
        served(toolsets=["lookup"])
