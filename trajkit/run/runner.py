"""Driving a run: plan -> execute -> record -> finalize.

- plan (:mod:`trajkit.run.plan`): the configuration's plugins, the dataset's rows, their backends, the
  work still pending after what the ledger holds;
- execute (an executor plugin, :mod:`trajkit.run.executor`; ``local`` runs the sessions on this
  process's event loop): sessions run somewhere and hand back records or failures;
- record (:mod:`trajkit.run.recording`): the ledger's one writer, here in the driving process, with the
  failure log, ``tools.json``, the counters and ``run.json``;
- finalize (:mod:`trajkit.run.finalize`): the merge, filters, writers and statistics.

A session only produces a record and assumes nothing about the ledger's process or disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from trajkit.compress import step as compress_step
from trajkit.config.run_config import RunConfig
from trajkit.hookspecs import RunInfo
from trajkit.manager import PluginError, PluginHost
from trajkit.model.permanent import failed_for_good, settings_key
from trajkit.record.secrets import Scrubber, environment_secrets
from trajkit.run import plan
from trajkit.run.attempt import SessionFailure
from trajkit.run.dataset import RowError, WorkItem
from trajkit.run.executor import Executor, SessionPlan, WorkOrder
from trajkit.run.finalize import merge_run
from trajkit.run.heap import settle_for_sessions, unsettle
from trajkit.run.invocation import Invocation
from trajkit.run.ledger import LedgerIndex, Location, scan
from trajkit.run.lock import RunLocked
from trajkit.run.plan import RunError, Work
from trajkit.run.progress import Reporter
from trajkit.run.recording import (
    HELD_RECORDS_WAIT,
    DriverView,
    Earlier,
    RunRecorder,
    end_invocation,
    invocation_entry,
)
from trajkit.run.rundir import Manifest, RunDir
from trajkit.run.settings import resume_command, settings_for

__all__ = [
    "EXIT_INCOMPLETE",
    "EXIT_INTERRUPTED",
    "EXIT_IO",
    "EXIT_LOCKED",
    "EXIT_OK",
    "EXIT_USAGE",
    "HELD_RECORDS_WAIT",
    "RunError",
    "RunOutcome",
    "Runner",
    "SessionFailure",
]

log = logging.getLogger("trajkit")

EXIT_OK, EXIT_INCOMPLETE, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_IO, EXIT_LOCKED = 74, 75
"""sysexits' EX_IOERR (a file of the run could not be written or read) and EX_TEMPFAIL (another
invocation holds the run directory: try again once it has finished)."""


def check_backend_names(config: RunConfig, host: PluginHost) -> None:
    """The backends of ``--sandbox`` and ``--image_backend`` exist (a route's backend is checked
    with the rows it takes: a row it routes to no backend is a row error)."""
    for setting, name in (("--sandbox", config.sandbox), ("--image_backend", config.image_backend)):
        if name is None:
            continue
        try:
            host.backend(name)
        except PluginError as exc:
            raise RunError(f"{setting} {name}: {exc}") from None


@dataclass
class RunOutcome:
    exit_code: int
    statistics: dict[str, Any]
    row_errors: list[RowError]


class Runner:
    """One invocation of ``trajkit run``: everything is resolved (and checked) when it is made.

    With ``resume`` the run's saved settings come first (:mod:`trajkit.run.settings`); a change
    to one that shapes the output must be allowed (``allow_change``)."""

    def __init__(self, config: RunConfig, host: PluginHost) -> None:
        if config.resume:  # the run's settings are read next: not while another invocation changes them
            self._check_not_held(RunDir(config.run_dir))
        config, self.changes = settings_for(config, host)
        self.offer = plan.offer(config, host)
        if not self.offer.fixed and config.distribution is None:
            # The run remembers the distribution it draws, whatever the default may later be.
            config = config.model_copy(update={"distribution": self.offer.requested.name})
        self.config = config
        self.host = host
        self.run_dir = RunDir(config.run_dir)
        self.info = RunInfo(config.run_name, config.run_dir, config)
        self.distribution = self.offer.distribution
        self.run_tools = plan.run_tools(self.distribution, host)
        self.filters = plan.filters(config, host)
        self.writers = plan.writers(config, host)
        self.client_class = host.model_client(config.model)  # an unknown model: an error before any row
        self.executor_class = host.executor(config.executor)
        check_backend_names(config, host)  # a misspelt --sandbox is one error, not one per row
        self.invocation = Invocation(self.run_dir, config.run_name)
        self.interrupted = False
        self.stopping_sessions = False
        """The sessions in flight are being stopped (Ctrl-C, or ``--max_cost_policy stop``)."""
        self.run_id = f"{config.run_name}-{os.getpid()}-{int(time.time())}"
        self.scrubber = Scrubber([*config.secret_values(), *environment_secrets()])
        self.recorder: RunRecorder | None = None
        self.executor: Executor | None = None
        self.execution: asyncio.Future[None] | None = None
        """The executor's task while it runs the sessions (cancelled by SIGINT/SIGTERM)."""

    @property
    def manifest(self) -> Manifest:
        return self.invocation.manifest

    @property
    def stop_reason(self) -> str | None:
        return self.recorder.stop_reason if self.recorder is not None else None

    def resume_command(self, *extra: str) -> str:
        """The command that continues this run, complete as printed."""
        return resume_command(self.config, *extra)

    async def run(self) -> RunOutcome:
        """Check everything that can be checked without writing (the dataset, the run directory,
        the executor's pre-flight: the endpoint, the backends, the images), then hold the run
        directory, run what is pending and merge. Nothing is written before the checks pass."""
        if self.config.resume and self.config.overwrite:
            raise RunError("--resume continues the run and --overwrite deletes it: pass one of them")
        try:
            compress_step.check(self.config, self.host)
        except compress_step.StepFailed as exc:
            raise RunError(str(exc)) from None
        work = plan.read_work(self.config, self.host)
        self._check_run_dir()
        index = LedgerIndex() if self.config.overwrite else scan(self.run_dir)
        pending = self._pending(work, index)[1]
        self.executor = await self._start_executor(pending) if pending else None
        try:
            self._take_run_dir()
            try:
                return await self._run(work)
            finally:
                self.invocation.release()
        finally:
            await self._close_executor()

    async def _close_executor(self) -> None:
        executor, self.executor = self.executor, None
        if executor is not None:
            await executor.aclose()

    @staticmethod
    def _check_not_held(run_dir: RunDir) -> None:
        holder = run_dir.holder()
        if holder is not None:
            raise RunLocked(run_dir, holder)

    def _check_run_dir(self) -> None:
        """What can be told of the run directory without writing: held by another invocation, or
        holding a run that this invocation would neither continue nor replace."""
        self._check_not_held(self.run_dir)
        if self.run_dir.holds_a_run() and not (self.config.resume or self.config.overwrite):
            raise RunError(
                f"{self.run_dir} already holds a run: continue it with `{self.resume_command()}`, "
                "or pass --overwrite to start over"
            )

    async def _start_executor(self, pending: list[WorkOrder]) -> Executor:
        """The executor, started: the model client's check, the backends, the images. An error here
        stops the run before anything is written."""
        executor = self.executor_class(self.config.executor_options.get(self.config.executor))
        try:
            await executor.start(self.session_plan(pending), self.host)
        except BaseException:
            await executor.aclose()
            raise
        return executor

    def _take_run_dir(self) -> None:
        """Hold the run directory (made now if new) before anything is written in it (or deleted
        by --overwrite); note the run's settings in run.json."""

        def before_reading() -> None:
            self._check_run_dir_held()
            if self.config.overwrite:
                self.run_dir.clear()

        self.invocation.hold(before_reading)
        if self.manifest.data.get("config") is None:  # a new run, or a damaged run.json rebuilt
            self.manifest.data["config"] = self.config.manifest()
            self.manifest.save()

    def _check_run_dir_held(self) -> None:
        """Another invocation may have made the run between the first look and the lock."""
        if self.run_dir.holds_a_run() and not (self.config.resume or self.config.overwrite):
            raise RunError(f"{self.run_dir} already holds a run: continue it with `{self.resume_command()}`")

    def _pending(
        self, work: Work, index: LedgerIndex
    ) -> tuple[list[tuple[WorkItem, Location | None]], list[WorkOrder], dict[str, dict[str, Any]]]:
        """Each row with its record or None, the work to run, and the rows failed for good with
        these settings (:mod:`trajkit.model.permanent`: neither done nor run again)."""
        paired, pending = work.pending(index)
        settled = failed_for_good(self.run_dir, index.records, settings_key(self.config))
        return paired, [order for order in pending if order.work_id not in settled], settled

    async def _run(self, work: Work) -> RunOutcome:
        index = scan(self.run_dir)
        paired, pending, settled = self._pending(work, index)
        if settled:
            log.info(
                "not run again: %d rows that failed for good with these settings (%s)",
                len(settled),
                ", ".join(sorted({str(e.get("error_class")) for e in settled.values()})),
            )
        executor = self.executor
        if pending and executor is not None:
            entry = {"pending_at_start": len(pending), "run_id": self.run_id}
            entry = invocation_entry(self.manifest, entry, self.changes, self.offer.record())
            recorder = await self._execute(executor, pending, index, entry)
            client_statistics = executor.statistics()
            await self._close_executor()
            await end_invocation(self.invocation, recorder, client_statistics)
            if recorder.io_error is not None:
                raise recorder.io_error  # no merge on a disk that refuses writes: the resume merges
            index = scan(self.run_dir, index)  # add what this invocation wrote, then plan the merge
            paired, _, settled = self._pending(work, index)
        else:
            log.info("nothing to do: all %d rows of the dataset are done or failed for good", len(paired))
        statistics = merge_run(
            self.run_dir,
            paired,
            index,
            self.filters,
            self.writers,
            self.run_tools,
            self.manifest.data,
            settled=settled,
        )
        compressed = self.interrupted or await self._compress()
        self.host.run_end(self.info, statistics)
        code = self._exit_code(statistics, work.row_errors)
        return RunOutcome(code if compressed else max(code, EXIT_INCOMPLETE), statistics, work.row_errors)

    async def _compress(self) -> bool:
        """The compression step after the merge, when configured; False if it could not finish
        (the run's own outputs are complete, and a --resume runs the step again)."""
        try:
            await compress_step.compress_run(self.config, self.host)
        except compress_step.StepFailed as exc:
            log.error("%s; trajectories.jsonl is complete, --resume runs the step again", exc)
            return False
        return True

    def _exit_code(self, statistics: dict[str, Any], row_errors: list[RowError]) -> int:
        if self.interrupted:
            return EXIT_INTERRUPTED
        if statistics["pending"] or statistics["failed_for_good"] or row_errors or self.stop_reason:
            return EXIT_INCOMPLETE
        return EXIT_OK

    def session_plan(self, pending: list[WorkOrder]) -> SessionPlan:
        return SessionPlan(
            config=self.config,
            run_id=self.run_id,
            distribution=self.distribution,
            run_tools=tuple(self.run_tools),
            backends=tuple(sorted({order.backend for order in pending})),
            images=tuple(sorted({(o.backend, o.item.row.image) for o in pending if o.item.row.image})),
            key_variables=self.host.model_client(self.config.model).key_variables,
        )

    async def _execute(
        self, executor: Executor, pending: list[WorkOrder], index: LedgerIndex, entry: dict[str, Any]
    ) -> RunRecorder:
        """Start the invocation's entry in run.json (``entry``), hand the pending work to the
        started executor and record what it hands back."""
        earlier = Earlier(
            self.run_dir.spent(self.manifest.invocations),
            len(index.records) + sum(1 for _ in self.run_dir.failures()),
        )
        recorder = RunRecorder(
            self.config, self.host, self.filters, self.scrubber, executor, self.run_id, earlier
        )
        recorder.stop_sessions = self._stop_sessions
        self.recorder = recorder

        def progress() -> dict[str, Any]:
            return recorder.progress(executor.statistics())

        with self._signals(asyncio.get_running_loop(), recorder):
            try:
                self.invocation.begin(self.config, self.host, entry, self.changes, progress)
                recorder.open(pending, self.invocation)
                self.host.run_start(self.info, len(pending))
                await self._run_sessions(executor, pending, recorder)
            finally:
                await self.invocation.stop_keeping()
        return recorder

    async def _run_sessions(
        self, executor: Executor, pending: list[WorkOrder], recorder: RunRecorder
    ) -> None:
        # Everything made so far (modules, plugins, the plan with an object per dataset row) lives
        # through the sessions; frozen, full collections stop re-scanning it while sessions allocate.
        collector = settle_for_sessions()
        try:
            with Reporter(recorder.counters, quiet=self.config.quiet) as reporter:
                recorder.reporter = reporter
                self.execution = asyncio.ensure_future(executor.execute(pending, DriverView(recorder)))
                if self.stopping_sessions:
                    self.execution.cancel()
                try:
                    await self.execution
                except asyncio.CancelledError:
                    current = asyncio.current_task()
                    if not self.stopping_sessions or (current is not None and current.cancelling()):
                        raise
        finally:
            unsettle(collector)
            await self.invocation.stop_keeping()
            await recorder.close()

    def _stop_sessions(self) -> None:
        """Stop the sessions in flight (the executor's task is cancelled, their sandboxes closed)."""
        self.stopping_sessions = True
        if self.execution is not None:
            self.execution.cancel()

    @contextlib.contextmanager
    def _signals(self, loop: asyncio.AbstractEventLoop, recorder: RunRecorder) -> Iterator[None]:
        """SIGINT/SIGTERM: no new session, those in flight stopped (the executor's task is cancelled),
        the run directory written; a second signal exits at once."""

        def stop(signame: str) -> None:
            if self.interrupted:
                log.error("second %s: stopping at once", signame)
                os._exit(EXIT_INTERRUPTED)
            self.interrupted = True
            recorder.stop_reason = f"interrupted by {signame}"
            recorder.changed.set()
            log.warning("%s: closing sandboxes and writing the run directory (again to force)", signame)
            self._stop_sessions()

        installed = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop, sig.name)
                installed.append(sig)
        try:
            yield
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
