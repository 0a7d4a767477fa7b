"""Recording what the sessions produce: the ledger's one writer, the failure log, the counters.

:class:`RunRecorder` is the :class:`~trajkit.executor.Driver` an executor reports to. It runs on
the runner's event loop, in the process that holds the run directory: it scrubs secrets, appends
records to the ledger and failed attempts to ``failures.jsonl``, adds new tool schema sets to
``tools.json``, keeps the progress counters and decides when no new session may start.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trajkit.config import RunConfig
from trajkit.dataset import WorkItem
from trajkit.executor import Failed, Finished, Outcome, WorkOrder
from trajkit.filters import TrajectoryFilter
from trajkit.finalize import rejection
from trajkit.hookspecs import RunInfo
from trajkit.ledger import AppendLog, LedgerWriter, write_held
from trajkit.manager import PluginHost
from trajkit.permanent import settings_key
from trajkit.progress import Counters, Reporter
from trajkit.rundir import FAILURES_FILE, TOOLS_FILE, Manifest, RunIOError, ToolCatalog
from trajkit.secrets import Scrubber

log = logging.getLogger("trajkit")

HELD_RECORDS_WAIT = 120.0
"""Seconds a run that hit a disk error keeps retrying to write the finished records it holds."""


class DriverView:
    """What an executor is handed (:class:`~trajkit.executor.Driver`): the three calls, and
    nothing of the run directory."""

    __slots__ = ("may_start", "report", "started")

    def __init__(self, recorder: RunRecorder) -> None:
        self.may_start = recorder.may_start
        self.started = recorder.started
        self.report = recorder.report


class RunRecorder:
    """The run directory's side of one invocation's sessions."""

    def __init__(
        self,
        config: RunConfig,
        host: PluginHost,
        filters: list[TrajectoryFilter],
        scrubber: Scrubber,
        spent: Callable[[], float],
        prior_spent: float = 0.0,
    ) -> None:
        self.config = config
        self.host = host
        self.info = RunInfo(config.run_name, config.run_dir, config)
        self.filters = filters
        self.scrubber = scrubber
        self.spent = spent
        """What this invocation's model answers have cost so far (the executor's count)."""
        self.prior_spent = prior_spent
        self.counters = Counters()
        self.reporter: Reporter | None = None
        self.stop_reason: str | None = None
        self.io_error: RunIOError | None = None
        self.settings_key = settings_key(config)
        """Written with a permanent failure: the row runs again only under other settings."""
        self.items: dict[str, WorkItem] = {}
        """This invocation's pending work, by work id."""
        self.done: set[str] = set()
        """Work ids whose record this invocation has appended."""
        self.ledger: LedgerWriter
        self.failures: AppendLog
        self.tools: ToolCatalog

    def open(self, work: list[WorkOrder]) -> None:
        run_dir = self.config.run_dir
        self.items = {order.work_id: order.item for order in work}
        self.counters.total = len(work)
        self.tools = ToolCatalog(run_dir)
        self.ledger = LedgerWriter(run_dir, self.config.batch_size)
        self.failures = AppendLog(run_dir / FAILURES_FILE)

    # -- the driver --------------------------------------------------------------------------------

    def may_start(self) -> bool:
        if self.stop_reason is not None:
            return False
        self.counters.cost = self.spent()
        max_cost = self.config.max_cost
        if max_cost is not None and self.prior_spent + self.counters.cost >= max_cost:
            self.stop_reason = f"--max_cost {max_cost:g} reached"
            log.warning("%s: no new sessions are started", self.stop_reason)
            return False
        return True

    def started(self, work_id: str, attempt: int) -> None:
        self.counters.in_flight += 1

    def report(self, outcome: Outcome) -> None:
        self.counters.in_flight -= 1
        if isinstance(outcome, Finished) and outcome.tool_schemas:
            self._keep_tool_schemas(outcome)  # even from an outcome ignored below: later ones may need them
        if outcome.work_id not in self.items or outcome.work_id in self.done:
            # an executor that ran a work item twice (resubmitted after a node was lost, say):
            # the first record stands, so no work id is ever in the ledger twice
            log.warning("%s: an outcome for work that is not pending, ignored", outcome.work_id)
            return
        if isinstance(outcome, Finished):
            self.done.add(outcome.work_id)
            self._record(outcome)
        else:
            self._record_failure(outcome)
            if outcome.stops_run and self.stop_reason is None:
                self.stop_reason = outcome.message
                log.error("stopping the run (%s): %s", outcome.error_class, outcome.message)
            if not outcome.final:
                return
            self.counters.failed += not outcome.stops_run
        if self.reporter is not None:
            self.reporter.tick()

    # -- records and failures ----------------------------------------------------------------------

    def _keep_tool_schemas(self, finished: Finished) -> None:
        try:
            self.tools.add(finished.tool_schemas)
        except RunIOError as exc:
            self.disk_error(exc.path, exc.cause if isinstance(exc.cause, OSError) else None)

    def _record(self, finished: Finished) -> None:
        record = self.scrubber.scrub(finished.record)
        record["metadata"]["batch_num"] = self.ledger.next_batch_num()
        if not self.ledger.append(record):  # kept in memory, written again: see write_held
            self.disk_error(self.ledger.path, self.ledger.error)
        reason = rejection(record, self.filters)
        self.counters.succeeded += 1
        self.counters.rejected += reason is not None
        self.counters.tokens += record["usage"]["total_tokens"]
        if self.config.verbose:
            log.info(
                "finished %s (prompt %d)%s",
                record["work_id"],
                record["prompt_index"],
                f": {reason}" if reason else "",
            )
        self.host.trajectory_finished(self.info, record, reason)

    def _record_failure(self, failure: Failed) -> None:
        item = self.items[failure.work_id]
        entry = {
            "work_id": item.work_id,
            "prompt_id": item.prompt_id,
            "prompt_index": item.index,
            "attempt": failure.attempt,
            "error_class": failure.error_class,
            "message": self.scrubber.text(failure.message[:2000]),
            "time": datetime.now(UTC).isoformat(),
        }
        if failure.permanent:
            entry |= {"permanent": True, "settings_key": self.settings_key}
        if not self.failures.append(entry):
            self.disk_error(self.failures.path, self.failures.error)
        self.counters.errors.append(f"prompt {item.index}: {failure.error_class}: {failure.message[:160]}")
        if failure.stops_run:
            return  # said once, by the stop itself
        log.warning(
            "prompt %d attempt %d failed%s (%s): %s | %r",
            item.index,
            failure.attempt,
            " for good" if failure.permanent else "",
            failure.error_class,
            failure.message,
            item.row.prompt[: self.config.log_prefix_chars],
        )

    # -- the disk ----------------------------------------------------------------------------------

    def disk_error(self, path: Path, error: OSError | None) -> None:
        """A write the disk refused: no new session starts; finished records stay in memory."""
        if self.io_error is None:
            self.io_error = RunIOError(path, error or "write failed")
            self.stop_reason = f"cannot write {self.io_error}"
            log.error("cannot write %s: no new sessions are started", self.io_error)

    async def close(self) -> None:
        """Write what the disk refused so far (for a while), then close the ledger and the log."""
        if self.io_error is not None:
            await write_held([self.ledger, self.failures], self.io_error, HELD_RECORDS_WAIT)
            try:
                self.tools.flush()
            except RunIOError as exc:
                log.error("%s: the tool schemas of some records are not saved (%s)", TOOLS_FILE, exc)
        for log_ in (self.ledger, self.failures):
            try:
                log_.close()
            except OSError as exc:
                self.disk_error(log_.path, exc)

    # -- run.json ----------------------------------------------------------------------------------

    def progress(self, client_statistics: dict[str, Any]) -> dict[str, Any]:
        """The running invocation's entry in ``run.json``: progress and what it has spent."""
        return {
            "succeeded": self.counters.succeeded,
            "failed": self.counters.failed,
            "secrets_scrubbed": self.scrubber.scrubbed,
            "model_client": client_statistics,
        }


