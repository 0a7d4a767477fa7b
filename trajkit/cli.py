"""The ``trajkit`` command line.

Every flag of the reference runner is accepted in both spellings (``--dataset_file`` and
``--dataset-file``) so existing commands keep working.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from trajkit import __version__
from trajkit.config.cli_options import (
    PluginCommand,
    SettingOption,
    given_settings,
    model_options,
    plugin_options,
    spellings,
)
from trajkit.config.run_config import ConfigFileError, RunConfig, read_config_file
from trajkit.manager import PluginError, PluginHost, load_plugins

if TYPE_CHECKING:
    from trajkit.tools import Tool

log = logging.getLogger("trajkit")


def option(
    name: str, dest: str | None = None, **kwargs: Any
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A click option under ``--snake_case`` and ``--kebab-case``, stored as ``dest`` (default: the name)."""
    return click.option(*spellings(name), dest or name, **kwargs)


def load_host(ctx: click.Context) -> PluginHost:
    host: PluginHost = ctx.obj
    for error in host.load_errors:
        log.warning("%s", error)
    return host


class TrajkitGroup(click.Group):
    """Loads plugins before parsing, so plugins can add commands.

    The commands plugins add go to a copy of the group made for the invocation: the next
    invocation in the same process (a library caller's, a test's) sees the plugins installed then,
    not these.
    """

    def main(self, *args: Any, **kwargs: Any) -> Any:
        try:
            host = load_plugins()
        except PluginError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        invocation = copy.copy(self)
        invocation.commands = dict(self.commands)
        host.register_commands(invocation)
        kwargs.setdefault("obj", host)
        return super(TrajkitGroup, invocation).main(*args, **kwargs)


