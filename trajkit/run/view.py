"""A run directory read as it stands, for ``trajkit status``, ``stats``, ``report`` and ``export``.

The ledger is the truth. ``statistics.json``, ``trajectories.jsonl`` and ``rejected.jsonl`` are what
the last merge made of it, and a run in its first invocation, one killed before its merge or one
stopped by a full disk has none of them, or stale ones. So a reader takes them only when they were
made from the ledger as it is now (``statistics.json`` notes the ledger's state, and no invocation
holds the run); otherwise it reads the ledger itself: the plan from the run's own settings
(``run.json``) and its dataset, every record through the run's filters, merged into a temporary
directory. Nothing in the run directory is written. A damaged ledger line is counted as such and
its row as pending, never as done.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trajkit.config.resolve import ConfigurationError, resolve
from trajkit.config.run_config import RunConfig
from trajkit.manager import PluginError
from trajkit.model.permanent import describe, failed_for_good, settings_key
from trajkit.record.filters import TrajectoryFilter
from trajkit.record.writers import OutputWriter
from trajkit.run import plan
from trajkit.run.dataset import DatasetError, WorkItem
from trajkit.run.finalize import merge_run
from trajkit.run.ledger import BadLine, LedgerIndex, Location, in_ledger_order, scan
from trajkit.run.lock import Holder
from trajkit.run.rundir import RunDir
from trajkit.run.settings import merged_settings

if TYPE_CHECKING:
    from trajkit.manager import PluginHost

log = logging.getLogger("trajkit")

Paired = list[tuple[WorkItem, Location | None]]


@dataclass
class RunState:
    """What a reader knows of a run directory: its files and, where they can be had, the run's
    settings and dataset."""

    run_dir: RunDir
    manifest: dict[str, Any]
    holder: Holder | None
    index: LedgerIndex
    config: RunConfig | None
    filters: list[TrajectoryFilter]
    run_tools: list[str]
    paired: Paired | None
    """Each work item of the dataset with its record (or None: pending); None when the run's
    settings or its dataset cannot be read (:attr:`problem` says why)."""
    problem: str | None
    settled: dict[str, dict[str, Any]]
    """Rows failed for good (:mod:`trajkit.model.permanent`): neither done nor pending."""
    last_merge: dict[str, Any] | None
    """``statistics.json``, if it was made from the ledger as it is now."""

    @property
    def live(self) -> bool:
        """The figures must come from the ledger: the last merge's files are not of it."""
        return self.last_merge is None


class NotARun(ValueError):
    """The directory holds no run: no ``run.json``, no ledger."""


def read_run(run_dir: RunDir, host: PluginHost) -> RunState:
    """The run directory's state, from its files alone (a run going on included)."""
    if not run_dir.is_a_run():
        raise NotARun(
            f"{run_dir} is not a trajkit run directory (no {run_dir.manifest_path.name}, no ledger)"
        )
    manifest = run_dir.run_json("reading the run without it")
    manifest = manifest or {}
    holder = run_dir.holder()
    index = scan(run_dir)
    if holder is not None:
        index.bad = _without_line_being_written(run_dir, index.bad)
    statistics = run_dir.statistics()
    last_merge = (
        statistics
        if holder is None
        and statistics is not None
        and statistics.get("ledger_state") == run_dir.ledger_state()
        else None
    )
    config, problem = _settings(run_dir, manifest, host)
    key = settings_key(config) if config is not None else None
    settled = failed_for_good(run_dir, index.records, key)
    filters, run_tools, paired = plan.filters(RunConfig(), host), [], None
    if config is not None and last_merge is None:  # a current merge has all the figures
        try:
            filters = plan.filters(config, host)
            run_tools = plan.run_tools(plan.offer(config, host).distribution, host)
            paired = _work(config, host, index)
        except (plan.RunError, DatasetError, PluginError, OSError) as exc:
            problem = f"the run's dataset or plugins cannot be read ({exc})"
    return RunState(
        run_dir, manifest, holder, index, config, filters, run_tools, paired, problem, settled, last_merge
    )


def _settings(
    run_dir: RunDir, manifest: dict[str, Any], host: PluginHost
) -> tuple[RunConfig | None, str | None]:
    saved = manifest.get("config")
    if not isinstance(saved, dict):
        return None, f"{run_dir.manifest_path} holds no settings of the run"
    merged, places = merged_settings(saved, {}, host, run_dir.manifest_path)
    merged.update(output_dir=run_dir.path.parent, run_name=run_dir.name)
    try:
        return resolve(host, merged, places), None
    except (ConfigurationError, ValueError) as exc:
        return None, f"the run's settings cannot be used here ({exc})"