def record_invocation_start(
    manifest: Manifest,
    config: RunConfig,
    host: PluginHost,
    started: datetime,
    pending: int,
    run_id: str,
    offer: dict[str, Any] | None = None,
) -> None:
    """Record the invocation in ``run.json``; warn about each output-affecting change since the
    last, the toolsets the run can offer included (``offer``: what :meth:`~trajkit.offer.Offer.record`
    gives)."""
    entry: dict[str, Any] = {"started": started.isoformat(), "pending_at_start": pending, "run_id": run_id}
    if offer is not None:
        entry["offer"] = offer
        before = next((i["offer"] for i in reversed(manifest.invocations) if "offer" in i), None)
        if before is not None and before["probabilities"] != offer["probabilities"]:
            log.warning(
                "resuming with the toolsets drawn changed from %s to %s: the dataset will mix both",
                before["probabilities"], offer["probabilities"],
            )  # fmt: skip
    plugins = dict(sorted(host.sources.items()))
    changes = manifest.start(config.manifest(), plugins, entry, config.watched())
    for key, (old, new) in changes.items():
        log.warning("resuming with %s changed from %r to %r: the dataset will mix both", key, old, new)


def record_invocation_end(
    manifest: Manifest, recorder: RunRecorder, started: datetime, client_statistics: dict[str, Any]
) -> None:
    ended = datetime.now(UTC)
    try:
        manifest.update(
            ended=ended.isoformat(),
            wall_seconds=round((ended - started).total_seconds(), 3),
            stop_reason=recorder.stop_reason,
            **recorder.progress(client_statistics),
        )
    except RunIOError as exc:
        if recorder.io_error is None:
            raise
        log.error("%s (run.json not updated)", exc)  # the disk error is said once, below
