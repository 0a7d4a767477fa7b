"""The streaming, resumable compression of one JSONL file into another.

Records are read one line at a time and written in input order, each as one ``write`` to an
unbuffered file, so the output is on disk as it grows and memory holds at most ``concurrency``
records. A resume counts the output's complete lines (a torn last line is cut off), skips that many
input records and carries on: what is done is not redone, and with the summary cache nothing
that was paid for is paid again. A record whose compression fails or times out is written
unchanged with the error in its metadata: none is ever dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import logging
import os
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from trajkit.compress.base import Compressor, Outcome, TokenCounter
from trajkit.compress.metrics import Metrics
from trajkit.compress.turns import problems
from trajkit.jsonutil import dumps_line, loads
from trajkit.record.secrets import Scrubber
from trajkit.run.files import write_atomic

log = logging.getLogger("trajkit")

STATE_SUFFIX = ".compress.json"
CACHE_SUFFIX = ".summaries.sqlite"
METRICS_SUFFIX = ".metrics.json"
LOCK_SUFFIX = ".lock"
INCOMPLETE_SUFFIX = ".incomplete"
"""Beside an output that lacks the records of input lines that hold none: which lines they are."""
SKIPPED_SHOWN = 20


class CompressError(RuntimeError):
    """The compression cannot start or go on as asked; the message says what to change."""


def sidecar(output: Path, suffix: str) -> Path:
    return output.with_name(output.name + suffix)


@dataclass
class Job:
    source: Path
    output: Path
    compressor: Compressor
    counter: TokenCounter
    budget: int
    concurrency: int = 16
    record_timeout: float = 600.0
    scrubber: Scrubber | None = None


@dataclass
class Source:
    """Input records after the first ``skip`` ones, and how far through the file reading is.

    Each record comes with a hash of its line, which its output record keeps: a resume checks
    that the records it skips are the ones the output holds, so an input that changed meanwhile
    (a run merged again, with new trajectories in dataset order) is refused, not misaligned.
    """

    path: Path
    skip: int
    metrics: Metrics
    done_digest: str = ""
    """The digest of the input hashes of the records already in the output, in order."""
    position: int = 0

    def __iter__(self) -> Iterator[tuple[dict[str, Any], str]]:
        seen = 0
        digest = hashlib.blake2b(digest_size=16)
        with self.path.open("rb") as lines:
            for number, line in enumerate(lines, 1):
                self.position += len(line)
                if not line.strip():
                    continue
                record, problem = _parse(line)
                if record is None:
                    # A line that is no record cannot be carried through: say where it is, go on,
                    # and the output is marked incomplete at the end.
                    self.metrics.skip(number)
                    log.warning("%s:%d: %s, skipped", self.path, number, problem)
                    continue
                seen += 1
                hashed = line_hash(line)
                if seen <= self.skip:
                    digest.update(hashed.encode())
                    if seen == self.skip:
                        self._check(digest.hexdigest())
                    continue
                yield record, hashed
        if seen < self.skip:
            raise CompressError(
                f"{self.path} holds {seen} records but the output already {self.skip}: the input changed; "
                "pass --overwrite to start again"
            )

    def _check(self, found: str) -> None:
        if found != self.done_digest:
            raise CompressError(
                f"the first {self.skip} records of {self.path} are not those the output was made from: "
                "the input changed since; pass --overwrite to start again"
            )


def line_hash(line: bytes) -> str:
    return hashlib.blake2b(line.rstrip(b"\r\n"), digest_size=12).hexdigest()


def _parse(line: bytes) -> tuple[dict[str, Any] | None, str]:
    """The line's trajectory record, or None and what is wrong with the line."""
    try:
        value = loads(line)
    except ValueError:
        return None, "not JSON"
    if not isinstance(value, dict):
        return None, "not a JSON object"
    if not isinstance(value.get("conversations"), list):
        return None, "no 'conversations' list"
    return value, ""


def mark_completeness(job: Job, metrics: Metrics) -> str | None:
    """Mark the output incomplete (a file beside it naming the skipped input lines) or clear the
    mark; returns what to tell the user of an incomplete output, None for a complete one."""
    marker = sidecar(job.output, INCOMPLETE_SUFFIX)
    if metrics.complete:
        marker.unlink(missing_ok=True)
        return None
    skipped = describe_skipped(job.source, metrics.skipped_input_lines)
    more = metrics.invalid_lines - len(skipped)
    listing = skipped + ([f"... and {more} more"] if more > 0 else [])
    header = f"{job.output} lacks the records of these lines of {job.source}, which hold no trajectory:"
    write_atomic(marker, "\n".join([header, *listing]) + "\n")
    shown = skipped[:SKIPPED_SHOWN] + (
        [f"... ({marker} lists them all)"] if len(listing) > SKIPPED_SHOWN else []
    )
    return (
        f"{metrics.invalid_lines} input lines skipped (they hold no trajectory): {'; '.join(shown)}. "
        f"{job.output} holds the other {metrics.records} records and is marked incomplete ({marker}); "
        "fix or remove those lines and compress again with --overwrite"
    )


def describe_skipped(source: Path, numbers: list[int]) -> list[str]:
    """``FILE:LINE: problem`` for each skipped input line (read again: only the numbers are kept)."""
    wanted = set(numbers)
    found = []
    with source.open("rb") as lines:
        for number, line in enumerate(lines, 1):
            if number in wanted:
                found.append(f"{source}:{number}: {_parse(line)[1] or 'changed since it was read'}")
    return found


