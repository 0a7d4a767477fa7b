"""A run's settings: what ``run.json`` keeps of them, what a ``--resume`` continues with, the
changes it may make, and the command that continues a run.

A run directory remembers every setting of the run (:meth:`~trajkit.config.run_config.RunConfig.manifest`,
saved in ``run.json`` by :mod:`trajkit.run.rundir`): a resume takes them from there, and what the
resuming command gives on top overrides them. A setting that shapes the output (every core
setting but :data:`~trajkit.config.run_config.OPERATIONAL`, a plugin setting marked ``affects_output``, any
filter setting) may differ from the run's own only when ``--allow_change KEY`` says so: otherwise
one dataset would mix two configurations without anyone having decided it. Secrets are never
saved, so a resume takes its key from the environment or the flags again; the ephemeral system
prompt and the prefill messages are saved as fingerprints only, so a resume must be given them
again (the command trajkit prints says so).
"""

from __future__ import annotations

import difflib
import logging
import shlex
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, SecretStr, ValidationError

from trajkit.config.resolve import CONCERNS, ConfigurationError, plugin_classes, resolve
from trajkit.config.run_config import FINGERPRINTED, PER_INVOCATION, RunConfig
from trajkit.run.plan import RunError
from trajkit.run.rundir import RunDir

if TYPE_CHECKING:
    from trajkit.manager import PluginHost

log = logging.getLogger("trajkit")

Changes = dict[str, list[Any]]
"""Setting key -> [the run's value, this invocation's value]."""

NEVER_SAVED_FLAGS = {
    "ephemeral_system_prompt": "ephemeral_system_prompt",
    "prefill_messages": "prefill_messages_file",
}
"""The flag that gives again each setting used but never saved (:data:`~trajkit.config.run_config.FINGERPRINTED`)."""
FILTER_SECTION = "filter_options"
"""Every setting of a filter decides what is kept: all of them shape the output."""


def saved_settings(run_dir: RunDir) -> dict[str, Any] | None:
    """The settings the run in ``run_dir`` was made with (run.json's ``config``), or None."""
    manifest = run_dir.run_json("the run's settings must be given again")
    config = manifest.get("config") if manifest is not None else None
    return config if isinstance(config, dict) else None


def settings_for(config: RunConfig, host: PluginHost) -> tuple[RunConfig, Changes]:
    """The configuration this invocation runs with, and the output-shaping settings in which it
    differs from the run's own (each allowed by ``--allow_change``, else a :class:`RunError`).

    Without ``resume`` the configuration is the one given. With it, the run's saved settings
    come first and what was given (the set fields of ``config``) overrides them."""
    if not config.resume:
        return config, {}
    run_dir = RunDir(config.run_dir)
    saved = saved_settings(run_dir)
    if saved is None:
        if run_dir.holds_a_run():
            log.warning("%s: no settings of the run are saved: it continues with those given", run_dir)
        return _complete(config), {}
    merged, places = merged_settings(saved, given_of(config), host, run_dir.manifest_path)
    merged.update(resume=True, output_dir=config.output_dir, run_name=config.run_name)
    try:
        resumed = resolve(host, merged, places)
    except ConfigurationError as exc:
        raise RunError(f"the settings of {run_dir} cannot be used: {exc}") from None
    changes = changed_settings(saved, resumed, host)
    refuse_unallowed(changes, resumed, host)
    return _complete(resumed), changes


def _complete(config: RunConfig) -> RunConfig:
    if config.dataset_file is None:
        raise RunError("--dataset_file is required (on the command line, in --config, or in run.json)")
    return config


def given_of(config: RunConfig) -> dict[str, Any]:
    """The settings a configuration was given, as :func:`~trajkit.config.resolve.resolve` takes them:
    its set fields, the model client's settings at the top level, plugin sections as mappings."""
    given: dict[str, Any] = {}
    for key in config.model_fields_set:
        value = getattr(config, key)
        if key == "model_options":
            for section in value.values():
                if isinstance(section, BaseModel):
                    given.update(section.model_dump(exclude_unset=True))
        elif key.endswith("_options"):
            given[key] = {name: _set_fields(section) for name, section in value.items()}
        else:
            given[key] = value
    return given


