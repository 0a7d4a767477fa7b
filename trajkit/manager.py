"""Building the plugin manager and the one typed facade through which the core calls hooks.

Built-in plugins come first (from ``DEFAULT_PLUGINS``), then the entry points of the group
``trajkit``, then ``check_pending`` so that a misspelled hook is an error. Nothing is loaded at
import time: :func:`load_plugins` is called explicitly, once per run or per test.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar

import pluggy

from trajkit import hookspecs
from trajkit.config.settings import did_you_mean
from trajkit.hookspecs import PackageHint

if TYPE_CHECKING:
    import click

    from trajkit.compress.base import Compressor, TokenCounter
    from trajkit.config.run_config import RunConfig
    from trajkit.model import ModelClient
    from trajkit.record.filters import Record, TrajectoryFilter
    from trajkit.record.scorers import Scorer
    from trajkit.record.writers import OutputWriter
    from trajkit.run.executor import Executor
    from trajkit.sandbox import SandboxBackend
    from trajkit.tools import Tool, Toolset
    from trajkit.tools.distributions import Distribution
    from trajkit.tools.search import SearchProvider

log = logging.getLogger("trajkit")

ENTRY_POINT_GROUP = "trajkit"
BLOCK_ENV = "TRAJKIT_DISABLE_PLUGINS"
BY_CALLER = "registered by caller"
"""The source of a plugin handed to :func:`load_plugins` as ``extra`` (not installed)."""

# Built-in behaviour, registered through the same hooks a third-party plugin uses.
DEFAULT_PLUGINS = (
    "trajkit.plugins.openai.client",
    "trajkit.plugins.scripted_model",
    "trajkit.plugins.local.sandbox",
    "trajkit.plugins.toolsets",
    "trajkit.plugins.files.tools",
    "trajkit.plugins.web.toolset",
    "trajkit.plugins.web.search_providers",
    "trajkit.plugins.web.vision",
    "trajkit.plugins.browser.toolset",
    "trajkit.plugins.web.image_gen",
    "trajkit.plugins.mcp.toolset",
    "trajkit.plugins.distributions",
    "trajkit.plugins.filters",
    "trajkit.plugins.scorers",
    "trajkit.plugins.export.writers",
    "trajkit.plugins.local_executor",
    "trajkit.plugins.export.command",
    "trajkit.plugins.report.command",
    "trajkit.plugins.compare.command",
    "trajkit.plugins.compressors",
    "trajkit.plugins.token_counters",
    "trajkit.plugins.serve",
    "trajkit.plugins.package_hints",
    "trajkit.plugins.run_log",
)

T = TypeVar("T")


class PluginError(RuntimeError):
    """A plugin is broken in a way the run cannot go on with (duplicate name, bad hook, missing)."""


@dataclass(frozen=True)
class PluginLoadError:
    name: str
    distribution: str
    error: str

    def __str__(self) -> str:
        return f"plugin {self.name!r} from {self.distribution} failed to load: {self.error}"


@dataclass
class PluginHost:
    """The plugin manager plus what trajkit asks of it: typed registries and lifecycle events."""

    pm: pluggy.PluginManager
    load_errors: list[PluginLoadError] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)
    """Plugin name -> "distribution version" (or "built-in")."""
    _configured: list[str] = field(default_factory=list)
    """Toolsets the last :meth:`configure_toolsets` added."""

    # -- registries -----------------------------------------------------------------------------

    @cached_property
    def model_clients(self) -> dict[str, type[ModelClient]]:
        return self._registry("trajkit_model_clients", "model client", lambda c: c.name)

    @cached_property
    def backends(self) -> dict[str, type[SandboxBackend]]:
        return self._registry("trajkit_sandbox_backends", "sandbox backend", lambda c: c.name)

    @cached_property
    def toolsets(self) -> dict[str, Toolset]:
        toolsets = self._registry("trajkit_toolsets", "toolset", lambda t: t.name)
        self._unique(
            ((tool.name, toolset.name) for toolset in toolsets.values() for tool in toolset.tools), "tool"
        )
        return toolsets

    @cached_property
    def tools(self) -> dict[str, Tool]:
        return {tool.name: tool for toolset in self.toolsets.values() for tool in toolset.tools}

    @cached_property
    def config_tables(self) -> dict[str, hookspecs.ConfigTable]:
        return self._registry("trajkit_config_tables", "configuration table", lambda t: t.name)

    def configure_toolsets(self, config: RunConfig) -> None:
        """Add the toolsets plugins build from ``config`` (``trajkit_configured_toolsets``) to
        :attr:`toolsets`, in place of those an earlier configuration added."""
        registered = self.toolsets
        for name in self._configured:
            registered.pop(name, None)
        self.__dict__.pop("tools", None)
        caller = self.pm.hook.trajkit_configured_toolsets
        added = [
            (impl.plugin_name, toolset)
            for impl in caller.get_hookimpls()
            for result in self.pm.subset_hook_caller(
                "trajkit_configured_toolsets",
                remove_plugins=[p for p in self.pm.get_plugins() if p is not impl.plugin],
            )(config=config)
            for toolset in result or ()
        ]
        sources = [*self._collect("trajkit_toolsets"), *added]
        self._unique(((toolset.name, source) for source, toolset in sources), "toolset")
        self._unique(((t.name, ts.name) for _, ts in sources for t in ts.tools), "tool")
        self._configured = [toolset.name for _, toolset in added]
        registered.update((toolset.name, toolset) for _, toolset in added)

    @cached_property
    def distributions(self) -> dict[str, Distribution]:
        return self._registry("trajkit_distributions", "distribution", lambda d: d.name)

    @cached_property
    def filters(self) -> dict[str, type[TrajectoryFilter]]:
        return self._registry("trajkit_filters", "filter", lambda c: c.name)

    @cached_property
    def scorers(self) -> dict[str, type[Scorer]]:
        return self._registry("trajkit_scorers", "scorer", lambda c: c.name)

    @cached_property
    def writers(self) -> dict[str, type[OutputWriter]]:
        return self._registry("trajkit_writers", "writer", lambda c: c.name)

    @cached_property
    def executors(self) -> dict[str, type[Executor]]:
        return self._registry("trajkit_executors", "executor", lambda c: c.name)

    @cached_property
    def compressors(self) -> dict[str, type[Compressor]]:
        return self._registry("trajkit_compressors", "compressor", lambda c: c.name)

    @cached_property
    def token_counters(self) -> dict[str, type[TokenCounter]]:
        return self._registry("trajkit_token_counters", "token counter", lambda c: c.name)

    @cached_property
    def search_providers(self) -> dict[str, type[SearchProvider]]:
        return self._registry("trajkit_search_providers", "search provider", lambda c: c.name)

    @cached_property
    def package_hints(self) -> dict[str, PackageHint]:
        hints: dict[str, PackageHint] = {}
        for answer in self.pm.hook.trajkit_package_hints():
            for name, hint in answer.items():
                hints.setdefault(name, hint if isinstance(hint, PackageHint) else PackageHint(str(hint)))
        return hints

    def hints_for(self, concern: str) -> dict[str, PackageHint]:
        """The hints of plugins of one concern (and those that do not say theirs)."""
        return {name: hint for name, hint in self.package_hints.items() if hint.concern in ("", concern)}

    def backend(self, name: str) -> type[SandboxBackend]:
        """The backend class called ``name``, or an error that says what to install."""
        if name in self.backends:
            return self.backends[name]
        message = f"unknown sandbox backend {name!r} (installed: {', '.join(sorted(self.backends))})"
        hints = self.hints_for("sandbox backend")
        message += did_you_mean(name, [*self.backends, *hints])
        if name in hints:
            message = f"sandbox backend {name!r} is not installed: {hints[name].command}"
        failed = [str(e) for e in self.load_errors if e.name == name]
        raise PluginError("; ".join([message, *failed]))

    def executor(self, name: str) -> type[Executor]:
        """The executor class called ``name``, or an error naming the installed ones."""
        if name in self.executors:
            return self.executors[name]
        message = f"unknown executor {name!r} (installed: {', '.join(sorted(self.executors)) or 'none'})"
        hints = self.hints_for("executor")
        message += did_you_mean(name, [*self.executors, *hints])
        if name in hints:
            message = f"executor {name!r} is not installed: {hints[name].command}"
        failed = [str(e) for e in self.load_errors if e.name == name]
        raise PluginError("; ".join([message, *failed]))

    def image_backend(self) -> str:
        """The backend for rows with an image that nothing else routes: the one made for images."""
        chosen = sorted(name for name, cls in self.backends.items() if cls.default_for_images)
        if len(chosen) == 1:
            return chosen[0]
        if chosen:
            raise PluginError(
                f"several backends take rows with an image ({', '.join(chosen)}): pass --image_backend"
            )
        hints = [
            f"{name} ({hint.command})" for name, hint in sorted(self.hints_for("sandbox backend").items())
        ]
        raise PluginError(
            "rows with an image need a backend that runs images, and none installed is made for it: "
            f"install one of {', '.join(hints) or 'the container backends'}, or pass --image_backend"
        )

    def model_client(self, model: str) -> type[ModelClient]:
        """The client called ``model``, else the one that serves any model name (an endpoint's slug)."""
        if model in self.model_clients:
            return self.model_clients[model]
        general = sorted(name for name, cls in self.model_clients.items() if cls.takes_any_model)
        if len(general) == 1:
            return self.model_clients[general[0]]
        if general:
            raise PluginError(
                f"several model clients take model names ({', '.join(general)}); "
                "disable all but one with TRAJKIT_DISABLE_PLUGINS"
            )
        raise PluginError(
            f"no model client is called {model!r}, and none installed takes model names "
            f"(installed: {', '.join(sorted(self.model_clients))})"
        )

    def registrations(self, plugin: object) -> dict[str, list[str]]:
        """What one plugin registers, by concern, for ``trajkit plugins``."""
        found: dict[str, list[str]] = {}
        for hook_name in _REGISTRATION_HOOKS:
            items = self._call_one(hook_name, plugin)
            if items:
                found[hook_name.removeprefix("trajkit_")] = [
                    getattr(item, "name", repr(item)) for item in items
                ]
        return found

    # -- lifecycle events --------------------------------------------------------------------------

    def register_commands(self, cli: click.Group) -> None:
        self.pm.hook.trajkit_commands(cli=cli)

    def run_start(self, run: hookspecs.RunInfo, pending: int) -> None:
        self.pm.hook.trajkit_run_start(run=run, pending=pending)

    def trajectory_finished(self, run: hookspecs.RunInfo, record: Record, rejection: str | None) -> None:
        self.pm.hook.trajkit_trajectory_finished(run=run, record=record, rejection=rejection)

    def run_end(self, run: hookspecs.RunInfo, statistics: Mapping[str, Any]) -> None:
        self.pm.hook.trajkit_run_end(run=run, statistics=statistics)

    # -- internals ---------------------------------------------------------------------------------

    def _registry(self, hook_name: str, concern: str, key: Callable[[Any], str]) -> dict[str, Any]:
        pairs = [(key(item), plugin_name, item) for plugin_name, item in self._collect(hook_name)]
        self._unique(((name, source) for name, source, _ in pairs), concern)
        return {name: item for name, _, item in pairs}

    def _collect(self, hook_name: str) -> list[tuple[str, Any]]:
        """Each item a hook returns, with the name of the plugin that returned it.

        Each plugin is called through a subset hook caller, so the source of every item is known
        and a duplicate can name both plugins.
        """
        collected = []
        for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
            for item in self._call_one(hook_name, impl.plugin):
                collected.append((impl.plugin_name, item))
        return collected

    def _call_one(self, hook_name: str, plugin: object) -> list[Any]:
        others = [p for p in self.pm.get_plugins() if p is not plugin]
        results = self.pm.subset_hook_caller(hook_name, remove_plugins=others)()
        return [item for result in results for item in (result or ())]

    @staticmethod
    def _unique(pairs: Iterable[tuple[str, str]], concern: str) -> None:
        owner: dict[str, str] = {}
        for name, source in pairs:
            if name in owner:
                raise PluginError(f"{concern} {name!r} is registered twice: by {owner[name]} and by {source}")
            owner[name] = source


_REGISTRATION_HOOKS = (
    "trajkit_model_clients",
    "trajkit_sandbox_backends",
    "trajkit_toolsets",
    "trajkit_distributions",
    "trajkit_filters",
    "trajkit_scorers",
    "trajkit_writers",
    "trajkit_executors",
    "trajkit_compressors",
    "trajkit_token_counters",
    "trajkit_search_providers",
    "trajkit_config_tables",
)


def blocked_plugins() -> set[str]:
    return {name.strip() for name in os.environ.get(BLOCK_ENV, "").split(",") if name.strip()}


def load_plugins(
    *,
    entry_points: bool = True,
    extra: Iterable[tuple[str, object]] = (),
    blocked: set[str] | None = None,
) -> PluginHost:
    """Build a fresh plugin manager: built-ins, then entry points, then ``extra`` plugins.

    ``blocked`` (default: the names in ``$TRAJKIT_DISABLE_PLUGINS``) are skipped, built-ins included;
    a blocked name that is no plugin's is a warning (a misspelling would block nothing).
    A plugin that fails to import is recorded in ``load_errors`` and the run goes on without it.
    A duplicate plugin name or an unknown hook name raises :class:`PluginError`.
    """
    blocked = blocked_plugins() if blocked is None else blocked
    pm = pluggy.PluginManager("trajkit")
    pm.add_hookspecs(hookspecs)
    host = PluginHost(pm)
    for name in blocked:
        pm.set_blocked(name)

    for module_name in DEFAULT_PLUGINS:
        if module_name not in blocked:
            _register(host, module_name, importlib.import_module(module_name), "built-in")

    extra = list(extra)
    found = sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)
    named = {*DEFAULT_PLUGINS, *(ep.name for ep in found), *(name for name, _ in extra)}
    for name in sorted(blocked - named):
        inside = sorted(plugin for plugin in named if plugin.startswith(f"{name}."))  # a package's
        hint = f"; did you mean {' or '.join(map(repr, inside))}?" if inside else did_you_mean(name, named)
        log.warning("%s: no plugin is named %r%s", BLOCK_ENV, name, hint)

    if entry_points:
        for ep in found:
            dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist else "unknown distribution"
            if ep.name in blocked:
                continue
            try:
                plugin = ep.load()
            except Exception as exc:  # a broken plugin must not take the host down
                host.load_errors.append(PluginLoadError(ep.name, dist, f"{type(exc).__name__}: {exc}"))
                continue
            _register(host, ep.name, plugin, dist)

    for name, plugin in extra:
        _register(host, name, plugin, BY_CALLER)

    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        name = pm.get_name(exc.plugin) or repr(exc.plugin)
        raise PluginError(f"plugin {name!r} ({host.sources.get(name, '?')}): {exc}") from exc
    return host


def _register(host: PluginHost, name: str, plugin: object, source: str) -> None:
    existing = host.pm.get_plugin(name)
    if existing is not None:
        raise PluginError(f"plugin name {name!r} is used twice: by {host.sources[name]} and by {source}")
    try:
        host.pm.register(plugin, name=name)
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"plugin {name!r} ({source}): {exc}") from exc
    host.sources[name] = source
