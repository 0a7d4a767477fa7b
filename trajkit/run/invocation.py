"""One invocation writing a run directory: ``trajkit run`` and ``trajkit serve --record`` alike.

The sequence is the same for both, so it is written once (:class:`Invocation`): the lock taken
(the directory made if new), ``run.json`` read; the invocation's entry started in it with the
settings it runs with, the ledger writer and the tools catalogue opened, the entry kept up to date
every :data:`ACCOUNTS_INTERVAL` seconds (what it has spent so far, should it be killed); at the end,
the entry closed with its final figures and the lock released. What each does between (the
runner's recorder, the server's) is its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trajkit import __version__
from trajkit.jsonutil import dumps_line
from trajkit.run.files import RunIOError, json_text, timestamp, write_atomic
from trajkit.run.ledger import AppendLog
from trajkit.run.rundir import Manifest, RunDir

if TYPE_CHECKING:
    from trajkit.config.run_config import RunConfig
    from trajkit.manager import PluginHost
    from trajkit.run.ledger import LedgerWriter
    from trajkit.tools.catalog import ToolCatalog

log = logging.getLogger("trajkit")

ACCOUNTS_INTERVAL = 5.0
"""Seconds between updates of the invocation's entry in run.json (what it has spent so far), by a
run and by ``trajkit serve --record`` alike (:class:`ManifestKeeper`)."""


class Invocation:
    """The one writer of a run directory while it runs: its lock, its entry in ``run.json``, the
    ledger writer and the tools catalogue."""

    def __init__(self, run_dir: RunDir, run_name: str) -> None:
        self.run_dir = run_dir
        self.run_name = run_name
        self.lock = run_dir.lock()
        self.manifest: Manifest
        self.started = datetime.now(UTC)
        self.keeper: ManifestKeeper | None = None
        self.ledger: LedgerWriter
        self.catalog: ToolCatalog

    def hold(self, before_reading: Callable[[], None] | None = None) -> Manifest:
        """Take the lock (making the run directory if need be), call ``before_reading`` (what must
        hold the lock but come before ``run.json`` is read: checks, ``--overwrite``), read
        ``run.json``. The lock is released if any of it fails."""
        self.lock.take()
        try:
            if before_reading is not None:
                before_reading()
            self.manifest = self.run_dir.manifest(self.run_name, __version__)
        except BaseException:
            self.lock.release()
            raise
        return self.manifest

    def begin(
        self,
        config: RunConfig,
        host: PluginHost,
        entry: dict[str, Any],
        changes: Mapping[str, list[Any]],
        progress: Callable[[], dict[str, Any]],
    ) -> None:
        """Start this invocation's entry in ``run.json`` (``entry``, when it started, the settings
        it runs with, which are the run's from now on, its ``changes`` to them and the plugins
        installed), open the ledger and the tools catalogue, and keep the entry's ``progress`` up
        to date from now on. Must run on the event loop the invocation runs on."""
        self.started = datetime.now(UTC)
        plugins = dict(sorted(host.sources.items()))
        entry = {"started": self.started.isoformat(), **entry}
        self.manifest.start(config.manifest(), plugins, entry, changes)
        self.ledger = self.run_dir.ledger_writer(config.batch_size)
        self.catalog = self.run_dir.tools_catalog()
        self.keeper = ManifestKeeper(self.manifest, progress)

    async def stop_keeping(self) -> None:
        """No more updates of the entry (they may call into what is about to close)."""
        keeper, self.keeper = self.keeper, None
        if keeper is not None:
            await keeper.stop()

    async def end(self, stop_reason: str | None, progress: dict[str, Any]) -> None:
        """Close the invocation's entry: when it ended, how long it took, why it stopped early (None
        if it did not) and its final ``progress``."""
        await self.stop_keeping()
        ended = datetime.now(UTC)
        self.manifest.update(
            ended=ended.isoformat(),
            wall_seconds=round((ended - self.started).total_seconds(), 3),
            stop_reason=stop_reason,
            **progress,
        )

    def release(self) -> None:
        self.lock.release()


class ManifestKeeper:
    """Writes the running invocation's entry (``fields()``: progress, what it has spent) into
    ``run.json`` every ``interval`` seconds, so that a killed invocation's spend is known. The write
    runs on a thread (it fsyncs); :meth:`stop` waits for it, so run.json never has two writers."""

    def __init__(
        self, manifest: Manifest, fields: Callable[[], dict[str, Any]], interval: float = ACCOUNTS_INTERVAL
    ) -> None:
        self.manifest = manifest
        self.fields = fields
        self.interval = interval
        self.stopping = asyncio.Event()
        self.task = asyncio.create_task(self._keep())

    async def _keep(self) -> None:
        while not self.stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), self.interval)
            if self.stopping.is_set():
                return
            self.manifest.invocations[-1].update(updated=timestamp(), **self.fields())
            text = json_text(self.manifest.data)  # here: the loop thread owns the manifest
            try:
                await asyncio.to_thread(write_atomic, self.manifest.run_dir.manifest_path, text)
            except RunIOError as exc:
                log.warning("%s (the spend so far is not saved)", exc)

    async def stop(self) -> None:
        self.stopping.set()
        await self.task


SPEND_LINES = 10_000
"""Lines a spend file grows to before it is rewritten as its last line alone."""


class SpendFile:
    """The invocation's spend file: a line of its spend so far as each model answer arrives.

    Only the last whole line counts, so the lines the disk refused are replaced by the newest, and
    now and then the file is rewritten as its last line alone (atomically: a kill meanwhile leaves
    the old file or the new one, each ending in the spend so far)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.log = AppendLog(path)
        self.lines = 0

    def write(self, spend: Mapping[str, float]) -> bool:
        """Save ``spend``; False when the disk refused it (it is held: :attr:`log`)."""
        self.log.unwritten.clear()  # held lines are older spend: the newest says all they said
        if self.lines >= SPEND_LINES:
            try:
                self.log.close()
                write_atomic(self.path, dumps_line(dict(spend)).decode())
            except (OSError, RunIOError):
                pass  # the file as it was, appended to: a longer file, nothing lost
            else:
                self.lines = 1
                self.log = AppendLog(self.path)
                return True
            self.log = AppendLog(self.path)
        self.lines += 1
        return self.log.append(dict(spend))
