"""Recording what the sessions produce: the ledger's one writer, the failure log, the spend, the
counters, the budget.

:class:`RunRecorder` is the :class:`~trajkit.run.executor.Driver` an executor reports to. It runs on
the runner's event loop, in the process that holds the run directory: it scrubs secrets, appends
records to the ledger and failed attempts to ``failures.jsonl``, adds new tool schema sets to
``tools.json``, writes the invocation's spend file as each model answer arrives, keeps the
progress counters and decides when a new session may start (``--max_cost``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trajkit.config.run_config import RunConfig
from trajkit.hookspecs import RunInfo
from trajkit.manager import PluginHost
from trajkit.model.permanent import settings_key
from trajkit.record.filters import TrajectoryFilter
from trajkit.record.secrets import Scrubber
from trajkit.run.dataset import WorkItem
from trajkit.run.executor import Executor, Failed, Finished, Outcome, WorkOrder
from trajkit.run.files import RunIOError
from trajkit.run.finalize import rejection
from trajkit.run.invocation import Invocation, SpendFile
from trajkit.run.ledger import AppendLog, LedgerWriter, write_held
from trajkit.run.progress import Counters, Reporter
from trajkit.run.rundir import SPEND_KEYS, Manifest
from trajkit.tools.catalog import ToolCatalog

log = logging.getLogger("trajkit")

HELD_RECORDS_WAIT = 120.0
"""Seconds a run that hit a disk error keeps retrying to write the finished records it holds."""


BUDGET = "budget"
"""The error class of a session stopped at ``--max_cost`` (``--max_cost_policy stop``)."""


@dataclass(frozen=True)
class Earlier:
    """What the run's earlier invocations spent and how many attempts they ended: the budget's
    mean cost per session is the whole run's."""

    spend: Mapping[str, float]
    attempts: int


class DriverView:
    """What an executor is handed (:class:`~trajkit.run.executor.Driver`): those calls, and nothing
    of the run directory."""

    __slots__ = ("admit", "may_start", "paid", "report", "started", "stopped", "withdraw")

    def __init__(self, recorder: RunRecorder) -> None:
        self.may_start = recorder.may_start
        self.admit = recorder.admit
        self.stopped = recorder.stopped
        self.withdraw = recorder.withdraw
        self.started = recorder.started
        self.report = recorder.report
        self.paid = recorder.paid


