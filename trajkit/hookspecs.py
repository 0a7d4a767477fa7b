"""Hook specifications: everything concrete in trajkit is a plugin of these hooks.

Built-in plugins (``trajkit/plugins/``) and third-party ones (entry-point group ``trajkit``) use the
same hooks. A plugin module implements any subset of them with ``@trajkit.hookimpl``; a hook name
that is not listed here is an error when the plugin manager is built.

Registration hooks (``trajkit_model_clients`` ... ``trajkit_writers``, ``trajkit_scorers``, ``trajkit_executors``,
``trajkit_compressors``, ``trajkit_token_counters``, ``trajkit_search_providers``) are called once when the run or command builds its registry. Every
implementation's result is collected; two plugins registering the same ``name`` within one concern
is an error that names both sources.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    import click
    from pydantic import BaseModel

    from trajkit.compress.base import Compressor, TokenCounter
    from trajkit.config.run_config import RunConfig
    from trajkit.model import ModelClient
    from trajkit.record.filters import Record, TrajectoryFilter
    from trajkit.record.scorers import Scorer
    from trajkit.record.writers import OutputWriter
    from trajkit.run.executor import Executor
    from trajkit.sandbox import SandboxBackend
    from trajkit.tools import Toolset
    from trajkit.tools.distributions import Distribution
    from trajkit.tools.search import SearchProvider

hookspec = pluggy.HookspecMarker("trajkit")
hookimpl = pluggy.HookimplMarker("trajkit")


@dataclass(frozen=True)
class PackageHint:
    """Where a plugin that is not installed comes from (:func:`trajkit_package_hints`)."""

    package: str
    """The distribution's name (``trajkit-docker``)."""
    concern: str = ""
    """What the plugin is (``sandbox backend``, ``executor``), so a hint is offered only where
    that kind of plugin is asked for; empty: unknown."""
    install: str = ""
    """How to install it, as a user would type it (default: ``pip install PACKAGE``)."""

    @property
    def command(self) -> str:
        return self.install or f"pip install {self.package}"


@dataclass(frozen=True)
class ConfigTable:
    """A top-level table of named entries that a plugin reads from the configuration file
    (:func:`trajkit_config_tables`): ``[mcp_servers.NAME]``."""

    name: str
    """The table's key in the configuration file (``mcp_servers``)."""
    entry: type[BaseModel]
    """The pydantic model each entry is validated against; errors name the file and key."""
    title: str
    """How errors name one entry (``MCP server``)."""


@dataclass(frozen=True)
class RunInfo:
    """What lifecycle hooks learn about the run they observe."""

    run_name: str
    run_dir: Path
    config: RunConfig


@hookspec
def trajkit_model_clients() -> Sequence[type[ModelClient]]:
    """Register model clients.

    :return: :class:`trajkit.model.ModelClient` subclasses, each with a unique ``name``; ``--model``
        selects one by name (``scripted``) or, for any other value, the ``openai`` client
        serves it as a model slug. All implementations' results are collected.
    """


@hookspec
def trajkit_sandbox_backends() -> Sequence[type[SandboxBackend]]:
    """Register sandbox backends.

    :return: :class:`trajkit.sandbox.SandboxBackend` subclasses, each with a unique ``name``. Rows
        choose one with their ``backend`` field; ``--sandbox`` and ``--image_backend`` set the
        defaults. A backend is only instantiated if some row of the run routes to it.
    """


@hookspec
def trajkit_toolsets() -> Sequence[Toolset]:
    """Register toolsets.

    :return: :class:`trajkit.tools.Toolset` objects; toolset names and tool names must be unique
        across all plugins.
    """


@hookspec
def trajkit_config_tables() -> Sequence[ConfigTable]:
    """Declare top-level tables of named entries in a run's configuration file.

    Called once, when a command first resolves a run's configuration. Each entry of a declared
    table (``[mcp_servers.git]``) is validated against the table's model and kept in
    :attr:`trajkit.config.run_config.RunConfig.tables` (``config.tables["mcp_servers"]["git"]``), and saved
    with the run's settings.

    :return: :class:`ConfigTable` objects with unique names. All implementations' results are
        collected; two tables of the same name, or one named as a core setting, are an error.
    """


@hookspec
def trajkit_configured_toolsets(config: RunConfig) -> Sequence[Toolset]:
    """Build toolsets from a run's configuration (one per configured server, say).

    Called once per resolved configuration (:func:`trajkit.config.resolve.resolve`), after its
    values are validated and before the run plans its draws, in the process that resolves it.
    Unlike :func:`trajkit_toolsets` it may take time: it is where a toolset learns the tools it
    offers every session by asking for them (a shared MCP server's ``tools/list``), within a
    bounded timeout. A toolset whose tools exist only in a session (a server started in the
    session's sandbox) returns no tools here and gives them per session with
    :meth:`trajkit.tools.Toolset.session_tools`.

    :param config: the run's validated configuration (its plugin tables in ``config.tables``).
    :return: :class:`trajkit.tools.Toolset` objects, added to those the run may draw and name;
        their names and tool names must be unique among all toolsets. All implementations'
        results are collected. Raise :class:`trajkit.tools.ToolsetError` to stop the run before
        anything is written, with a message that names no secret.
    """


@hookspec
def trajkit_distributions() -> Sequence[Distribution]:
    """Register toolset distributions.

    :return: :class:`trajkit.tools.distributions.Distribution` objects with unique names. A distribution
        may name toolsets of other packages: a run draws over those it can offer and says which it
        leaves out (:mod:`trajkit.tools.offer`). At most one installed distribution is marked
        ``default``: the one a run draws when no ``--distribution`` is given.
    """


