"""The run's configuration from what was given (flags, a configuration file, library arguments)
and the settings models of the installed plugins.

The core's own settings are the fields of :class:`~trajkit.config.run_config.RunConfig`. Every plugin class
declares the rest in its ``Settings`` model, reached through one *concern* per registration hook:

- every plugin's settings live in a section per plugin (``[sandbox_options.docker]``,
  ``--docker.network``, ``$TRAJKIT_DOCKER_NETWORK``, ``--sandbox_option docker.network=host``;
  ``[model_options.openai]``, ``--openai.max_retries``, ``$TRAJKIT_OPENAI_MAX_RETRIES``);
- model clients' settings also answer to their bare key (``max_retries``, ``--max_retries``,
  ``$TRAJKIT_MAX_RETRIES``), for every client that declares it: a run uses one client, and the
  reference runner's flags and configuration files keep working. A client's own spelling wins over
  the bare one given in the same place (the same file, the environment, the command line).

Each value is validated by its plugin's model, and an error names where the value came from (the
flag, or the file and key), the plugin, the key and what it expects.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, SecretStr, ValidationError

from trajkit.config.run_config import RunConfig
from trajkit.config.settings import OptionError, build_settings, describe_field, did_you_mean, value_at

if TYPE_CHECKING:
    from trajkit.manager import PluginHost


@dataclass(frozen=True)
class Concern:
    """One kind of plugin whose classes declare settings."""

    title: str
    """How errors and ``--help`` name it: "sandbox backend"."""
    registry: str
    """The :class:`~trajkit.manager.PluginHost` attribute listing its classes by name."""
    section: str
    """The configuration's table of its settings, by plugin name: "sandbox_options"."""
    bare_aliases: bool = False
    """Each setting also answers to its bare key (``max_retries``, ``--max_retries``,
    ``$TRAJKIT_MAX_RETRIES``) besides ``NAME.KEY``, for every plugin of the concern declaring it."""

    @property
    def option_flag(self) -> str:
        """The generic ``NAME.KEY=VALUE`` flag: ``sandbox_option``."""
        return self.section.removesuffix("s")


CONCERNS = (
    Concern("model client", "model_clients", "model_options", bare_aliases=True),
    Concern("sandbox backend", "backends", "sandbox_options"),
    Concern("filter", "filters", "filter_options"),
    Concern("writer", "writers", "writer_options"),
    Concern("executor", "executors", "executor_options"),
    Concern("toolset", "toolsets", "toolset_options"),
    Concern("search provider", "search_providers", "search_options"),
)


def plugin_classes(host: PluginHost, concern: Concern) -> dict[str, Any]:
    return dict(getattr(host, concern.registry, {}))


class ConfigurationError(ValueError):
    """The given settings cannot make a run; the message names each place, key and problem."""


def resolve(
    host: PluginHost,
    given: Mapping[str, Any],
    places: Mapping[str, str] | None = None,
    *,
    toolsets: bool = True,
) -> RunConfig:
    """The run configuration for ``given`` settings.

    ``given`` holds core settings and model client settings by name and the plugin sections
    (``sandbox_options`` ...) as mappings of plugin name -> settings. ``places`` maps a dotted
    key (``max_retries``, ``sandbox_options.docker.network``) to where its value came from; keys
    without a place are named as flags (``--max_retries``).
    """
    places = dict(places or {})

    def place(key: str) -> str:
        parts = key.split(".")
        for end in range(len(parts), 0, -1):  # a value inside a table given as a whole
            found = places.get(".".join(parts[:end]))
            if found:
                return ".".join([found, *parts[end:]])
        return _flag_of(key)

    problems: list[str] = []
    given, tables = _plugin_tables(host, given, place, problems)
    core = {k: v for k, v in given.items() if k in RunConfig.model_fields}
    loose = {k: v for k, v in given.items() if k not in RunConfig.model_fields}
    sections = {c.section: _given_sections(core.pop(c.section, None) or {}) for c in CONCERNS}
    model = str(core.get("model") or RunConfig.model_fields["model"].default)
    problems += _spread_flat_settings(host, loose, sections["model_options"], places, place)
    resolved: dict[str, dict[str, BaseModel]] = {}
    for concern in CONCERNS:
        resolved[concern.section] = _validate_sections(
            host, concern, sections[concern.section], place, problems
        )
    from trajkit.manager import PluginError

    try:
        client = host.model_client(model)
    except PluginError:  # an unknown model is reported when the run starts, with the installed ones
        client = None
    if client is not None and client.name not in resolved["model_options"]:
        try:
            resolved["model_options"][client.name] = build_settings(
                client.Settings, {}, f"model client {client.name!r}", place
            )
        except OptionError as exc:
            problems.append(str(exc))
    try:
        config = RunConfig(**core, **resolved, tables=tables)
    except ValidationError as exc:
        problems.append(describe_errors(exc, place, RunConfig, core))
    if problems:
        raise ConfigurationError("; ".join(problems))
    if not toolsets:
        return config
    from trajkit.tools import ToolsetError

    try:
        host.configure_toolsets(config)
    except ToolsetError as exc:
        raise ConfigurationError(str(exc)) from None
    return config