class RunRecorder:
    """The run directory's side of one invocation's sessions."""

    def __init__(
        self,
        config: RunConfig,
        host: PluginHost,
        filters: list[TrajectoryFilter],
        scrubber: Scrubber,
        executor: Executor,
        run_id: str,
        earlier: Earlier | None = None,
    ) -> None:
        self.config = config
        self.host = host
        self.info = RunInfo(config.run_name, config.run_dir, config)
        self.filters = filters
        self.scrubber = scrubber
        self.executor = executor
        self.run_id = run_id
        self.earlier = earlier or Earlier(dict.fromkeys(SPEND_KEYS, 0), 0)
        self.spend: dict[str, float] = dict.fromkeys(SPEND_KEYS, 0)
        """What this invocation's model answers have cost so far (the executor's count)."""
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
        self.running: dict[str, int] = {}
        """Work id -> the attempt in flight."""
        self.unstarted = 0
        """Work items admitted whose first attempt has not started yet (an executor may admit
        several before its sessions start elsewhere)."""
        self.finished = 0
        self.finished_cost = 0.0
        """Sessions of this invocation that produced a record, and what they cost together."""
        self.changed = asyncio.Event()
        """Set when what admission depends on changes (spend, sessions in flight, a stop)."""
        self.stop_sessions: Callable[[], None] | None = None
        """Ends the sessions in flight (the runner's; ``--max_cost_policy stop``)."""
        self.ledger: LedgerWriter
        self.failures: AppendLog
        self.spend_file: SpendFile | None = None
        self.tools: ToolCatalog

    def open(self, work: list[WorkOrder], invocation: Invocation) -> None:
        """Record ``work`` into the run directory ``invocation`` holds (its ledger, its tools
        catalogue), with the failure log and this invocation's spend file."""
        run_dir = invocation.run_dir
        self.items = {order.work_id: order.item for order in work}
        self.counters.total = len(work)
        self.counters.cost = self.cost()
        self.tools = invocation.catalog
        self.ledger = invocation.ledger
        self.failures = run_dir.failure_log()
        self.spend_file = run_dir.spend_file(self.run_id)

    # -- the driver --------------------------------------------------------------------------------

    def may_start(self) -> bool:
        if self.stop_reason is not None or not self._affordable():
            return False
        self.unstarted += 1
        return True

    async def admit(self) -> bool:
        while not self.may_start():
            if self.stop_reason is not None:
                return False
            self.changed.clear()
            await self.changed.wait()
        return True

    def stopped(self) -> bool:
        return self.stop_reason is not None

    def withdraw(self) -> None:
        self.unstarted = max(0, self.unstarted - 1)
        self.changed.set()

    def started(self, work_id: str, attempt: int) -> None:
        if attempt == 1 and self.unstarted:
            self.unstarted -= 1
        self.running[work_id] = attempt
        self.counters.in_flight = len(self.running)

    def paid(self) -> None:
        """Save what this invocation has spent, if it grew, in its spend file; hold the budget."""
        statistics = self.executor.statistics()  # once per model answer: kept cheap
        spend = {
            "requests": statistics.get("requests") or 0,
            "prompt_tokens": statistics.get("prompt_tokens") or 0,
            "completion_tokens": statistics.get("completion_tokens") or 0,
            "cost": self.executor.spent(),
        }
        if spend == self.spend:
            return
        self.spend = spend
        self.counters.cost = self.cost()
        if self.spend_file is not None and not self.spend_file.write(spend):
            self.disk_error(self.spend_file.path, self.spend_file.log.error)
        self.changed.set()
        cap = self.config.max_cost
        if cap is not None and self.counters.cost >= cap:
            self._stop(f"--max_cost {cap:g} reached")
            if self.config.max_cost_policy == "stop" and self.running and self.stop_sessions is not None:
                self._stop_in_flight(f"--max_cost {cap:g} reached: the session was stopped")

    def report(self, outcome: Outcome) -> None:
        self.running.pop(outcome.work_id, None)
        self.counters.in_flight = len(self.running)
        self.paid()
        self.changed.set()
        if isinstance(outcome, Finished) and outcome.tool_schemas:
            self._keep_tool_schemas(outcome)  # even from an outcome ignored below: later ones may need them
        if outcome.work_id not in self.items or outcome.work_id in self.done:
            # an executor that ran a work item twice (resubmitted after a node was lost, say):
            # the first record stands, so no work id is ever in the ledger twice
            log.warning("%s: an outcome for work that is not pending, ignored", outcome.work_id)
            return
        if isinstance(outcome, Finished):
            self.done.add(outcome.work_id)
            self.finished += 1
            self.finished_cost += outcome.record["usage"].get("cost") or 0.0
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

    # -- the budget --------------------------------------------------------------------------------

    def cost(self) -> float:
        """What the whole run has spent: the earlier invocations and this one."""
        return float(self.earlier.spend.get("cost", 0.0)) + self.spend["cost"]

    def mean_session_cost(self) -> float | None:
        """The run's mean cost per session so far: the earlier invocations' spend per attempt they
        ended, and this one's sessions that produced a record (each record says what it cost);
        before any of those, the mean answer's cost times ``max_turns`` (a session's most); None
        before any answer."""
        sessions = self.earlier.attempts + self.finished
        if sessions:
            return (self.earlier.spend.get("cost", 0.0) + self.finished_cost) / sessions
        answers = self.earlier.spend.get("requests", 0) + self.spend.get("requests", 0)
        return self.cost() / answers * self.config.max_turns if answers else None

    def _affordable(self) -> bool:
        """Whether one more session fits ``--max_cost``: what was spent plus the sessions in flight
        at the mean cost per session stays under it. With none in flight one may start while the
        spend is under the cap (that is how the mean is learnt)."""
        cap = self.config.max_cost
        if cap is None:
            return True
        spent = self.cost()
        if spent >= cap:
            self._stop(f"--max_cost {cap:g} reached")
            return False
        in_flight = len(self.running) + self.unstarted
        if not in_flight:
            return True
        mean = self.mean_session_cost()
        return mean is not None and spent + in_flight * mean < cap

    def _stop(self, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
            log.warning("%s: no new sessions are started", reason)
            self.changed.set()

    def _stop_in_flight(self, message: str) -> None:
        """``--max_cost_policy stop``: each session in flight ends as a ``budget`` failure (a later
        resume runs it again) and the runner stops them."""
        for work_id, attempt in list(self.running.items()):
            if work_id in self.items and work_id not in self.done:
                self._record_failure(Failed(work_id, attempt, BUDGET, message, final=True))
                self.counters.failed += 1
        self.running.clear()
        self.counters.in_flight = 0
        assert self.stop_sessions is not None
        self.stop_sessions()

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
        """Save the spend, write what the disk refused so far (for a while), then close the ledger
        and the logs."""
        self.paid()
        logs: list[LedgerWriter | AppendLog] = [self.ledger, self.failures]
        if self.spend_file is not None:
            logs.append(self.spend_file.log)
        if self.io_error is not None:
            await write_held(logs, self.io_error, HELD_RECORDS_WAIT)
            try:
                self.tools.flush()
            except RunIOError as exc:
                log.error(
                    "%s: the tool schemas of some records are not saved (%s)", self.tools.path.name, exc
                )
        for log_ in logs:
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


def invocation_entry(
    manifest: Manifest,
    entry: dict[str, Any],
    changes: Mapping[str, list[Any]],
    offer: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The run's invocation as ``run.json`` notes it (:meth:`Invocation.begin`): ``entry``, the
    output-shaping settings it changed (``--allow_change``) and the toolsets the run can offer
    (``offer``: what :meth:`~trajkit.tools.offer.Offer.record` gives; a change since the last is said)."""
    if offer is not None:
        entry = {**entry, "offer": offer}
        before = next((i["offer"] for i in reversed(manifest.invocations) if "offer" in i), None)
        if before is not None and before["probabilities"] != offer["probabilities"]:
            log.warning(
                "resuming with the toolsets drawn changed from %s to %s: the dataset will mix both",
                before["probabilities"], offer["probabilities"],
            )  # fmt: skip
    return {**entry, "allowed_changes": sorted(changes)} if changes else entry


async def end_invocation(
    invocation: Invocation, recorder: RunRecorder, client_statistics: dict[str, Any]
) -> None:
    """The invocation's final entry in ``run.json``; after a disk error, not being able to write it
    is said, not raised (the disk error is said once, by the runner)."""
    try:
        await invocation.end(recorder.stop_reason, recorder.progress(client_statistics))
    except RunIOError as exc:
        if recorder.io_error is None:
            raise
        log.error("%s (run.json not updated)", exc)
