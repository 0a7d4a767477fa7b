"""Driving a run: plan the work, hold many sessions in flight on one event loop, keep the ledger.

The ledger has one writer, here in the driving process; a session only produces a record and
assumes nothing about the ledger's process or disk, so sessions can later run elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trajkit import __version__
from trajkit.agent import Session, run_conversation
from trajkit.config import OUTPUT_AFFECTING, RunConfig
from trajkit.dataset import RowError, WorkItem, check_dataset_file, read_dataset
from trajkit.distributions import Distribution, rng_for
from trajkit.filters import TrajectoryFilter
from trajkit.finalize import merge_run, rejection, warn_if_all_rejected
from trajkit.hookspecs import RunInfo
from trajkit.ledger import AppendLog, LedgerWriter, assign, scan, write_held
from trajkit.manager import PluginError, PluginHost
from trajkit.model import ModelClient, ModelError
from trajkit.progress import Counters, Reporter
from trajkit.ratelimit import session_deadline
from trajkit.records import record_json
from trajkit.retry import backoff_delay
from trajkit.rundir import (
    FAILURES_FILE,
    LOCK_FILE,
    Manifest,
    ManifestKeeper,
    RunIOError,
    RunLock,
    holds_a_run,
    spent,
)
from trajkit.sandbox import ImageUnavailable, SandboxBackend, SandboxError, SandboxSpec
from trajkit.secrets import Scrubber, environment_secrets
from trajkit.writers import OutputWriter

log = logging.getLogger("trajkit")

EXIT_OK, EXIT_INCOMPLETE, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_IO, EXIT_LOCKED = 74, 75
"""sysexits' EX_IOERR (a file of the run could not be written or read) and EX_TEMPFAIL (another
invocation holds the run directory: try again once it has finished)."""
ACCOUNTS_INTERVAL = 5.0
"""Seconds between updates of the invocation's entry in run.json (what it has spent so far)."""
HELD_RECORDS_WAIT = 120.0
"""Seconds a run that hit a disk error keeps retrying to write the finished records it holds."""


class RunError(RuntimeError):
    """The run cannot start as configured; the message says what to change."""


class SessionFailure(Exception):
    def __init__(self, error_class: str, message: str, *, retryable: bool = True, stops_run: bool = False):
        super().__init__(message)
        self.error_class = error_class
        self.retryable = retryable
        self.stops_run = stops_run


@dataclass
class RunOutcome:
    exit_code: int
    statistics: dict[str, Any]
    row_errors: list[RowError]