def _work(config: RunConfig, host: PluginHost, index: LedgerIndex) -> Paired:
    if config.dataset_file is None:  # served sessions: every record is its own row
        return in_ledger_order(index)
    return plan.read_work(config, host, quiet=True).pending(index)[0]


def _without_line_being_written(run_dir: RunDir, bad: list[BadLine]) -> list[BadLine]:
    """A run going on may be writing the last line of its last ledger file right now."""
    files = run_dir.batch_files()
    last = files[-1][1] if files else None
    return [
        line for line in bad if not (line.path == last and line.problem.startswith("incomplete last line"))
    ]


def statistics_of(state: RunState) -> dict[str, Any] | None:
    """The run's statistics as the ledger stands, nothing written; None when the run's settings or
    dataset cannot be read and no merge was made from the ledger as it is."""
    if state.last_merge is not None:
        return state.last_merge
    if state.paired is None:
        return None
    return merge_run(
        state.run_dir,
        state.paired,
        state.index,
        state.filters,
        [],
        state.run_tools,
        state.manifest,
        settled=state.settled,
    )


@contextlib.contextmanager
def current_outputs(state: RunState, host: PluginHost) -> Iterator[tuple[RunDir, dict[str, Any] | None]]:
    """A directory holding ``trajectories.jsonl``, ``rejected.jsonl`` and ``statistics.json`` made
    from the ledger as it is now, and those statistics: the run directory itself when its last
    merge is current, else a temporary directory merged from the ledger (removed afterwards).
    Where the ledger cannot be merged (the run's settings or dataset cannot be read), the last
    merge's files, with a warning; their statistics are None if there are none."""
    if state.last_merge is not None:
        yield state.run_dir, state.last_merge
        return
    writer = _kept_writer(state, host)
    if state.paired is None or writer is None:
        if not state.run_dir.holds_a_run():  # the outputs of a run, copied without their ledger
            yield state.run_dir, state.run_dir.statistics()
            return
        log.warning(
            "%s: the figures are those of the run's last merge, not of its ledger now: %s",
            state.run_dir,
            state.problem or f"no installed writer makes {state.run_dir.kept_path.name}",
        )
        yield state.run_dir, state.run_dir.statistics()
        return
    with tempfile.TemporaryDirectory(prefix="trajkit-view-") as directory:
        scratch = RunDir(Path(directory))
        statistics = merge_run(
            state.run_dir,
            state.paired,
            state.index,
            state.filters,
            [writer],
            state.run_tools,
            state.manifest,
            out_dir=scratch,
            settled=state.settled,
        )
        yield scratch, statistics


def _kept_writer(state: RunState, host: PluginHost) -> OutputWriter | None:
    for name, cls in host.writers.items():
        if state.run_dir.output_path(cls.filename) == state.run_dir.kept_path:
            options = state.config.writer_options.get(name) if state.config is not None else None
            writer: OutputWriter = cls(options)
            return writer
    return None


def run_status(run_dir: RunDir, host: PluginHost) -> dict[str, Any]:
    """Where a run stands (for ``trajkit status``), from the ledger as it is now: during a run, after
    any kill and after a disk error alike. Figures that need the run's settings or its dataset are
    None when those cannot be read (``note`` says why)."""
    state = read_run(run_dir, host)
    statistics = statistics_of(state) or {}
    invocations = state.manifest.get("invocations") or []
    failures = statistics.get("failures") or {}
    return {
        "run_dir": str(run_dir),
        "running": str(state.holder) if state.holder else "no",
        "finished_records": len(state.index.records),
        "dataset_rows": statistics.get("dataset_rows"),
        "samples_per_prompt": statistics.get("samples_per_prompt"),
        "work_items": statistics.get("work_items"),
        "done": statistics.get("done"),
        "kept": statistics.get("kept"),
        "rejected": statistics.get("rejected"),
        "pending": statistics.get("pending"),
        "failing": failures.get("failing"),
        "failing_by_class": failures.get("failing_by_class"),
        "failed_for_good": statistics.get("failed_for_good", len(state.settled)),
        "bad_ledger_lines": len(state.index.bad),
        "invocations": len(invocations) if state.manifest else None,
        "spent": run_dir.spent(invocations)["cost"],
        "note": None if statistics else state.problem,
        "problems": [str(bad) for bad in state.index.bad],
        "failed_for_good_rows": describe(state.settled),
    }