def _plugin_tables(
    host: PluginHost, given: Mapping[str, Any], place: Any, problems: list[str]
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """``given`` without the tables plugins declare (``trajkit_config_tables``), and those
    tables with each entry validated by the table's model."""
    declared = host.config_tables
    clashes = sorted(set(declared) & set(RunConfig.model_fields))
    if clashes:
        problems.append(f"configuration tables {clashes} are named as core settings")
    rest = {k: v for k, v in given.items() if k != "tables" and (k not in declared or k in clashes)}
    nested = given.get("tables") or {}  # a configuration resolved before, given back
    for name in sorted(set(nested) - set(declared)):
        problems.append(f"{place('tables.' + name)}: no installed plugin reads a table [{name}]")
    tables: dict[str, dict[str, Any]] = {}
    for name, table in declared.items():
        entries = given.get(name, nested.get(name))
        if name in clashes or entries is None:
            continue
        if not isinstance(entries, Mapping):
            problems.append(f"{place(name)}: expected a table of named entries ([{name}.NAME])")
            continue
        validated = {}
        for entry, data in entries.items():
            if isinstance(data, BaseModel):
                data = data.model_dump(exclude_unset=True)
            try:
                validated[str(entry)] = build_settings(
                    table.entry,
                    data if isinstance(data, Mapping) else {},
                    f"{table.title} {entry!r}",
                    functools.partial(_section_place, place, f"{name}.{entry}"),
                )
            except OptionError as exc:
                problems.append(str(exc))
        tables[name] = validated
    return rest, tables


def _given_sections(sections: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Plugin name -> the settings given; a validated instance (a configuration resolved before)
    gives the settings that were set, so its defaults stay defaults."""
    return {
        name: value.model_dump(exclude_unset=True)
        if isinstance(value, BaseModel)
        else dict(value)
        if isinstance(value, Mapping)
        else value  # not a table: the plugin's model says so
        for name, value in sections.items()
    }


def _flag_of(key: str) -> str:
    """The flag a dotted key would be given with: ``sandbox_options.docker.network`` ->
    ``--docker.network``, ``model_options.openai.max_retries`` -> ``--openai.max_retries``."""
    section, _, rest = key.partition(".")
    if rest and section in {concern.section for concern in CONCERNS}:
        return f"--{rest}"
    return f"--{key}"


def _spread_flat_settings(
    host: PluginHost,
    loose: dict[str, Any],
    model_options: dict[str, dict[str, Any]],
    places: dict[str, str],
    place: Any,
) -> list[str]:
    """Top-level keys that are model client settings (their bare aliases) go to every client that
    declares them, unless the client's section has the key; returns the problems with the keys
    that are no setting at all."""
    clients = plugin_classes(host, CONCERNS[0])
    unknown = []
    for key, value in loose.items():
        owners = [name for name, cls in clients.items() if key in cls.Settings.model_fields]
        for name in owners:
            model_options.setdefault(name, {}).setdefault(key, value)
            if key in places:
                places.setdefault(f"model_options.{name}.{key}", places[key])
            else:
                places.setdefault(f"model_options.{name}.{key}", f"--{key}")
        if not owners:
            known = [*RunConfig.model_fields, *(k for c in clients.values() for k in c.Settings.model_fields)]
            close = difflib.get_close_matches(key, known, n=1)
            unknown.append(
                f"{place(key)}: no such setting" + (f" (did you mean {close[0]}?)" if close else "")
            )
    if unknown:
        unknown[-1] += " (`trajkit settings` lists them all)"
    return unknown


def _validate_sections(
    host: PluginHost,
    concern: Concern,
    sections: Mapping[str, Mapping[str, Any]],
    place: Any,
    problems: list[str],
) -> dict[str, BaseModel]:
    classes = plugin_classes(host, concern)
    validated: dict[str, BaseModel] = {}
    for name, data in sections.items():
        cls = classes.get(name)
        if cls is None:
            hint = host.hints_for(concern.title).get(name)
            installed = f"installed: {', '.join(sorted(classes)) or 'none'}"
            where = place(f"{concern.section}.{name}.{next(iter(data), '')}".rstrip("."))
            problems.append(
                f"{where}: no {concern.title} is called {name!r} "
                + (f"({hint.command})" if hint else f"({installed}){did_you_mean(name, classes)}")
            )
            continue
        try:
            validated[name] = build_settings(
                cls.Settings,
                data,
                f"{concern.title} {name!r}",
                functools.partial(_section_place, place, f"{concern.section}.{name}"),
            )
        except OptionError as exc:
            problems.append(str(exc))
    return validated


def _section_place(place: Callable[[str], str], section: str, key: str) -> str:
    return place(f"{section}.{key}")


def describe_errors(
    exc: ValidationError,
    place: Any,
    model: type[BaseModel] | None = None,
    given: Mapping[str, Any] | None = None,
) -> str:
    """Each problem of the core settings with its place (the flag, or the file and key), the
    value given and, with the ``model``, what the setting expects."""
    problems = []
    for error in exc.errors():
        path = [str(part) for part in error["loc"]]
        key = ".".join(path)
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            problems.append(f"{place(key)}: no such setting")
        elif model is not None and given is not None and key and error["type"] != "missing":
            value = value_at(given, path)
            problems.append(
                f"{place(key)}={value}: expects {key} to be {describe_field(model, path)}; {message}"
            )
        else:
            problems.append(f"{place(key)}: {message}" if key else message)
    return "; ".join(problems)


def secret_values(settings: Any) -> list[str]:
    """Every ``SecretStr`` value held by a settings model, nested models included."""
    found: list[str] = []
    if isinstance(settings, BaseModel):
        for key in type(settings).model_fields:
            found.extend(secret_values(getattr(settings, key)))
    elif isinstance(settings, SecretStr):
        found.append(settings.get_secret_value())
    elif isinstance(settings, Mapping):
        for value in settings.values():
            found.extend(secret_values(value))
    return [value for value in found if value]