def _set_fields(section: Any) -> Any:
    return section.model_dump(exclude_unset=True) if isinstance(section, BaseModel) else section


def merged_settings(
    saved: Mapping[str, Any], given: Mapping[str, Any], host: PluginHost, source: Path
) -> tuple[dict[str, Any], dict[str, str]]:
    """The run's saved settings with ``given`` over them, and where each saved one came from."""
    client_keys = {key for cls in host.model_clients.values() for key in cls.Settings.model_fields}
    # the prefill file is given again with its messages (never saved): not restored alone
    unrestored = PER_INVOCATION | {"output_dir", "run_name", "prefill_messages_file"}
    restorable = (set(RunConfig.model_fields) | client_keys) - unrestored
    merged = {key: value for key, value in saved.items() if key in restorable}
    for concern in CONCERNS:
        section = merged.get(concern.section)
        if isinstance(section, dict):
            merged[concern.section] = _installed(
                section, plugin_classes(host, concern), concern.title, source
            )
    places = {key: f"{source}: {key}" for key in merged}
    for key, value in given.items():
        if key.endswith("_options") and isinstance(merged.get(key), dict):
            section = {name: dict(settings) for name, settings in merged[key].items()}
            for name, settings in value.items():
                section[name] = (
                    {**section.get(name, {}), **settings} if isinstance(settings, dict) else settings
                )
            merged[key] = section
        else:
            merged[key] = value
            places.pop(key, None)
    return merged, places


def _installed(
    section: dict[str, Any], installed: Mapping[str, Any], title: str, source: Path
) -> dict[str, Any]:
    """The saved settings of the plugins installed here; a missing plugin's are left out (the run
    says so when it needs that plugin)."""
    for name in sorted(set(section) - set(installed)):
        log.warning("%s: the settings of the %s %r are not used: it is not installed", source, title, name)
    return {name: settings for name, settings in section.items() if name in installed}


# -- the settings that shape the output ------------------------------------------------------------


def guarded_settings(config: RunConfig, host: PluginHost) -> dict[str, set[str]]:
    """Every setting that shapes the output: its key in run.json's ``config`` (dotted for a
    plugin section) -> the names ``--allow_change`` takes for it (the key and the flag's name)."""
    fingerprints = {key: name for name, key in FINGERPRINTED.items()}
    guarded: dict[str, set[str]] = {}
    for key in config.watched():
        name = fingerprints.get(key, key)
        field = RunConfig.model_fields.get(name)
        extra = (
            field.json_schema_extra if field is not None and isinstance(field.json_schema_extra, dict) else {}
        )
        flag = NEVER_SAVED_FLAGS.get(name) or str(extra.get("flag") or name)
        guarded[key] = {key, name, flag}
    for concern in CONCERNS:
        for name, cls in plugin_classes(host, concern).items():
            for key, field in cls.Settings.model_fields.items():
                if concern.bare_aliases:  # saved at the top level (watched()), named either way
                    if key in guarded:
                        guarded[key].add(f"{name}.{key}")
                    continue
                if concern.section == FILTER_SECTION or _marked(field):
                    dotted = f"{concern.section}.{name}.{key}"
                    guarded[dotted] = {dotted, f"{name}.{key}"}
    return guarded


def _marked(field: Any) -> bool:
    extra = field.json_schema_extra
    return isinstance(extra, dict) and bool(extra.get("affects_output"))


def changed_settings(saved: Mapping[str, Any], config: RunConfig, host: PluginHost) -> Changes:
    """The output-shaping settings whose value in ``config`` differs from the run's saved one.
    A core setting the saved settings do not have (one newer than the run) is not compared; a
    plugin setting they do not have is the plugin's default."""
    now = config.manifest()
    changes: Changes = {}
    for key in guarded_settings(config, host):
        old, new = _values(key, saved, now, host)
        if old is not _ABSENT and old != new:
            changes[key] = [old, new]
    return changes


_ABSENT = object()