@hookspec
def trajkit_filters() -> Sequence[type[TrajectoryFilter]]:
    """Register trajectory filters.

    :return: :class:`trajkit.record.filters.TrajectoryFilter` subclasses with unique names. Those with
        ``enabled_by_default`` run unless ``--no_filter NAME`` turns them off; others run when
        named with ``--filter NAME``. A trajectory is rejected by the first filter, in name
        order, that gives a reason.
    """


@hookspec
def trajkit_scorers() -> Sequence[type[Scorer]]:
    """Register scorers: they verify a trajectory against its dataset row's check.

    Called once where sessions run, when the session function is built (each worker of a
    distributed executor calls it too). Every scorer whose ``fields`` the row carries scores the
    session after its last turn, in its still-open sandbox, before the sandbox is closed; rows
    whose check a scorer rejects (``row_problem``) are bad rows, reported before any session.

    :return: :class:`trajkit.record.scorers.Scorer` subclasses with unique names. All implementations'
        results are collected; the checks of every scorer that applies are combined into the
        record's ``score`` (passed when every check passed, value the mean of their values), in
        name order; two scorers of the same name are an error naming both plugins.
    """


@hookspec
def trajkit_writers() -> Sequence[type[OutputWriter]]:
    """Register output writers.

    :return: :class:`trajkit.record.writers.OutputWriter` subclasses with unique names; ``--writer``
        selects them, the ones marked ``default`` when it is not given.
    """


@hookspec
def trajkit_executors() -> Sequence[type[Executor]]:
    """Register executors: where a run's sessions run (this process, worker processes, a cluster).

    Called once, when ``trajkit run`` first needs the registry (before reading the dataset).

    :return: :class:`trajkit.run.executor.Executor` subclasses, each with a unique ``name`` and its
        settings as a pydantic model in ``Settings``; ``--executor NAME`` selects one (``local``,
        this process's event loop, by default) and ``[executor_options.NAME]`` holds its settings.
        An executor receives the pending work items and hands back records or failures; it never
        touches the run directory. All implementations' results are collected; two executors of
        the same name are an error naming both plugins.
    """


@hookspec
def trajkit_compressors() -> Sequence[type[Compressor]]:
    """Register trajectory compressors (strategies of ``trajkit compress``).

    Called once, when a command first needs the registry (``trajkit compress``).

    :return: :class:`trajkit.compress.base.Compressor` subclasses, each with a unique ``name`` and
        its settings as a pydantic model in ``Settings``; ``--strategy`` selects one by name and
        ``--option KEY=VALUE`` is validated against its ``Settings``. All implementations' results
        are collected; two compressors of the same name are an error naming both plugins.
    """


@hookspec
def trajkit_token_counters() -> Sequence[type[TokenCounter]]:
    """Register token counters (how ``trajkit compress`` measures a trajectory against its budget).

    Called once, when a command first needs the registry.

    :return: :class:`trajkit.compress.base.TokenCounter` subclasses, each with a unique ``name``
        and a pydantic ``Settings`` model; ``--tokenizer NAME`` selects one by name, and any other
        value is passed as the ``source`` setting of the counter that sets ``accepts_source``.
        All implementations' results are collected; duplicate names are an error naming both.
    """


@hookspec
def trajkit_search_providers() -> Sequence[type[SearchProvider]]:
    """Register web search providers (what the ``web`` toolset's ``web_search`` asks).

    Called once, when a command first needs the registry: building the flags of ``trajkit run``
    (each provider's ``Settings`` become ``--NAME.KEY`` and ``[search_options.NAME]``), and when
    the ``web`` toolset starts for a run, in each process where its sessions run.

    :return: :class:`trajkit.tools.search.SearchProvider` subclasses, each with a unique ``name``, its
        settings as a pydantic model in ``Settings`` and the environment variable of its key in
        ``key_variable``; ``--web.search_provider NAME`` selects one. All implementations' results
        are collected; two providers of the same name are an error naming both plugins.
    """


@hookspec
def trajkit_package_hints() -> Mapping[str, str | PackageHint]:
    """Name plugins that live in packages of their own, so a name that is not installed can say
    what to install.

    Called when a name (a sandbox backend, ...) is asked for and no installed plugin has it.

    :return: plugin name -> the package that provides it: a :class:`PackageHint`, or the name of a
        package on the package index (``pip install NAME`` installs it). Results are merged; for
        a name given by several plugins the first answer counts, and plugins registered later
        (installed packages, after the built-ins) are asked first.
    """


@hookspec
def trajkit_commands(cli: click.Group) -> None:
    """Add subcommands to the ``trajkit`` command line.

    Called once when the CLI starts, before arguments are parsed.

    :param cli: the top-level click group; add commands with ``cli.command()`` or
        ``cli.add_command``.
    """


@hookspec
def trajkit_run_start(run: RunInfo, pending: int) -> None:
    """The run is about to start sessions.

    :param run: the run being started.
    :param pending: how many work items this invocation will attempt.
    """


@hookspec
def trajkit_trajectory_finished(run: RunInfo, record: Record, rejection: str | None) -> None:
    """A session ended successfully and its record was appended to the ledger.

    Called in the driving process, on the event loop: keep it quick and do not block.

    :param run: the run it belongs to.
    :param record: the trajectory record as written to the ledger.
    :param rejection: ``"filter: reason"`` if a filter rejected it, else None.
    """


@hookspec
def trajkit_run_end(run: RunInfo, statistics: Mapping[str, Any]) -> None:
    """The run has stopped (finished or interrupted) and ``statistics.json`` was written.

    :param run: the run that stopped.
    :param statistics: the statistics of the whole run, across invocations.
    """