class Runner:
    def __init__(self, config: RunConfig, host: PluginHost) -> None:
        self.config = config
        self.host = host
        self.run_dir = config.run_dir
        self.info = RunInfo(config.run_name, self.run_dir, config)
        self.counters = Counters()
        self.distribution = self._distribution()
        self.run_tools = sorted(
            t.name for ts in self.distribution.probabilities for t in host.toolsets[ts].tools
        )
        self.filters = self._filters()
        self.writers = self._writers()
        self.client_class = host.model_client(config.model)
        self.backends: dict[str, SandboxBackend] = {}
        self.digests: dict[tuple[str, str], str | None] = {}
        self.image_failures: dict[tuple[str, str], str] = {}
        self.stop_reason: str | None = None
        self.io_error: RunIOError | None = None
        self.lock = RunLock(self.run_dir)
        self.manifest: Manifest
        self.prior_spent = 0.0
        self.client_statistics: dict[str, Any] = {}
        self.interrupted = False
        self.run_id = f"{config.run_name}-{os.getpid()}-{int(time.time())}"
        self.scrubber = Scrubber([*config.secret_values(), *environment_secrets()])

    # -- configuration -----------------------------------------------------------------------------

    def _distribution(self) -> Distribution:
        distributions = dict(self.host.distributions)
        for name, probabilities in self.config.distributions.items():
            if name in distributions:
                raise RunError(
                    f"distribution {name!r} of the configuration file is also registered by a plugin"
                )
            try:
                distributions[name] = Distribution(name, "from the configuration file", probabilities)
            except ValueError as exc:
                raise RunError(str(exc)) from None
        if self.config.distribution not in distributions:
            raise RunError(
                f"unknown distribution {self.config.distribution!r}; available: {', '.join(sorted(distributions))}"
                " (see --list_distributions)"
            )
        distribution = distributions[self.config.distribution]
        missing = sorted(set(distribution.probabilities) - set(self.host.toolsets))
        if missing:
            raise RunError(f"distribution {distribution.name!r} names toolsets no plugin provides: {missing}")
        return distribution

    def _filters(self) -> list[TrajectoryFilter]:
        registered = self.host.filters
        named = set(self.config.filters + self.config.disabled_filters) | set(self.config.filter_options)
        unknown = sorted(named - set(registered))
        if unknown:
            raise RunError(f"unknown filter(s) {unknown}; available: {', '.join(sorted(registered))}")
        chosen = [
            cls(**self.config.filter_options.get(name, {}))
            for name, cls in sorted(registered.items())
            if (cls.enabled_by_default or name in self.config.filters)
            and name not in self.config.disabled_filters
        ]
        return chosen

    def _writers(self) -> list[OutputWriter]:
        registered = self.host.writers
        names = self.config.writers or sorted(name for name, cls in registered.items() if cls.default)
        unknown = sorted(set(names) - set(registered))
        if unknown or not names:
            raise RunError(f"unknown writer(s) {unknown}; available: {', '.join(sorted(registered))}")
        return [registered[name]() for name in dict.fromkeys(names)]

    # -- the run -----------------------------------------------------------------------------------

    async def run(self) -> RunOutcome:
        """Check the dataset, hold the run directory, run what is pending, merge."""
        if self.config.resume and self.config.overwrite:
            raise RunError("--resume continues the run and --overwrite deletes it: pass one of them")
        path = check_dataset_file(self.config.dataset_file)
        if self.config.max_samples == 0:
            raise RunError("--max_samples 0 selects no rows")
        items, row_errors = read_dataset(path)
        items = items[: self.config.max_samples]
        routes, route_errors = self._route(items)
        row_errors += route_errors
        items = [item for item in items if item.index in routes]
        for error in row_errors:
            log.error("%s", error)
        if not items:
            raise RunError(f"no valid rows in {path}" if row_errors else f"{path} holds only blank lines")
        try:
            self._prepare_run_dir()
            return await self._run(items, routes, row_errors)
        finally:
            self.lock.release()

    async def _run(
        self, items: list[WorkItem], routes: dict[int, str], row_errors: list[RowError]
    ) -> RunOutcome:
        index = scan(self.run_dir)
        paired = assign(items, index)
        pending = [item for item, location in paired if location is None]
        self.counters.total = len(pending)
        self.prior_spent = spent(self.manifest.invocations)["cost"]
        if pending:
            started = datetime.now(UTC)
            self._record_invocation_start(started, len(pending))
            await self._execute(pending, routes)
            self._record_invocation_end(started)
            if self.io_error is not None:
                raise self.io_error  # no merge on a disk that refuses writes: the resume merges
            index = scan(self.run_dir, index)  # add what this invocation wrote, then plan the merge
            paired = assign(items, index)
        else:
            log.info("nothing to do: all %d rows of the dataset are done", len(paired))
        statistics = merge_run(
            self.run_dir, paired, index, self.filters, self.writers, self.run_tools, self.manifest.data
        )
        warn_if_all_rejected(statistics, self.config)
        self.host.run_end(self.info, statistics)
        return RunOutcome(self._exit_code(statistics, row_errors), statistics, row_errors)

    def _exit_code(self, statistics: dict[str, Any], row_errors: list[RowError]) -> int:
        if self.interrupted:
            return EXIT_INTERRUPTED
        if statistics["pending"] or row_errors or self.stop_reason:
            return EXIT_INCOMPLETE
        return EXIT_OK

    def _prepare_run_dir(self) -> None:
        """Take the run directory's lock before anything is written (or deleted by --overwrite)."""
        run_dir = self.run_dir
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RunIOError(run_dir, exc) from None
        self.lock.acquire()
        if holds_a_run(run_dir) and not (self.config.resume or self.config.overwrite):
            raise RunError(
                f"{run_dir} already holds a run: pass --resume to continue it, or --overwrite to start over"
            )
        if self.config.overwrite:
            for path in run_dir.iterdir():
                if path.is_file() and path.name != LOCK_FILE:
                    path.unlink()
        self.manifest = Manifest(run_dir, self.config.run_name, __version__)
        if self.manifest.data.get("config") is None:  # a new run, or a damaged run.json rebuilt
            self.manifest.data["config"] = self.config.manifest()
            self.manifest.save()

    def _route(self, items: list[WorkItem]) -> tuple[dict[int, str], list[RowError]]:
        """Which backend each row runs on; rows naming a backend that cannot be had are errors."""
        routes: dict[int, str] = {}
        errors: list[RowError] = []
        path = self.config.dataset_file
        assert path is not None
        for item in items:
            try:
                name = item.row.backend or self._default_backend(item.row.image)
                backend_class = self.host.backend(name)
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

    def _default_backend(self, image: str | None) -> str:
        for route in self.config.routes:
            if route.matches(image):
                return route.backend
        if not image:
            return self.config.sandbox
        for name, backend_class in sorted(self.host.backends.items()):
            if backend_class.image_based and backend_class.owns_image(image):
                return name
        return self.config.image_backend or self.host.image_backend()

    async def _execute(self, pending: list[WorkItem], routes: dict[int, str]) -> None:
        client = self.client_class.from_config(self.config)
        await client.check()  # a wrong URL, key or model stops the run here, before any sandbox starts
        await self._start_backends({routes[item.index] for item in pending})
        await self._verify_images(pending, routes)
        ledger = LedgerWriter(self.run_dir, self.config.batch_size)
        failures = AppendLog(self.run_dir / FAILURES_FILE)
        queue: asyncio.Queue[WorkItem] = asyncio.Queue()
        for item in pending:
            queue.put_nowait(item)
        self.host.run_start(self.info, len(pending))
        accounts = ManifestKeeper(
            self.manifest, lambda: self._progress(client.statistics()), ACCOUNTS_INTERVAL
        )
        workers = [
            asyncio.create_task(self._worker(queue, routes, client, ledger, failures))
            for _ in range(min(self.config.num_workers, len(pending)))
        ]
        loop = asyncio.get_running_loop()
        # Everything made so far (modules, plugins, the plan with an object per dataset row) lives
        # through the sessions; frozen, full collections stop re-scanning it while sessions allocate.
        gc.freeze()
        with Reporter(self.counters, quiet=self.config.quiet) as reporter, self._signals(loop, workers):
            self.reporter = reporter
            try:
                for result in await asyncio.gather(*workers, return_exceptions=True):
                    if isinstance(result, Exception):
                        log.error("a worker stopped: %s: %s", type(result).__name__, result)
            finally:
                gc.unfreeze()
                for worker in workers:
                    worker.cancel()
                await asyncio.gather(*workers, return_exceptions=True)
                await accounts.stop()
                if self.io_error is not None:
                    await write_held([ledger, failures], self.io_error, HELD_RECORDS_WAIT)
                self._close_logs(ledger, failures)
                self.client_statistics = client.statistics()
                await client.aclose()
                await self._close_backends()

    @contextlib.contextmanager
    def _signals(self, loop: asyncio.AbstractEventLoop, workers: list[asyncio.Task[None]]) -> Any:
        def stop(signame: str) -> None:
            if self.interrupted:
                log.error("second %s: stopping at once", signame)
                os._exit(EXIT_INTERRUPTED)
            self.interrupted = True
            self.stop_reason = f"interrupted by {signame}"
            log.warning("%s: closing sandboxes and writing the run directory (again to force)", signame)
            for worker in workers:
                worker.cancel()

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

    async def _start_backends(self, names: Iterable[str]) -> None:
        for name in sorted(names):
            backend = self.host.backend(name)(self.config.sandbox_options.get(name, {}))
            self.backends[name] = backend
            reaped = await backend.reap()
            if reaped:
                log.info("%s: removed %d sandboxes left behind by earlier runs", name, reaped)

    async def _close_backends(self) -> None:
        for name, backend in self.backends.items():
            try:
                await backend.reap(self.run_id)
                await backend.aclose()
            except Exception as exc:
                log.warning("%s: cleanup failed: %s", name, exc)

    async def _verify_images(self, pending: list[WorkItem], routes: dict[int, str]) -> None:
        """Each distinct image once, in parallel, before any model call is spent."""
        wanted = sorted({(routes[i.index], i.row.image) for i in pending if i.row.image})

        async def verify(backend_name: str, image: str) -> None:
            try:
                self.digests[(backend_name, image)] = await self.backends[backend_name].verify_image(image)
            except ImageUnavailable as exc:
                self.image_failures[(backend_name, image)] = str(exc)
                log.error("image %s unavailable on %s: %s", image, backend_name, exc)
            except Exception as exc:
                self.image_failures[(backend_name, image)] = f"{type(exc).__name__}: {exc}"
                log.error("image %s could not be verified on %s: %s", image, backend_name, exc)

        await asyncio.gather(*(verify(backend, image) for backend, image in wanted if image))

    async def _worker(
        self,
        queue: asyncio.Queue[WorkItem],
        routes: dict[int, str],
        client: ModelClient,
        ledger: LedgerWriter,
        failures: AppendLog,
    ) -> None:
        while self.stop_reason is None:
            self.counters.cost = client.spent()
            if (
                self.config.max_cost is not None
                and self.prior_spent + self.counters.cost >= self.config.max_cost
            ):
                self.stop_reason = f"--max_cost {self.config.max_cost:g} reached"
                log.warning("%s: no new sessions are started", self.stop_reason)
                return
            try:
                item = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            await self._process(item, routes[item.index], client, ledger, failures)
            self.reporter.tick()

    async def _process(
        self,
        item: WorkItem,
        backend_name: str,
        client: ModelClient,
        ledger: LedgerWriter,
        failures: AppendLog,
    ) -> None:
        for attempt in range(1, self.config.max_attempts + 1):
            self.counters.in_flight += 1
            try:
                record = await self._attempt(item, attempt, backend_name, client, ledger.next_batch_num())
            except SessionFailure as failure:
                self._record_failure(failures, item, attempt, failure)
                if failure.stops_run:
                    if self.stop_reason is None:
                        self.stop_reason = str(failure)
                        log.error("stopping the run (%s): %s", failure.error_class, failure)
                    return
                if not failure.retryable or attempt == self.config.max_attempts:
                    self.counters.failed += 1
                    return
                await asyncio.sleep(backoff_delay(attempt, self.config.retry_backoff))
                continue
            finally:
                self.counters.in_flight -= 1
            if not ledger.append(record):  # kept in memory, written again: see _write_held
                self._disk_error(ledger.path, ledger.error)
            self._count_success(record)
            return

    def _count_success(self, record: dict[str, Any]) -> None:
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

    def _record_failure(
        self, failures: AppendLog, item: WorkItem, attempt: int, failure: SessionFailure
    ) -> None:
        entry = {
            "work_id": item.work_id,
            "prompt_id": item.prompt_id,
            "prompt_index": item.index,
            "attempt": attempt,
            "error_class": failure.error_class,
            "message": self.scrubber.text(str(failure)[:2000]),
            "time": datetime.now(UTC).isoformat(),
        }
        if not failures.append(entry):
            self._disk_error(failures.path, failures.error)
        self.counters.errors.append(f"prompt {item.index}: {failure.error_class}: {str(failure)[:160]}")
        if failure.stops_run:
            return  # said once, by the stop itself
        prefix = item.row.prompt[: self.config.log_prefix_chars]
        log.warning(
            "prompt %d attempt %d failed (%s): %s | %r",
            item.index,
            attempt,
            failure.error_class,
            failure,
            prefix,
        )

    async def _attempt(
        self, item: WorkItem, attempt: int, backend_name: str, client: ModelClient, batch_num: int
    ) -> dict[str, Any]:
        image = item.row.image
        if image and (backend_name, image) in self.image_failures:
            raise SessionFailure(
                "image_unavailable", self.image_failures[(backend_name, image)], retryable=False
            )
        started = time.monotonic()
        try:
            async with asyncio.timeout(self.config.prompt_timeout) as deadline:
                with session_deadline(deadline):  # waits on the run's own rate limits do not count
                    return await self._session(item, attempt, backend_name, client, batch_num, started)
        except TimeoutError:
            raise SessionFailure(
                "prompt_timeout", f"no result within {self.config.prompt_timeout:g}s"
            ) from None
        except ModelError as exc:
            raise SessionFailure(
                exc.error_class, str(exc), retryable=exc.retryable, stops_run=exc.stops_run
            ) from None
        except ImageUnavailable as exc:
            raise SessionFailure(exc.error_class, str(exc), retryable=False) from None
        except SandboxError as exc:
            raise SessionFailure(exc.error_class, str(exc)) from None
        except Exception as exc:
            raise SessionFailure("internal_error", f"{type(exc).__name__}: {exc}") from exc

    async def _session(
        self,
        item: WorkItem,
        attempt: int,
        backend_name: str,
        client: ModelClient,
        batch_num: int,
        started: float,
    ) -> dict[str, Any]:
        config = self.config
        toolsets = self.distribution.sample(rng_for(config.seed, item.work_id))
        tools = {tool.name: tool for name in toolsets for tool in self.host.toolsets[name].tools}
        spec = SandboxSpec(
            run_id=self.run_id,
            work_id=item.work_id,
            image=item.row.image,
            cwd=item.row.cwd,
            lifetime=min(config.sandbox_lifetime, config.prompt_timeout + 120),
        )
        sandbox = await self.backends[backend_name].create(spec)
        try:
            session = Session(
                client=client,
                sandbox=sandbox,
                tools=tools,
                known_tools=frozenset(self.run_tools),
                system_prompt=config.system_prompt,
                ephemeral_system_prompt=config.ephemeral_system_prompt,
                prefill_messages=config.prefill_messages,
                max_turns=config.max_turns,
                tool_timeout=config.tool_timeout,
                tool_output_cap=config.tool_output_cap,
            )
            result = await run_conversation(session, item.row.prompt)
        finally:
            await asyncio.shield(sandbox.close())
        record = record_json(
            result,
            self.run_tools,
            work_id=item.work_id,
            prompt_id=item.prompt_id,
            prompt_index=item.index,
            metadata={
                **item.row.extra_fields,
                "batch_num": batch_num,
                "timestamp": datetime.now(UTC).isoformat(),
                "model": config.model,
            },
            toolsets_used=sorted(toolsets),
            tools_offered=sorted(tools),
            duration_s=round(time.monotonic() - started, 3),
            attempt=attempt,
            backend=backend_name,
            image=item.row.image,
            digest=self.digests.get((backend_name, item.row.image)) if item.row.image else None,
        )
        return self.scrubber.scrub(record)

    # -- run directory bookkeeping ------------------------------------------------------------------

    def _record_invocation_start(self, started: datetime, pending: int) -> None:
        entry = {"started": started.isoformat(), "pending_at_start": pending, "run_id": self.run_id}
        plugins = dict(sorted(self.host.sources.items()))
        changes = self.manifest.start(self.config.manifest(), plugins, entry, OUTPUT_AFFECTING)
        for key, (old, new) in changes.items():
            log.warning("resuming with %s changed from %r to %r: the dataset will mix both", key, old, new)

    def _record_invocation_end(self, started: datetime) -> None:
        ended = datetime.now(UTC)
        try:
            self.manifest.update(
                ended=ended.isoformat(),
                wall_seconds=round((ended - started).total_seconds(), 3),
                stop_reason=self.stop_reason,
                **self._progress(self.client_statistics),
            )
        except RunIOError as exc:
            if self.io_error is None:
                raise
            log.error("%s (run.json not updated)", exc)  # the disk error is said once, below

    def _progress(self, client_statistics: dict[str, Any]) -> dict[str, Any]:
        return {
            "succeeded": self.counters.succeeded,
            "failed": self.counters.failed,
            "secrets_scrubbed": self.scrubber.scrubbed,
            "model_client": client_statistics,
        }

    def _disk_error(self, path: Path, error: OSError | None) -> None:
        """A write the disk refused: no new session starts; finished records stay in memory."""
        if self.io_error is None:
            self.io_error = RunIOError(path, error or "write failed")
            self.stop_reason = f"cannot write {self.io_error}"
            log.error("cannot write %s: no new sessions are started", self.io_error)

    def _close_logs(self, *logs: LedgerWriter | AppendLog) -> None:
        for log_ in logs:
            try:
                log_.close()
            except OSError as exc:
                self._disk_error(log_.path, exc)