class CurrentStderr(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record comes, not what it was when made."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


@click.group(cls=TrajkitGroup)
@click.version_option(__version__, prog_name="trajkit")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Turn a JSONL file of prompts into tool-calling agent trajectories for training."""
    # Our own progress at INFO; libraries (the HTTP clients log every request at INFO) only warnings,
    # on stderr for as long as the command runs (the logging of a process that called it is its own).
    root = logging.getLogger()
    handler, level = CurrentStderr(), log.level
    root.addHandler(handler)
    log.setLevel(logging.INFO)

    @ctx.call_on_close
    def restore() -> None:
        root.removeHandler(handler)
        log.setLevel(level)


@cli.command(cls=PluginCommand, plugin_params=lambda host, _command: run_params(host))
@click.pass_context
def run(ctx: click.Context, **flags: Any) -> None:
    """Run every prompt of DATASET_FILE through an agent session and write the run directory.

    Flags of the core come first, then each installed plugin's settings; every flag is also a key
    of the --config file (plugins' settings in their sections, e.g. [sandbox_options.docker]).
    `trajkit settings` lists them all with their types and defaults.
    """
    host = load_host(ctx)
    listing = flags.pop("list_distributions")
    for param in ctx.command.get_params(ctx):  # --api_key, --openai.api_key, a third party's
        name = param.name or ""
        if (
            name.rpartition("__")[2] == "api_key"
            and ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE
        ):
            log.warning(
                "%s: the key is visible to every process of this machine; "
                "prefer the environment or --api_key_file",
                param.opts[0],
            )
    resume_dir = flags.pop("resume_dir")
    given, places = read_given(ctx, flags)
    if listing:  # with this command's settings: a toolset's problem depends on them
        print_distributions(host, configure(host, given, places))
        return
    if resume_dir is not None:
        given.update(resume_settings(given, Path(resume_dir) if resume_dir else None))
    if not given.get("run_name"):
        raise click.UsageError(
            "--run_name is required (on the command line or in --config), or --resume RUN_DIR"
        )
    if not given.get("dataset_file") and not given.get("resume"):
        raise click.UsageError("--dataset_file is required (on the command line or in --config)")
    ctx.exit(run_and_report(configure(host, given, places), host))


def resume_settings(given: dict[str, Any], run_dir: Path | None) -> dict[str, Any]:
    """``--resume`` or ``--resume RUN_DIR``: continue a run, named by its directory or by
    --output_dir and --run_name as before."""
    if run_dir is None:
        return {"resume": True}
    if not run_dir.is_dir():
        raise click.BadParameter(f"{run_dir}: no such run directory", param_hint="--resume")
    named = {"output_dir": run_dir.parent, "run_name": run_dir.name}
    for key, value in named.items():
        if given.get(key) is not None and Path(str(given[key])) != Path(str(value)):
            raise click.UsageError(f"--resume {run_dir} and --{key} {given[key]} name different runs")
    return {"resume": True, **named}


def read_given(ctx: click.Context, flags: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The settings given to a command, flags over its --config file, and where each came from."""
    config_path = flags.pop("config", None)
    try:
        from_file = read_config_file(config_path) if config_path else {}
    except ConfigFileError as exc:
        raise click.UsageError(str(exc)) from None
    given, places = given_settings(ctx, flags, from_file, config_path)
    prefill = given.get("prefill_messages_file")
    if prefill:
        if not Path(prefill).is_file():
            raise click.BadParameter(f"{prefill}: no such file", param_hint="--prefill_messages_file")
        given["prefill_messages"] = read_prefill(Path(prefill))
    return given, places


def configure(host: PluginHost, given: dict[str, Any], places: dict[str, str]) -> RunConfig:
    """The run configuration, or a usage error naming each bad setting and where it came from."""
    from trajkit.config.resolve import ConfigurationError, resolve

    try:
        return resolve(host, given, places)
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from None


def run_params(host: PluginHost) -> list[click.Parameter]:
    """The flags of ``trajkit run``: the core's settings, its own flags, every plugin's settings."""
    return [
        *model_options(RunConfig, group="Run", skip=("resume",)),
        SettingOption(
            [*spellings("resume"), "resume_dir"],
            group="Run",
            is_flag=False,
            flag_value="",
            default=None,
            metavar="[RUN_DIR]",
            help="Continue the run with the settings it was made with (run.json): --resume RUN_DIR "
            "alone, or with --output_dir and --run_name; flags given override them, and a changed "
            "setting that shapes the output needs --allow_change KEY.",
        ),
        SettingOption(
            [*spellings("config"), "config"],
            group="Run",
            default=None,
            type=click.Path(path_type=Path, exists=True, dir_okay=False),
            help="TOML or YAML file with any of these settings; flags override it.",
        ),
        SettingOption(
            [*spellings("prefill_messages_file"), "prefill_messages_file"],
            target=("prefill_messages_file",),
            group="Run",
            default=None,
            type=click.Path(path_type=Path, exists=True, dir_okay=False),
            help="JSON list of few-shot messages; used, never saved.",
        ),
        SettingOption(
            [*spellings("list_distributions"), "list_distributions"],
            group="Run",
            is_flag=True,
            help="List toolset distributions and exit.",
        ),
        *plugin_options(host),
    ]


def run_and_report(config: RunConfig, host: PluginHost) -> int:
    """Run and report; returns the process exit code."""
    from trajkit.model import ModelConfigError
    from trajkit.run.dataset import DatasetError
    from trajkit.run.files import RunIOError
    from trajkit.run.lock import RunLocked
    from trajkit.run.runner import EXIT_IO, EXIT_LOCKED, EXIT_USAGE, RunError, Runner
    from trajkit.run.settings import resume_command
    from trajkit.tools import ToolsetError

    _raise_open_file_limit()
    runner: Runner | None = None
    try:
        runner = Runner(config, host)
        with _children_waited_in_the_loop():
            outcome = asyncio.run(runner.run())
    except (RunError, PluginError, ModelConfigError, DatasetError, ToolsetError) as exc:
        click.echo(f"error: {exc}", err=True)
        return EXIT_USAGE
    except RunLocked as exc:
        click.echo(f"error: {exc}", err=True)
        return EXIT_LOCKED
    except (RunIOError, OSError) as exc:
        if not isinstance(exc, RunIOError):
            exc = RunIOError.of(exc, config.run_dir)
        click.echo(f"error: {exc}", err=True)
        command = runner.resume_command() if runner is not None else resume_command(config)
        click.echo(f"once that is fixed, continue with: {command}", err=True)
        return EXIT_IO
    stats = outcome.statistics
    samples = int(stats.get("samples_per_prompt", 1))
    click.echo(
        f"{runner.run_dir}: {stats['done']}/{stats.get('work_items', stats['dataset_rows'])} "
        + (f"samples done ({stats['dataset_rows']} rows x {samples}), " if samples > 1 else "rows done, ")
        + f"{stats['kept']} kept, "
        f"{stats['rejected']} rejected, {stats['pending']} pending"
        + (f", {stats['failed_for_good']} failed for good" if stats.get("failed_for_good") else "")
        + (f", {len(outcome.row_errors)} invalid rows" if outcome.row_errors else ""),
        err=True,
    )
    if stats.get("failed_for_good"):
        classes = stats["failures"]["failed_for_good_by_class"]
        click.echo(
            f"failed for good ({', '.join(f'{name}: {n}' for name, n in classes.items())}): no attempt can "
            "succeed with these settings, so a resume runs them again only if a setting that shapes the "
            f"sessions changes (model, endpoint, max_tokens...); `trajkit status {config.run_dir}` lists them",
            err=True,
        )
    if stats["pending"] or runner.interrupted:
        click.echo(finish_hint(runner, stats), err=True)
    return outcome.exit_code


def finish_hint(runner: Any, stats: dict[str, Any]) -> str:
    """What continues the run: a command that works as printed (at ``--max_cost``, with a cap that
    covers the rows still pending at the run's mean cost per session), after what it cannot hold."""
    from trajkit.run.settings import unsaved_secrets

    config = runner.config
    extra: list[str] = []
    lines = [
        f"{'--' + key} is never saved: give it again, or use the environment or a key file"
        for key in unsaved_secrets(config)
    ]
    cap = config.max_cost
    if cap is not None and runner.stop_reason and "--max_cost" in runner.stop_reason:
        attempts = stats["done"] + stats["failures"]["failed_attempts"]
        mean = stats["spent"]["cost"] / attempts if attempts else 0.0
        needed = stats["spent"]["cost"] + stats["pending"] * mean
        suggested = math.ceil((max(needed, cap) * 1.1 + mean) * 100) / 100
        extra = ["--max_cost", f"{suggested:.2f}"]
        lines.append(
            f"--max_cost {cap:g} reached: the {stats['pending']} pending need about "
            f"${needed - stats['spent']['cost']:,.4f} more at ${mean:,.4f} a session"
        )
    return "\n".join([*lines, f"to finish: {runner.resume_command(*extra)}"])


@contextlib.contextmanager
def _children_waited_in_the_loop() -> Iterator[None]:
    """Before Python 3.12, asyncio waits for each child process in a thread of its own; a pidfd
    watcher waits in the event loop instead, a third less CPU per command (BENCHMARKS.md). The
    watcher belongs to the process's event loop policy: the one before is put back after."""
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        yield  # 3.12 chooses pidfd by itself
        return
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        yield
        return
    # None when none was asked for yet: asyncio makes its default when one is.
    before = getattr(asyncio.get_event_loop_policy(), "_watcher", None)
    asyncio.set_child_watcher(asyncio.PidfdChildWatcher())
    try:
        yield
    finally:
        asyncio.set_child_watcher(before)  # type: ignore[arg-type]  # None: the default again


def _raise_open_file_limit() -> None:
    """Every session holds a few descriptors (a connection, pipes, files): at hundreds in flight the
    common soft limit of 1024 runs out, so take as many as the hard limit allows."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def read_prefill(path: Path) -> list[dict[str, Any]]:
    from trajkit.model.prefill import check_prefill

    hint = "--prefill_messages_file"
    try:
        messages = json.loads(path.read_text())
    except ValueError as exc:
        raise click.BadParameter(f"{path}: invalid JSON: {exc}", param_hint=hint) from None
    try:
        return check_prefill(messages)
    except ValueError as exc:
        raise click.BadParameter(f"{path}: {exc}", param_hint=hint) from None


def print_distributions(host: PluginHost, config: RunConfig, as_json: bool = False) -> None:
    """Each distribution: its toolsets with their weights, and which of them this run could not
    offer and why."""
    from trajkit.tools.offer import OfferError, listing

    try:
        entries = listing(config, host)
    except OfferError as exc:
        raise click.UsageError(str(exc)) from None
    if as_json:
        for entry in entries:
            click.echo(json.dumps(entry))
        return
    reasons: dict[str, str] = {}
    for entry in entries:
        shares = ", ".join(f"{ts} {p:.0%}" for ts, p in entry["probabilities"].items())
        click.echo(f"{entry['name']}{' (default)' if entry['default'] else ''}: {shares}")
        click.echo(f"    {entry['description']}")
        if entry["missing"]:
            missing = f"missing: {', '.join(entry['missing'])}"
            if entry["stops"]:
                state = f"a run stops until {', '.join(entry['stops'])} is set up"
            elif entry["offered_here"]:
                state = "offers " + ", ".join(f"{ts} {p:.0%}" for ts, p in entry["offered_here"].items())
            else:
                state = "cannot run"
            click.echo(f"    here: {state} ({missing})")
            reasons.update(entry["missing"])
    if reasons:
        click.echo("\nmissing toolsets:")
        for name, reason in sorted(reasons.items()):
            click.echo(f"    {name}: {reason}")


@cli.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    help="A run's configuration file: its distributions and toolset settings count.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per distribution.")
@click.option("--markdown", is_flag=True, help="A Markdown table (the README's is made so).")
@click.pass_context
def distributions(ctx: click.Context, config_path: Path | None, as_json: bool, markdown: bool) -> None:
    """List toolset distributions: each one's toolsets with the share of prompts offered each,
    and which of them cannot be offered here and why."""
    from trajkit.tools.offer import markdown_table

    host = load_host(ctx)
    if markdown:
        click.echo(markdown_table(host), nl=False)
        return
    print_distributions(host, configure_from_file(host, config_path), as_json)


def configure_from_file(host: PluginHost, config_path: Path | None) -> RunConfig:
    """The configuration a listing command reads from its ``--config`` file (defaults without)."""
    try:
        given = read_config_file(config_path) if config_path else {}
    except ConfigFileError as exc:
        raise click.UsageError(str(exc)) from None
    return configure(host, given, {key: f"{config_path}: {key}" for key in given})


@cli.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    help="A run's configuration file: the toolsets it configures (its [mcp_servers]) count.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per toolset.")
@click.pass_context
def toolsets(ctx: click.Context, config_path: Path | None, as_json: bool) -> None:
    """List the toolsets a run could offer: each one's tools, and why one cannot be offered here."""
    host = load_host(ctx)
    config = configure_from_file(host, config_path)
    toolsets = sorted(host.toolsets.items())

    async def list_all() -> list[tuple[tuple[Tool, ...], str | None]]:
        return list(await asyncio.gather(*(toolset.listed_tools() for _, toolset in toolsets)))

    for (name, toolset), (listed, note) in zip(toolsets, asyncio.run(list_all()), strict=True):
        problem = toolset.problem(config.settings_of(toolset))
        tools = {tool.name: _first_sentence(tool.description) for tool in listed}
        if as_json:
            described = {"toolset": name, "description": toolset.description, "problem": problem}
            click.echo(json.dumps({**described, "note": note, "tools": tools}, ensure_ascii=False))
            continue
        click.echo(f"{name}: {toolset.description}" + (f" (not offered here: {problem})" if problem else ""))
        if note:
            click.echo(f"  ({note})")
        for tool, description in tools.items():
            click.echo(f"  {tool}" + (f": {description}" if description else ""))


def _first_sentence(text: str) -> str:
    first = " ".join(text.split()).split(". ")[0]
    return first if first.endswith(".") or not first else first + "."


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object per setting.")
@click.option("--markdown", is_flag=True, help="A reference page (docs/settings.md is made so).")
@click.pass_context
def settings(ctx: click.Context, as_json: bool, markdown: bool) -> None:
    """List every setting of `trajkit run`: its configuration key, flag, type, default and what it
    does, the core's first, then each installed plugin's."""
    from trajkit.config.cli_options import every_setting, settings_page
    from trajkit.config.settings import field_type

    if markdown:
        click.echo(settings_page(load_host(ctx)), nl=False)
        return
    group = None
    for title, key, flag, env, field, aliases in every_setting(load_host(ctx)):
        default = None if field.is_required() else field.get_default(call_default_factory=True)
        if as_json:
            kind = field_type(field)
            entry = {
                "group": title,
                "key": key,
                "flag": flag,
                "variable": env,
                "type": kind,
                "default": default,
            }
            if aliases:
                entry["aliases"] = dict(zip(("key", "flag", "variable"), aliases, strict=True))
            click.echo(json.dumps({**entry, "description": field.description or ""}, default=str))
            continue
        if title != group:
            group = title
            click.echo(f"\n{title}:" if title != "run" else "run (the core):")
        click.echo(f"  {key} = {json.dumps(default, default=str)}")
        where = f"; {flag}; ${env}" if flag else "; configuration file only"
        click.echo(f"      {field_type(field)}{where}")
        if aliases:
            bare_key, bare_flag, bare_env = aliases
            click.echo(f"      also: {bare_key}" + (f"; {bare_flag}; ${bare_env}" if bare_flag else ""))
        if field.description:
            click.echo(f"      {' '.join(field.description.split())}")


@cli.command()
@click.pass_context
def plugins(ctx: click.Context) -> None:
    """List installed plugins, where they come from, and what each registers."""
    host = load_host(ctx)
    for name, plugin in sorted(host.pm.list_name_plugin(), key=lambda pair: pair[0]):
        hooks = sorted(h.name for h in host.pm.get_hookcallers(plugin) or [])
        click.echo(f"{name}  [{host.sources.get(name, '?')}]")
        click.echo(f"    hooks: {', '.join(hooks)}")
        for concern, names in host.registrations(plugin).items():
            click.echo(f"    {concern}: {', '.join(names)}")
    for error in host.load_errors:
        click.echo(f"BROKEN {error}")


@cli.command()
@click.argument("run_dir", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.pass_context
def status(ctx: click.Context, run_dir: Path) -> None:
    """Where a run stands, from its ledger as it is now: done, rejected, failing, pending, spent."""
    from trajkit.run.files import RunIOError
    from trajkit.run.rundir import RunDir
    from trajkit.run.runner import EXIT_IO
    from trajkit.run.view import NotARun, run_status

    try:
        summary = run_status(RunDir(run_dir), load_host(ctx))
    except NotARun as exc:
        raise click.ClickException(str(exc)) from None
    except (RunIOError, OSError) as exc:
        click.echo(f"error: {exc if isinstance(exc, RunIOError) else RunIOError.of(exc, run_dir)}", err=True)
        sys.exit(EXIT_IO)
    problems = summary.pop("problems")
    final = summary.pop("failed_for_good_rows")
    note = summary.pop("note")
    for key, value in summary.items():
        if value is not None and value != {}:
            click.echo(f"{key:18} {value}")
    if note:
        click.echo(f"note: {note}; the figures above come from the ledger alone")
    for problem in problems:
        click.echo(f"bad ledger line: {problem} (its prompt runs again on --resume)")
    for line in final:
        click.echo(f"failed for good: {line}")


@cli.group()
def sandbox() -> None:
    """Sandbox maintenance."""


@sandbox.command()
@click.option("--backend", "names", multiple=True, help="Only these backends (default: all installed).")
@click.option("--run-id", default=None, help="Remove every sandbox of this run id, alive or not.")
@click.pass_context
def reap(ctx: click.Context, names: tuple[str, ...], run_id: str | None) -> None:
    """Remove sandboxes left behind by crashed runs."""
    host = load_host(ctx.find_root())

    async def reap_all() -> None:
        for name in names or sorted(host.backends):
            try:
                backend = host.backend(name)()
                removed = await backend.reap(run_id)
                await backend.aclose()
            except Exception as exc:
                click.echo(f"{name}: {exc}", err=True)
                continue
            click.echo(f"{name}: removed {removed}")

    asyncio.run(reap_all())


def main() -> None:
    cli(prog_name="trajkit")
