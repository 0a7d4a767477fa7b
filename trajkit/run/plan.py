"""Planning a run: the configuration's plugins, the dataset's rows, each row's backend, the work.

Nothing here starts a session or writes the run directory: the plan is what the runner hands to
the executor (:mod:`trajkit.run.executor`) and to the merge (:mod:`trajkit.run.finalize`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

from trajkit.config.run_config import RunConfig
from trajkit.manager import PluginError, PluginHost
from trajkit.record.filters import TrajectoryFilter
from trajkit.record.scorers import row_problems
from trajkit.record.writers import OutputWriter
from trajkit.run.dataset import (
    RowError,
    WorkItem,
    check_dataset_file,
    display_path,
    hub_dataset,
    read_dataset,
    with_samples,
)
from trajkit.run.executor import WorkOrder
from trajkit.run.ledger import LedgerIndex, Location, assign
from trajkit.tools.distributions import Distribution
from trajkit.tools.offer import Offer, OfferError
from trajkit.tools.offer import resolve as resolve_offer

log = logging.getLogger("trajkit")


class RunError(RuntimeError):
    """The run cannot start as configured; the message says what to change."""


# -- the configuration's plugins ---------------------------------------------------------------------


def offer(config: RunConfig, host: PluginHost) -> Offer:
    """What the run offers its prompts (a distribution over the toolsets it can offer, or a fixed
    set); says once which toolsets of its distribution it leaves out and why."""
    try:
        found = resolve_offer(config, host)
    except OfferError as exc:
        raise RunError(str(exc)) from None
    notice = found.notice()
    if notice:
        log.warning("%s", notice)
    return found


def run_tools(chosen: Distribution, host: PluginHost) -> list[str]:
    """Every tool the distribution may offer, sorted: the columns of the records' tool statistics."""
    return sorted(t.name for ts in chosen.drawn() for t in host.toolsets[ts].tools)


def filters(config: RunConfig, host: PluginHost) -> list[TrajectoryFilter]:
    registered = host.filters
    named = set(config.filters + config.disabled_filters) | set(config.filter_options)
    unknown = sorted(named - set(registered))
    if unknown:
        raise RunError(f"unknown filter(s) {unknown}; available: {', '.join(sorted(registered))}")
    return [
        cls(config.filter_options.get(name))
        for name, cls in sorted(registered.items())
        if (cls.enabled_by_default or name in config.filters) and name not in config.disabled_filters
    ]


def writers(config: RunConfig, host: PluginHost) -> list[OutputWriter]:
    registered = host.writers
    names = config.writers or sorted(name for name, cls in registered.items() if cls.default)
    unknown = sorted(set(names) - set(registered))
    if unknown or not names:
        raise RunError(f"unknown writer(s) {unknown}; available: {', '.join(sorted(registered))}")
    return [registered[name](config.writer_options.get(name)) for name in dict.fromkeys(names)]


# -- the dataset and its routes ----------------------------------------------------------------------


@dataclass
class Work:
    """The valid rows of the dataset, the backend each runs on, and the rows that cannot run."""

    items: list[WorkItem]
    """A work item per sample of each valid row (``--samples_per_prompt``), a row's together."""
    routes: dict[int, str]
    """Row index -> backend name."""
    row_errors: list[RowError]

    def pending(self, index: LedgerIndex) -> tuple[list[tuple[WorkItem, Location | None]], list[WorkOrder]]:
        """Each row with its record in the ledger (or None), and a work order per row without one."""
        paired = assign(self.items, index)
        return paired, [WorkOrder(item, self.routes[item.index]) for item, found in paired if found is None]


def read_work(config: RunConfig, host: PluginHost, *, quiet: bool = False) -> Work:
    """The dataset's rows (up to ``--max_samples``) routed to backends, each row's samples; invalid
    rows (and rows whose check a scorer cannot use) logged unless ``quiet``."""
    path = check_dataset_file(config.dataset_file)
    if config.max_samples == 0:
        raise RunError("--max_samples 0 selects no rows")
    items, row_errors = read_dataset(path, config.prompt_field)
    items = items[: config.max_samples]
    routes, route_errors = route(items, config, host)
    row_errors += route_errors
    row_errors += check_errors(items, path, host)
    items, file_errors = with_check_files(items, path)
    row_errors += file_errors
    bad = {error.line for error in row_errors}
    items = with_samples(
        [item for item in items if item.index in routes and item.line not in bad], config.samples_per_prompt
    )
    for error in row_errors if not quiet else ():
        log.error("%s", error)
    if not items:
        shown = display_path(path)
        raise RunError(f"no valid rows in {shown}" if row_errors else f"{shown} holds only blank lines")
    return Work(items, routes, row_errors)


def check_errors(items: list[WorkItem], path: Path, host: PluginHost) -> list[RowError]:
    """Rows whose check (``check``, ``answer``...) a scorer that applies to them cannot use."""
    scorers = [cls() for _, cls in sorted(host.scorers.items())]
    errors = []
    for item in items:
        fields = {"prompt": item.row.prompt, **(item.row.extra or {})}
        problems = row_problems(scorers, fields) if item.row.extra else []
        if problems:
            errors.append(RowError(path, item.line, "; ".join(problems)))
    return errors


def with_check_files(items: list[WorkItem], path: Path) -> tuple[list[WorkItem], list[RowError]]:
    """The items with their rows' ``check_files`` resolved (relative to the dataset's directory),
    and the rows whose check files cannot be used (see :mod:`trajkit.sandbox.check_files`)."""
    from trajkit.sandbox.check_files import FIELD, CheckFile, resolve

    base = None if hub_dataset(path) else path.absolute().parent
    resolved: dict[str, tuple[CheckFile, ...] | str] = {}
    kept, errors = [], []
    for item in items:
        value = (item.row.extra or {}).get(FIELD)
        if value is None:
            kept.append(item)
            continue
        key = repr(value)
        if key not in resolved:
            try:
                resolved[key] = resolve(value, base)
            except ValueError as exc:
                resolved[key] = str(exc)
        found = resolved[key]
        if isinstance(found, str):
            errors.append(RowError(path, item.line, found))
            continue
        kept.append(replace(item, row=replace(item.row, check_files=found)))
    return kept, errors


def route(
    items: list[WorkItem], config: RunConfig, host: PluginHost
) -> tuple[dict[int, str], list[RowError]]:
    """Which backend each row runs on; rows naming a backend that cannot be had are errors."""
    routes: dict[int, str] = {}
    errors: list[RowError] = []
    path = config.dataset_file
    assert path is not None
    for item in items:
        try:
            name = item.row.backend or default_backend(item.row.image, config, host)
            backend_class = host.backend(name)
        except PluginError as exc:
            errors.append(RowError(path, item.line, str(exc)))
            continue
        if item.row.image and not backend_class.image_based:
            errors.append(
                RowError(path, item.line, f"backend {name!r} cannot run images ({item.row.image!r})")
            )
            continue
        routes[item.index] = name
    return routes, errors


def default_backend(image: str | None, config: RunConfig, host: PluginHost) -> str:
    for rule in config.routes:
        if rule.matches(image):
            return rule.backend
    if not image:
        return config.sandbox
    for name, backend_class in sorted(host.backends.items()):
        if backend_class.image_based and backend_class.owns_image(image):
            return name
    return config.image_backend or host.image_backend()