def _values(key: str, saved: Mapping[str, Any], now: Mapping[str, Any], host: PluginHost) -> tuple[Any, Any]:
    section, _, rest = key.partition(".")
    if not rest:
        return saved.get(key, _ABSENT), now.get(key)
    name, _, setting = rest.partition(".")
    cls = next((plugin_classes(host, c).get(name) for c in CONCERNS if c.section == section), None)
    return _effective(cls, saved, section, name, setting), _effective(cls, now, section, name, setting)


def _effective(cls: Any, config: Mapping[str, Any], section: str, name: str, setting: str) -> Any:
    """A plugin's setting as the configuration has it: given, or the plugin's default."""
    given = (config.get(section) or {}).get(name)
    if isinstance(given, dict) and setting in given:
        return given[setting]
    try:
        return cls.Settings.model_validate({}).model_dump(mode="json").get(setting)
    except (AttributeError, ValidationError):
        return None


def refuse_unallowed(changes: Changes, config: RunConfig, host: PluginHost) -> None:
    """A :class:`RunError` naming every change ``--allow_change`` does not allow."""
    guarded = guarded_settings(config, host)
    names = {name: key for key, spellings in guarded.items() for name in spellings}
    allowed = set()
    for given in config.allow_change:
        name = given.strip().removeprefix("--").replace("-", "_")
        if name in names:
            allowed.add(names[name])
        elif name in RunConfig.model_fields:
            log.warning("--allow_change %s: it may change on any resume, no --allow_change needed", name)
        else:
            close = difflib.get_close_matches(name, list(names), n=1)
            raise RunError(
                f"--allow_change {given}: no setting of that name shapes the output"
                + (f" (did you mean {close[0]}?)" if close else "")
            )
    refused = {key: values for key, values in changes.items() if key not in allowed}
    if not refused:
        for key, (old, new) in changes.items():
            log.warning(
                "resuming with %s changed from %r to %r (--allow_change): the dataset mixes both",
                key,
                old,
                new,
            )
        return
    problems = "; ".join(_describe(key, old, new) for key, (old, new) in refused.items())
    keys = " ".join(f"--allow_change {_allow_name(key)}" for key in refused)
    raise RunError(
        f"{config.run_dir} was made with other settings: {problems}. A resume continues with the "
        f"run's own settings (run.json): leave these out, or pass {keys} to change them "
        "(the dataset then mixes both; run.json records the change)"
    )


def _describe(key: str, old: Any, new: Any) -> str:
    for name, fingerprint in FINGERPRINTED.items():
        if key == fingerprint:
            if new is None:
                flag = NEVER_SAVED_FLAGS[name]
                return f"{name} was used and is not given now (it is never saved: give --{flag} again)"
            return f"{name} differs from the one the run used" if old else f"{name} was not used by the run"
    return f"{key} was {old!r}, now {new!r}"


def _allow_name(key: str) -> str:
    return next((name for name, fingerprint in FINGERPRINTED.items() if key == fingerprint), key)


# -- the command that continues a run --------------------------------------------------------------


def resume_command(config: RunConfig, *extra: str) -> str:
    """``trajkit run --resume RUN_DIR``, with what run.json cannot hold (the ephemeral system
    prompt, the prefill messages' file) and ``extra``: complete, and runnable as printed."""
    parts = ["trajkit", "run", "--resume", str(config.run_dir)]
    if config.ephemeral_system_prompt is not None:
        parts += ["--ephemeral_system_prompt", config.ephemeral_system_prompt]
    if config.prefill_messages and config.prefill_messages_file is not None:
        parts += ["--prefill_messages_file", str(config.prefill_messages_file)]
    return shlex.join([*parts, *extra])


def unsaved_secrets(config: RunConfig) -> list[str]:
    """Secret settings given to this invocation that a resume cannot find again by itself (not
    read from a file the run remembers): the printed command cannot hold them."""
    return sorted(key for key, value in _given_secrets(config) if not _from_file(config, key))


def _given_secrets(config: RunConfig) -> Iterator[tuple[str, SecretStr]]:
    for key, value in given_of(config).items():
        if isinstance(value, SecretStr):
            yield key, value


def _from_file(config: RunConfig, key: str) -> bool:
    return any(
        isinstance(section, BaseModel) and getattr(section, f"{key}_file", None) is not None
        for section in config.model_options.values()
    )