@contextlib.contextmanager
def output_lock(output: Path) -> Iterator[None]:
    """One invocation per output file: a second one would interleave its lines with the first's."""
    path = sidecar(output, LOCK_SUFFIX)
    with path.open("a") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CompressError(f"{output} is being written by another trajkit compress") from None
        yield


def resume_point(output: Path, metrics: Metrics) -> tuple[int, str]:
    """Complete records already in ``output``, counted into ``metrics``, and the digest of their
    input hashes (see :class:`Source`); a torn last line is cut off."""
    digest = hashlib.blake2b(digest_size=16)
    if not output.exists():
        return 0, digest.hexdigest()
    with output.open("r+b") as handle:
        good = 0
        for line in handle:
            if not line.endswith(b"\n"):
                break
            record, _ = _parse(line)
            if record is None:
                break
            meta = record.get("compression") or {}
            metrics.add(meta)
            digest.update(str(meta.get("input_hash")).encode())
            good += len(line)
        if good < handle.seek(0, os.SEEK_END):
            log.warning("%s: an unfinished last line (left by a killed run) is cut off", output)
            handle.truncate(good)
    return metrics.records, digest.hexdigest()


class Compression:
    """Runs one :class:`Job`; ``on_progress(bytes_read, metrics)`` is called after each record."""

    def __init__(self, job: Job, on_progress: Callable[[int, Metrics], None] | None = None) -> None:
        self.job = job
        self.on_progress = on_progress or (lambda _position, _metrics: None)
        self.meta_base = {
            "strategy": job.compressor.name,
            "max_tokens": job.budget,
            "counter": job.counter.describe(),
        }

    async def run(self, metrics: Metrics | None = None) -> Metrics:
        """Compress what is left; ``metrics`` (filled in here) is the caller's, so what was counted
        before a failure is still there to report."""
        metrics = metrics if metrics is not None else Metrics()
        done, digest = resume_point(self.job.output, metrics)
        if done:
            log.info("%s: %d records already done, continuing after them", self.job.output, done)
        source = Source(self.job.source, done, metrics, digest)
        with open(self.job.output, "ab", buffering=0) as out:
            async for record in self._results(source):
                _write(out, dumps_line(record))
                metrics.add(record["compression"])
                self.on_progress(source.position, metrics)
        return metrics

    async def _results(self, source: Source) -> AsyncIterator[dict[str, Any]]:
        """Compressed records in input order, at most ``concurrency`` in flight."""
        if not self.job.compressor.uses_model:
            for record, hashed in source:  # nothing to wait for: no tasks, no reordering
                yield await self.process(record, hashed)
            return
        window: deque[asyncio.Task[dict[str, Any]]] = deque()
        try:
            for record, hashed in source:
                window.append(asyncio.create_task(self.process(record, hashed)))
                while len(window) >= self.job.concurrency or (window and window[0].done()):
                    yield await window.popleft()
            while window:
                yield await window.popleft()
        finally:
            for task in window:
                task.cancel()

    async def process(self, record: dict[str, Any], input_hash: str = "") -> dict[str, Any]:
        """The record with its conversation compressed and its ``compression`` metadata set."""
        turns = record["conversations"]
        budget = self.job.budget
        meta = {**self.meta_base, "tokens_before": 0, "tokens_after": 0, **_EMPTY, "input_hash": input_hash}
        try:
            before = self.job.counter.count(turns)
        except Exception as exc:  # a turn that is not a turn: keep the record, say why
            return {**record, "compression": {**meta, "error": self._describe(exc)}}
        meta["tokens_before"] = meta["tokens_after"] = before
        if before <= budget:
            return {**record, "compression": {**meta, "under_budget": True}}
        try:
            work = self.job.compressor.compress(turns, budget, before)
            # Only a model can keep a record waiting; wait_for would cost a task per record.
            uses_model = self.job.compressor.uses_model
            outcome = await (asyncio.wait_for(work, self.job.record_timeout) if uses_model else work)
            found = problems(outcome.turns)
            if found and not problems(turns):
                raise CompressError(f"the result would not be a valid trajectory: {found[0]}")
        except Exception as exc:
            return {**record, "compression": {**meta, "error": self._describe(exc)}}
        meta.update(_outcome_meta(outcome))
        meta["under_budget"] = outcome.tokens <= budget
        meta["compressed"] = outcome.turns != turns  # whatever the strategy did, not only what it counts
        result = {**record, "conversations": outcome.turns, "compression": meta}
        if self.job.scrubber is not None:
            result = self.job.scrubber.scrub(result)
        return result

    def _describe(self, exc: Exception) -> str:
        if isinstance(exc, TimeoutError):
            text = f"timeout: not compressed within {self.job.record_timeout:g}s"
        else:
            text = f"{type(exc).__name__}: {exc}"
        return self.job.scrubber.text(text) if self.job.scrubber is not None else text


_EMPTY: dict[str, Any] = {
    "under_budget": False,
    "compressed": False,
    "summaries": 0,
    "masked": 0,
    "requests": 0,
    "cost": 0.0,
    "summary_model": None,
    "error": None,
    "note": None,
}
"""Every key of the metadata in every record: Arrow sees one schema."""


def _outcome_meta(outcome: Outcome) -> dict[str, Any]:
    return {
        "tokens_after": outcome.tokens,
        "summaries": outcome.summaries,
        "masked": outcome.masked,
        "requests": outcome.requests,
        "cost": round(outcome.cost, 8),
        "summary_model": outcome.summary_model,
        "note": "; ".join(outcome.notes) or None,
    }


def _write(out: BinaryIO, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = out.write(view)
        view = view[written or 0 :]
