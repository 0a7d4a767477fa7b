"""``trajkit serve --record RUN_DIR``: every served session a trajectory in a run directory's ledger.

The server holds the run directory as a run does, through the same
:class:`~trajkit.run.invocation.Invocation` (its lock, an invocation in ``run.json`` with what it
spent, the ledger writer and the tools catalogue), appends one record per finished session (the run's record schema, secrets
scrubbed) and merges now and then, so ``status``, ``stats``, ``report``, ``export`` and
``compress`` read served traffic like any run. A served session's identity is its conversation:
the same conversation served twice is two occurrences of one prompt.

Merging reads only closed ledger files: before each merge the writer is closed and a new one
starts the next batch file, so the merge (on a thread) never reads a line being written.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from trajkit.agent import ConversationResult
from trajkit.config.run_config import RunConfig
from trajkit.hookspecs import RunInfo
from trajkit.jsonutil import dumps_line
from trajkit.manager import PluginHost
from trajkit.model import Message
from trajkit.record.filters import TrajectoryFilter
from trajkit.record.secrets import Scrubber
from trajkit.record.trajectory import record_json
from trajkit.record.writers import OutputWriter
from trajkit.run.dataset import prompt_id
from trajkit.run.files import RunIOError
from trajkit.run.finalize import merge_run, rejection
from trajkit.run.invocation import Invocation
from trajkit.run.ledger import SERVED, LedgerIndex, in_ledger_order, scan
from trajkit.run.rundir import RunDir
from trajkit.run.settings import changed_settings
from trajkit.tools.catalog import tool_schemas_key

log = logging.getLogger("trajkit")

SERVED_BACKEND = SERVED
"""Part of a served prompt's identity, so it never collides with a dataset row's."""


class Recorder:
    def __init__(
        self,
        config: RunConfig,
        run_tools: list[str],
        filters: list[TrajectoryFilter],
        writers: list[OutputWriter],
        scrubber: Scrubber,
        merge_interval: float,
    ) -> None:
        self.config = config
        self.run_dir = RunDir(config.run_dir)
        self.run_tools = run_tools
        self.filters = filters
        self.writers = writers
        self.scrubber = scrubber
        self.merge_interval = merge_interval
        self.invocation = Invocation(self.run_dir, config.run_name)
        self.index = LedgerIndex()
        self.occurrences: dict[str, int] = {}
        self.recorded = 0
        self.rejected = 0
        self.unmerged = 0
        self.info = RunInfo(config.run_name, config.run_dir, config)
        self.host: PluginHost | None = None
        self.merger: asyncio.Task[None] | None = None
        self.stopping = asyncio.Event()
        self.statistics: dict[str, Any] = {}
        self.client_statistics: Callable[[], dict[str, Any]] = dict

    def open(self, host: PluginHost, client_statistics: Callable[[], dict[str, Any]]) -> None:
        """Take the run directory (one writer: a run or a server), note this invocation, scan the
        ledger for what was recorded before. Must run on the server's event loop."""
        self.host = host
        self.client_statistics = client_statistics
        manifest = self.invocation.hold()
        try:
            earlier = manifest.data.get("config") or {}
            if earlier.get("dataset_file"):
                raise RunIOError(
                    self.run_dir.path,
                    f"holds a batch run of {earlier['dataset_file']}; record served sessions in a "
                    "run directory of their own",
                )
            changes = changed_settings(earlier, self.config, host) if earlier else {}
            for key, (old, new) in changes.items():
                log.warning("%s: recording with %s changed from %r to %r", self.run_dir, key, old, new)
            self.index = scan(self.run_dir)
            entry = {"pending_at_start": 0, "served": True}
            self.invocation.begin(self.config, host, entry, changes, self._progress)
        except BaseException:
            self.invocation.release()
            raise
        for done_prompt, occurrences in self.index.by_prompt.items():
            self.occurrences[done_prompt] = max(occurrences) + 1
        self.merger = asyncio.create_task(self._merge_now_and_then())

    def record(
        self,
        result: ConversationResult,
        conversation: list[Message],
        toolsets: list[str],
        toolsets_used: list[str],
        schemas: list[dict[str, Any]],
        duration_s: float,
        backend: str,
        request_id: str,
        *,
        score: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        own_tools: Iterable[str] = (),
    ) -> None:
        """Append one served session's record; ``schemas`` are the tools offered, the agent's
        and the client's, saved once per distinct set in ``tools.json`` as a run's are;
        ``score`` is the record's score, ``metadata`` fields added to its metadata; ``own_tools``
        the session's own tools (not the client's), counted in ``tool_stats`` with the run's."""
        identity = prompt_id(dumps_line(conversation).decode(), None, None, SERVED_BACKEND)
        occurrence = self.occurrences.get(identity, 0)
        self.occurrences[identity] = occurrence + 1
        index = len(self.index.records) + self.unmerged
        record = record_json(
            result, sorted({*self.run_tools, *own_tools}),
            work_id=f"{identity}.{occurrence}", prompt_id=identity, prompt_index=index,
            metadata={
                "batch_num": self.invocation.ledger.next_batch_num(),
                "timestamp": datetime.now(UTC).isoformat(),
                "model": self.config.model,
                "served": True,
                "request_id": request_id,
                **(metadata or {}),
            },
            toolsets_used=toolsets_used, toolsets_offered=toolsets,
            tools_offered=[schema["function"]["name"] for schema in schemas],
            tool_schemas_key=self._save_schemas(schemas), duration_s=round(duration_s, 3),
            attempt=1, backend=backend, image=None, digest=None, score=score,
        )  # fmt: skip
        record = self.scrubber.scrub(record)
        ledger = self.invocation.ledger
        if not ledger.append(record):
            log.error("cannot record a served session: %s", RunIOError(ledger.path, ledger.error or ""))
        self.unmerged += 1
        self.recorded += 1
        reason = rejection(record, self.filters)
        self.rejected += reason is not None
        if self.host is not None:
            self.host.trajectory_finished(self.info, record, reason)

    def _save_schemas(self, schemas: list[dict[str, Any]]) -> str | None:
        """The key of the set in ``tools.json``; None when the disk refuses it (export then takes
        the installed plugins' schemas, as for runs made before the file existed)."""
        key = tool_schemas_key(schemas)
        try:
            self.invocation.catalog.add({key: schemas})
        except RunIOError as exc:
            log.error("cannot save the tools a served session was offered: %s", exc)
            return None
        return key

    def _progress(self) -> dict[str, Any]:
        return {
            "succeeded": self.recorded,
            "failed": 0,
            "secrets_scrubbed": self.scrubber.scrubbed,
            "model_client": self.client_statistics(),
        }

    async def _merge_now_and_then(self) -> None:
        """Merge every ``merge_interval`` seconds while there is something new. Stopped through
        :attr:`stopping`, never cancelled: a merge runs on a thread, and one cut loose there
        could replace the outputs after the final merge wrote them."""
        while not self.stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), self.merge_interval)
            if self.unmerged and not self.stopping.is_set():
                try:
                    await self.merge()
                except (RunIOError, OSError) as exc:
                    log.error("merging the recorded sessions failed: %s", exc)

    async def merge(self) -> dict[str, Any]:
        """Close the ledger file being written, start the next, merge everything recorded so far."""
        invocation = self.invocation
        closing, invocation.ledger = invocation.ledger, self.run_dir.ledger_writer(self.config.batch_size)
        merged = self.unmerged  # records made while the old file closes go to the new one: not these
        await asyncio.to_thread(closing.close)
        self.index = scan(self.run_dir, self.index)
        self.unmerged -= merged
        paired = in_ledger_order(self.index)
        manifest = copy.deepcopy(invocation.manifest.data)
        self.statistics = await asyncio.to_thread(
            merge_run, self.run_dir, paired, self.index, self.filters, self.writers, self.run_tools, manifest
        )
        return self.statistics

    async def close(self) -> None:
        """Final merge, the invocation's end in ``run.json``, the lock released."""
        try:
            self.stopping.set()
            if self.merger is not None:
                (outcome,) = await asyncio.gather(
                    self.merger, return_exceptions=True
                )  # a merge under way ends first
                if isinstance(outcome, Exception):
                    log.error("merging the recorded sessions failed: %s: %s", type(outcome).__name__, outcome)
            await self.invocation.end(None, self._progress())
            statistics = await self.merge()
            if self.host is not None:
                self.host.run_end(self.info, statistics)
        finally:
            self.invocation.release()
