"""Plugin discovery and the plugin manager's guarantees."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import install_fake_distribution, read_jsonl, trajkit, write_jsonl
from trajkit import hookimpl, hookspecs
from trajkit.hookspecs import PackageHint
from trajkit.manager import DEFAULT_PLUGINS, PluginError, load_plugins
from trajkit.record.filters import Record, TrajectoryFilter


def plugin_with(**hooks: Any) -> object:
    """A plugin object whose methods are the given functions, marked as hook implementations."""
    return type("Plugin", (), {name: staticmethod(hookimpl(fn)) for name, fn in hooks.items()})()


BANANA_PLUGIN = """
    from trajkit import hookimpl
    from trajkit.record.filters import TrajectoryFilter

    class NoBananas(TrajectoryFilter):
        name = "no_bananas"
        description = "rejects prompts about bananas"

        def check(self, record):
            human = record["conversations"][1]["value"]
            return "mentions bananas" if "banana" in human else None

    @hookimpl
    def trajkit_filters():
        return [NoBananas]

    @hookimpl
    def trajkit_commands(cli):
        @cli.command()
        def bananas():
            print("bananas are filtered")
"""


def test_an_installed_plugin_package_filters_a_real_run(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    install_fake_distribution(site, "trajkit-bananas", "trajkit_bananas", BANANA_PLUGIN, "bananas")
    install_fake_distribution(
        site, "trajkit-broken", "trajkit_broken", "raise ImportError('no such thing')", "broken"
    )
    env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    dataset = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "peel a banana"}, {"prompt": "peel an orange"}])

    listing = trajkit("plugins", env=env, subprocess=True)
    assert listing.returncode == 0, listing.stderr
    assert "bananas  [trajkit-bananas 0.3]" in listing.stdout
    assert "filters: no_bananas" in listing.stdout
    assert (
        "BROKEN plugin 'broken' from trajkit-broken 0.3 failed to load: ImportError: no such thing"
        in listing.stdout
    )

    result = trajkit(
        "run",
        "--dataset_file",
        str(dataset),
        "--run_name",
        "r",
        "--output_dir",
        str(tmp_path),
        env=env,
        subprocess=True,
    )
    assert result.returncode == 0, result.stderr
    assert "trajkit-broken" in result.stderr
    rejected = read_jsonl(tmp_path / "r" / "rejected.jsonl")
    assert [(r["prompt_index"], r["reason"]) for r in rejected] == [(0, "no_bananas: mentions bananas")]
    assert [r["prompt_index"] for r in read_jsonl(tmp_path / "r" / "trajectories.jsonl")] == [1]

    command = trajkit("bananas", env=env, subprocess=True)
    assert command.returncode == 0 and command.stdout == "bananas are filtered\n"

    blocked = trajkit("plugins", env={**env, "TRAJKIT_DISABLE_PLUGINS": "bananas"}, subprocess=True)
    assert "trajkit-bananas" not in blocked.stdout


def test_builtins_register_through_the_same_hooks() -> None:
    host = load_plugins(entry_points=False)
    assert set(host.sources) == set(DEFAULT_PLUGINS)
    assert {"scripted", "openai"} <= set(host.model_clients)
    assert "local" in host.backends
    assert {"terminal", "file", "code"} <= set(host.toolsets)
    assert {"no_reasoning", "hallucinated_tool"} <= set(host.filters)
    assert "sharegpt" in host.writers
    assert "default" in host.distributions


def test_a_misspelled_hook_is_an_error() -> None:
    plugin = plugin_with(trajkit_filter=lambda: [])
    with pytest.raises(PluginError, match="unknown hook 'trajkit_filter'"):
        load_plugins(entry_points=False, extra=[("typo", plugin)])


def test_duplicate_registrations_name_both_plugins() -> None:
    class Shadow(TrajectoryFilter):
        name = "no_reasoning"

        def check(self, record: Record) -> str | None:
            return None

    plugin = plugin_with(trajkit_filters=lambda: [Shadow])
    host = load_plugins(entry_points=False, extra=[("shadow", plugin)])
    with pytest.raises(
        PluginError, match=r"filter 'no_reasoning' is registered twice: by trajkit\.plugins\.filters"
    ):
        _ = host.filters


def test_duplicate_plugin_names_are_an_error() -> None:
    plugin = plugin_with(trajkit_filters=lambda: [])
    with pytest.raises(PluginError, match="used twice"):
        load_plugins(entry_points=False, extra=[("trajkit.plugins.filters", plugin)])


def test_unknown_backend_names_the_package() -> None:
    host = load_plugins(entry_points=False)
    with pytest.raises(PluginError, match=r"pip install \./trajkit_docker from the root of the trajkit"):
        host.backend("docker")


def test_package_hints_come_from_plugins() -> None:
    hints = {
        "firecracker": "trajkit-firecracker",
        "docker": "other",
        "slurm": PackageHint("trajkit-slurm", "executor", "pip install ./slurm"),
    }
    host = load_plugins(
        entry_points=False, extra=[("hints", plugin_with(trajkit_package_hints=lambda: hints))]
    )
    with pytest.raises(PluginError, match="pip install trajkit-firecracker"):
        host.backend("firecracker")
    with pytest.raises(PluginError, match=r"executor 'slurm' is not installed: pip install \./slurm"):
        host.executor("slurm")
    with pytest.raises(PluginError, match="unknown sandbox backend 'slurm'"):  # an executor's hint
        host.backend("slurm")
    with pytest.raises(PluginError, match="pip install other"):  # a later plugin is asked first
        host.backend("docker")
    blocked = load_plugins(entry_points=False, blocked={"trajkit.plugins.package_hints"})
    with pytest.raises(PluginError, match="unknown sandbox backend 'docker'"):
        blocked.backend("docker")


def test_blocking_a_name_no_plugin_has_is_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """A built-in's name is its module's: one blocked by a name it no longer has (or a misspelt
    one) would otherwise run unnoticed."""
    with caplog.at_level(logging.WARNING, logger="trajkit"):
        host = load_plugins(entry_points=False, blocked={"trajkit.plugins.web", "trajkit.plugins.run_log"})
    assert "trajkit.plugins.run_log" not in host.sources
    assert "trajkit.plugins.web.toolset" in host.sources
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "TRAJKIT_DISABLE_PLUGINS: no plugin is named 'trajkit.plugins.web'; did you mean "
        "'trajkit.plugins.web.image_gen' or 'trajkit.plugins.web.search_providers' or "
        "'trajkit.plugins.web.toolset' or 'trajkit.plugins.web.vision'?"
    ]


def test_defaults_come_from_plugin_metadata_not_names() -> None:
    from trajkit.model import ModelClient
    from trajkit.plugins.export.writers import ShareGPTWriter
    from trajkit.plugins.local.sandbox import LocalBackend

    host = load_plugins(entry_points=False)
    assert host.model_client("scripted").name == "scripted"
    assert host.model_client("vendor/any-model").name == "openai"  # the one that takes model names
    with pytest.raises(PluginError, match="none installed is made for it: install one of docker"):
        host.image_backend()

    class Anywhere(ModelClient):
        name = "anywhere"
        takes_any_model = True

    class Images(LocalBackend):
        name = "images"
        default_for_images = True

    class Markdown(ShareGPTWriter):
        name = "markdown"
        filename = "trajectories.md"
        default = False

    extra = plugin_with(
        trajkit_model_clients=lambda: [Anywhere],
        trajkit_sandbox_backends=lambda: [Images],
        trajkit_writers=lambda: [Markdown],
    )
    host = load_plugins(entry_points=False, extra=[("extra", extra)])
    with pytest.raises(PluginError, match=r"several model clients take model names \(anywhere, openai\)"):
        host.model_client("vendor/any-model")
    assert host.image_backend() == "images"
    assert sorted(name for name, cls in host.writers.items() if cls.default) == ["sharegpt"]


def test_lifecycle_hooks_fire_in_order(tmp_path: Path) -> None:
    import asyncio

    from trajkit.config.run_config import RunConfig
    from trajkit.run.runner import Runner

    events: list[str] = []

    class Observer:
        @hookimpl
        def trajkit_run_start(self, run: hookspecs.RunInfo, pending: int) -> None:
            events.append(f"start {run.run_name} {pending}")

        @hookimpl
        def trajkit_trajectory_finished(
            self, run: hookspecs.RunInfo, record: Record, rejection: str | None
        ) -> None:
            events.append(f"finished {record['prompt_index']} {rejection}")

        @hookimpl
        def trajkit_run_end(self, run: hookspecs.RunInfo, statistics: dict[str, object]) -> None:
            events.append(f"end {statistics['kept']}")

    host = load_plugins(entry_points=False, extra=[("observer", Observer())])
    dataset = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "one"}, {"prompt": "two"}])
    config = RunConfig(dataset_file=dataset, run_name="hooks", output_dir=tmp_path, quiet=True, num_workers=1)
    asyncio.run(Runner(config, host).run())
    assert events == ["start hooks 2", "finished 0 None", "finished 1 None", "end 2"]


def test_a_plugin_distribution_is_listed_and_chosen_by_name(tmp_path: Path) -> None:
    from trajkit.config.resolve import resolve
    from trajkit.run.runner import Runner
    from trajkit.tools.distributions import Distribution

    def trajkit_distributions() -> list[Distribution]:
        return [Distribution("read_only", "files, read only", {"file": 1.0})]

    host = load_plugins(
        entry_points=False, extra=[("readers", plugin_with(trajkit_distributions=trajkit_distributions))]
    )
    assert host.distributions["read_only"].description == "files, read only"
    dataset = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "look around"}])
    config = resolve(
        host,
        dict(dataset_file=dataset, run_name="ro", output_dir=tmp_path, quiet=True, distribution="read_only"),
    )
    asyncio.run(Runner(config, host).run())
    [record] = read_jsonl(tmp_path / "ro" / "trajectories.jsonl")
    assert record["toolsets_used"] == ["file"]
