"""Command-line flags made from settings models, and the settings a command was given.

Every flag comes from a field: the core's (:class:`~trajkit.config.run_config.RunConfig`), a command's own
model, or a plugin's ``Settings``. The field's type makes the flag's type, its docstring the help,
its default the shown default (one default, in the model). Flags are accepted in both spellings
(``--max_turns``, ``--max-turns``); a flag not given stays ``None``, so the model's default holds
and a configuration file's value is not overridden by a default.

Every flag also reads an environment variable (:func:`variable`: ``TRAJKIT_MAX_TURNS``,
``TRAJKIT_DOCKER_NETWORK``), as tox reads ``TOX_<KEY>``: a flag wins over its variable, a variable
over the configuration file, the file over the model's default.
"""

from __future__ import annotations

import functools
import json
import re
import typing
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import click
from click.core import ParameterSource
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from trajkit.config.resolve import CONCERNS, Concern, plugin_classes
from trajkit.config.settings import Metavar, documented, unwrap_optional

if TYPE_CHECKING:
    from trajkit.manager import PluginHost

Target = tuple[str, ...]
"""Where a flag's value goes in the given settings: ("max_turns",) or
("sandbox_options", "docker", "network")."""


class SettingOption(click.Option):
    """A flag that knows its ``--help`` group and where its value goes."""

    def __init__(
        self,
        *args: Any,
        group: str = "",
        target: Target = (),
        pairs: bool = False,
        field: tuple[type[BaseModel], str] | None = None,
        plugin: bool = False,
        alias_of: tuple[Target, ...] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.group = group
        self.alias_of = alias_of
        """A bare alias: the settings it gives its value to (each model client's ``KEY``)."""
        self.plugin = plugin
        """A plugin's setting: ``--help`` names its group, ``--help-all`` lists it."""
        self.target = target
        self.field = field
        """(model, field name): the help text is read from it when ``--help`` asks."""
        self.pairs = pairs
        """Takes ``NAME.KEY=VALUE`` items for the section ``target``."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        if self.help is None and self.field is not None:
            model, name = self.field
            self.help = help_text(model, name, model.model_fields[name])
        return super().get_help_record(ctx)


HELP_ALL = "trajkit.help_all"


def _help_all(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        ctx.meta[HELP_ALL] = True
        click.echo(ctx.get_help(), color=ctx.color)
        ctx.exit()


class GroupedCommand(click.Command):
    """``--help`` lists the flags by group: the command's own, then the names of the plugins whose
    flags ``--help-all`` lists, one group per plugin."""

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        params = [*self.params, *self.added_params(ctx)]
        help_option = self.get_help_option(ctx)
        params += [help_option] if help_option is not None else []
        if any(getattr(p, "plugin", False) for p in params):
            show_all = click.Option(
                ["--help-all"], is_flag=True, expose_value=False, is_eager=True, callback=_help_all,
                help="Show this message with every plugin's flags, and exit.",
            )  # fmt: skip
            params = [*params, show_all]
        return params

    def added_params(self, ctx: click.Context) -> list[click.Parameter]:
        """Flags made for this invocation, after the command's own."""
        return []

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        groups: dict[str, list[tuple[str, str]]] = {}
        plugins: list[str] = []
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            group = getattr(param, "group", "") or "Options"
            if getattr(param, "plugin", False) and not ctx.meta.get(HELP_ALL):
                plugins += [] if group in plugins else [group]
            elif record is not None:
                groups.setdefault(group, []).append(record)
        for title, records in groups.items():
            with formatter.section(title):
                formatter.write_dl(records)
        if plugins:
            with formatter.section("Plugins' flags (--help-all lists them; trajkit settings too)"):
                formatter.write_text("; ".join(plugins) + ".")


class PluginCommand(GroupedCommand):
    """A command with flags from the installed plugins' settings (``plugin_params(host, command)``;
    the host is the root context's object), made once per invocation: the command object is
    shared by every invocation in a process, and each may see other plugins."""

    def __init__(
        self,
        *args: Any,
        plugin_params: Callable[[PluginHost, click.Command], list[click.Parameter]],
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.plugin_params = plugin_params

    def added_params(self, ctx: click.Context) -> list[click.Parameter]:
        key = f"trajkit.plugin_params.{id(self)}"
        if key not in ctx.meta:  # one meta for the whole invocation, from the root context down
            from trajkit.manager import PluginError

            try:
                ctx.meta[key] = self.plugin_params(ctx.find_root().obj, self)
            except PluginError as exc:  # two plugins claim one flag
                raise click.UsageError(str(exc)) from None
        params: list[click.Parameter] = ctx.meta[key]
        return params


ENV_PREFIX = "TRAJKIT_"


def variable(target: Target) -> str:
    """The environment variable of the setting at ``target``: ``TRAJKIT_`` and the key path without
    its section, upper case (("sandbox_options", "docker", "network") -> ``TRAJKIT_DOCKER_NETWORK``)."""
    parts = target[1:] if target and target[0] in {c.section for c in CONCERNS} else target
    return ENV_PREFIX + re.sub(r"[^A-Z0-9]+", "_", "_".join(parts).upper())


def spellings(name: str) -> list[str]:
    return list(dict.fromkeys([f"--{name}", f"--{name.replace('_', '-')}"]))


_METAVARS = {int: "INTEGER", float: "FLOAT", Path: "PATH"}


def _comma_items(_ctx: click.Context, _param: click.Parameter, values: Any) -> list[str] | None:
    """Repeatable and comma-separated: ``--x a,b --x c`` -> [a, b, c]; not given -> None."""
    if not values:
        return None
    items = values if isinstance(values, tuple) else (values,)
    return [part.strip() for item in items for part in item.split(",") if part.strip()]


def field_option(
    name: str,
    field: FieldInfo,
    *,
    group: str,
    target: Target,
    flag: str | None = None,
    model: type[BaseModel] | None = None,
) -> SettingOption | None:
    """The flag of one setting, or None for a setting only a configuration file can hold."""
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    if extra.get("cli") is False:
        return None
    annotation, _ = unwrap_optional(field.annotation)
    origin = typing.get_origin(annotation)
    kwargs: dict[str, Any] = {"default": None}
    if annotation is bool:
        kwargs = {"is_flag": True, "default": None, "flag_value": True}
        if field.default is True:
            kwargs = {"type": click.BOOL, "default": None, "metavar": "true|false"}
    elif origin is Literal:
        kwargs["type"] = click.Choice([str(choice) for choice in typing.get_args(annotation)])
    elif origin is list and typing.get_args(annotation) in ((str,), ()):
        kwargs.update(multiple=True, callback=_comma_items, default=())
    elif annotation in (int, float, str, SecretStr) or (
        isinstance(annotation, type) and issubclass(annotation, Path)
    ):
        # Text, converted by the model: its validators (sizes such as 512m, "none") and its
        # error messages, which name the plugin and what it expects, apply to flags too.
        named = [item for item in field.metadata if isinstance(item, Metavar)]
        kwargs.update(type=str, metavar=named[0] if named else _METAVARS.get(annotation, "TEXT"))
    else:
        return None  # a table or a nested model: configuration file (or NAME.KEY=VALUE) only
    return SettingOption(
        [*spellings(flag or str(extra.get("flag") or name)), "__".join(target)],
        envvar=variable(target),
        group=group,
        target=target,
        field=(model, name) if model is not None else None,
        **kwargs,
    )


def help_text(model: type[BaseModel] | None, name: str, field: FieldInfo) -> str:
    """A setting's ``--help`` line: its description and its default."""
    if model is not None:
        field = documented(model).model_fields[name]
    text = " ".join((field.description or "").split())
    shown = field.default_factory is None and field.default not in (None, [], {}, ())
    if shown and len(str(field.default)) <= 40 and field.annotation is not bool:
        text = f"{text} [default: {field.default}]".strip()
    return text


def model_options(
    model: type[BaseModel], *, group: str, prefix: Target = (), skip: Iterable[str] = ()
) -> list[SettingOption]:
    """One flag per field of ``model`` (those a command line can say)."""
    options = []
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            options += model_options(field.annotation, group=group, prefix=(*prefix, name))
            continue
        flag = ".".join((*prefix, name)) if prefix else None
        option = field_option(name, field, group=group, target=(*prefix, name), flag=flag, model=model)
        if option is not None:
            options.append(option)
    return options


def plugin_flag(name: str, key: str, field: FieldInfo) -> str:
    """A plugin setting's flag: ``--NAME.KEY``, or the name its field gives
    (``json_schema_extra={"flag": "ray_address"}``)."""
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    return str(extra.get("flag") or f"{name}.{key}")


def bare_aliases(host: PluginHost, concern: Concern) -> dict[str, list[tuple[str, Any]]]:
    """A concern's bare keys (``max_retries``) -> the plugins declaring each: (name, class)."""
    aliases: dict[str, list[tuple[str, Any]]] = {}
    if concern.bare_aliases:
        for name, cls in sorted(plugin_classes(host, concern).items()):
            for key in cls.Settings.model_fields:
                aliases.setdefault(key, []).append((name, cls))
    return aliases


def plugin_options(host: PluginHost, concerns: Iterable[Concern] = CONCERNS) -> list[click.Parameter]:
    """The flags of every installed plugin's settings, grouped per plugin, a concern's bare aliases
    (``--max_retries`` for every model client declaring it), and per concern a generic
    ``--sandbox_option NAME.KEY=VALUE``."""
    from trajkit.config.run_config import RunConfig
    from trajkit.manager import PluginError

    options: list[click.Parameter] = []
    owners: dict[str, str] = {f: "the core" for f in RunConfig.model_fields}

    def claim(flag: str, group: str) -> None:
        if flag in owners:
            raise PluginError(f"the flag --{flag} is claimed by {owners[flag]} and by {group}")
        owners[flag] = group

    for concern in concerns:
        for name, cls in sorted(plugin_classes(host, concern).items()):
            group = f"{concern.title} {name!r}"
            for key, field in cls.Settings.model_fields.items():
                flag = plugin_flag(name, key, field)
                claim(flag, group)
                target = (concern.section, name, key)
                option = field_option(key, field, group=group, target=target, flag=flag, model=cls.Settings)
                if option is not None:
                    option.plugin = True
                    options.append(option)
        group = f"Every {concern.title} (the bare spelling of --NAME.KEY)"
        for key, declared in bare_aliases(host, concern).items():
            claim(key, f"{concern.title} {declared[0][0]!r}")
            model = declared[0][1].Settings
            option = field_option(
                key, model.model_fields[key], group=group, target=(key,), flag=key, model=model
            )
            if option is not None:
                option.alias_of = tuple((concern.section, name, key) for name, _ in declared)
                options.append(option)
        if not concern.bare_aliases:
            options.append(
                SettingOption(
                    [*spellings(concern.option_flag), concern.option_flag],
                    multiple=True,
                    group="Plugin settings",
                    target=(concern.section,),
                    pairs=True,
                    help=f"NAME.KEY=VALUE: a setting of the {concern.title} NAME, repeatable.",
                )
            )
    return options


def given_settings(
    ctx: click.Context, flags: Mapping[str, Any], from_file: Mapping[str, Any], config_path: Path | None
) -> tuple[dict[str, Any], dict[str, str]]:
    """The settings given, flags over their environment variables over the file, and where each
    came from (for error messages)."""
    given: dict[str, Any] = {}
    places: dict[str, str] = {}
    _merge(given, places, from_file, lambda key: f"{config_path}: {key}")
    params = {p.name: p for p in ctx.command.get_params(ctx) if isinstance(p, SettingOption)}
    chosen = []
    for dest, value in flags.items():
        param = params.get(dest)
        if param is None or not param.target or value is None:
            continue  # a command's own flag (--config ...), or a setting not given
        source = ctx.get_parameter_source(dest)
        if source is not ParameterSource.DEFAULT:
            chosen.append((source is not ParameterSource.ENVIRONMENT, not param.alias_of, param, value))
    # The environment first, then the flags; in each, a bare alias before the plugin's own spelling.
    for _, _, param, value in sorted(chosen, key=lambda item: item[:2]):
        from_environment = ctx.get_parameter_source(str(param.name)) is ParameterSource.ENVIRONMENT
        if param.pairs:
            _merge(
                given,
                places,
                {param.target[0]: _pairs(value, param)},
                functools.partial(_pair_place, param=param),
            )
            continue
        for target in param.alias_of or (param.target,):
            *parents, leaf = target
            node = given
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
            places[".".join(target)] = f"${param.envvar}" if from_environment else param.opts[0]
    return given, places


def _merge(
    given: dict[str, Any], places: dict[str, str], data: Mapping[str, Any], place: Callable[[str], str]
) -> None:
    sections = {c.section for c in CONCERNS}
    for key, value in data.items():
        if key in sections and isinstance(value, Mapping):
            section = given.setdefault(key, {})
            for name, settings in value.items():
                target = section.setdefault(name, {})
                for setting, item in settings.items() if isinstance(settings, Mapping) else ():
                    target[setting] = item
                    places[f"{key}.{name}.{setting}"] = place(f"{key}.{name}.{setting}")
                if not isinstance(settings, Mapping):
                    places[f"{key}.{name}"] = place(f"{key}.{name}")
                    section[name] = settings
        else:
            given[key] = value
            places[key] = place(key)


def _pairs(values: tuple[str, ...], param: SettingOption) -> dict[str, dict[str, str]]:
    """``("docker.network=host",)`` -> {"docker": {"network": "host"}}."""
    options: dict[str, dict[str, str]] = {}
    for item in values:
        key, sep, value = item.partition("=")
        plugin, dot, setting = key.partition(".")
        if not sep or not dot or not plugin or not setting:
            raise click.BadParameter(
                f"{item!r}: expected NAME.KEY=VALUE, e.g. docker.network=host", param=param
            )
        options.setdefault(plugin, {})[setting] = value
    return options


def _pair_place(key: str, *, param: SettingOption) -> str:
    _, _, rest = key.partition(".")
    return f"{param.opts[0]} {rest}"


class Setting(typing.NamedTuple):
    """One setting as ``trajkit settings`` lists it."""

    group: str
    """"run" for the core's, else the plugin: "sandbox backend 'docker'"."""
    key: str
    """Its configuration key: ``max_turns``, ``sandbox_options.docker.network``."""
    flag: str
    """Its flags ("--max_turns / --max-turns"), or "" when only a configuration file can hold it."""
    variable: str
    """Its environment variable, or "" when only a configuration file can hold it."""
    field: FieldInfo
    aliases: tuple[str, str, str] | None = None
    """Its bare spellings (key, flags, variable), for a model client's setting."""


def every_setting(host: PluginHost) -> Iterable[Setting]:
    """Every setting: the core's, then each plugin's by concern."""
    from trajkit.config.run_config import RunConfig

    def setting(group: str, key: str, field: FieldInfo, target: Target, flag: str | None) -> Setting:
        option = field_option(target[-1], field, group="", target=target, flag=flag)
        if option is not None:
            return Setting(group, key, " / ".join(option.opts), str(option.envvar), field)
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        own = " / ".join(spellings(str(extra["flag"]))) if extra.get("flag") else ""  # a command's own
        return Setting(group, key, own, "", field)

    for key, field in documented(RunConfig).model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            for inner, inner_field in documented(field.annotation).model_fields.items():
                yield setting("run", f"{key}.{inner}", inner_field, (key, inner), f"{key}.{inner}")
        elif not key.endswith("_options"):
            yield setting("run", key, field, (key,), None)
    for concern in CONCERNS:
        for name, cls in sorted(plugin_classes(host, concern).items()):
            for key, field in documented(cls.Settings).model_fields.items():
                target = (concern.section, name, key)
                found = setting(
                    f"{concern.title} {name!r}",
                    ".".join(target),
                    field,
                    target,
                    plugin_flag(name, key, field),
                )
                if concern.bare_aliases:
                    bare = setting("", key, field, (key,), key)
                    found = found._replace(aliases=(bare.key, bare.flag, bare.variable))
                yield found
    for name, table in sorted(host.config_tables.items()):
        for key, field in documented(table.entry).model_fields.items():
            yield Setting(f"{table.title} ([{name}.NAME], file only)", f"{name}.NAME.{key}", "", "", field)


def settings_page(host: PluginHost) -> str:
    """Every setting as a Markdown reference page, one table per group."""
    from trajkit.config.settings import field_type

    lines = [
        "# Settings",
        "",
        "Made by `trajkit settings --markdown` from the settings models of the core and of the plugins",
        "in this repository; a test keeps it current. Every key is a `--config` file key (plugin",
        "sections as `[sandbox_options.NAME]`), every flag works in both spellings and reads the",
        "environment variable beside it when not given (a flag over its variable over the file).",
        "A model client's settings also answer to their bare key, flag and variable (`max_retries`,",
        "`--max_retries`, `TRAJKIT_MAX_RETRIES`: for every client that declares the key), as the",
        "reference runner's did; the client's own spelling wins where both are given in one place.",
    ]
    group = None
    for title, key, flag, env, field, aliases in every_setting(host):
        if title != group:
            group = title
            lines += ["", f"## {title}", "", "| key | flag | variable | type | default | |"]
            lines += ["|---|---|---|---|---|---|"]
        default = "" if field.default_factory is not None else json.dumps(field.default, default=str)
        description = " ".join((field.description or "").split())
        if aliases:
            bare_key, bare_flag, bare_env = aliases
            spelled = [f"`{bare_key}`", *([f"`{bare_flag.split(' / ')[0]}`"] if bare_flag else [])]
            description += f" Also {', '.join([*spelled, *([f'`{bare_env}`'] if bare_env else [])])}."
        cells = [
            f"`{key}`",
            f"`{flag.split(' / ')[0]}`" if flag else "file only",
            f"`{env}`" if env else "",
            field_type(field),
            f"`{default}`" if default else "",
            description,
        ]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines) + "\n"
