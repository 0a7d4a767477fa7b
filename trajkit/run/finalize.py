"""The merge and the statistics: rebuilt from the whole ledger, deterministically, every time.

Same ledger and dataset, same outputs: rows in dataset order, exactly one record per row,
filters re-applied, every output written atomically. The statistics cover every invocation of
the run, not just the last.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trajkit.jsonutil import dumps_line
from trajkit.model.permanent import SHOWN_ROWS
from trajkit.record.filters import Record, TrajectoryFilter
from trajkit.record.writers import OutputWriter
from trajkit.run.dataset import WorkItem
from trajkit.run.files import atomic_replace
from trajkit.run.ledger import LedgerIndex, Location, RecordReader
from trajkit.run.rundir import RunDir, summed

log = logging.getLogger("trajkit")


def rejection(record: Record, filters: Sequence[TrajectoryFilter]) -> str | None:
    """``"filter: reason"`` from the first filter that rejects the record, else None."""
    for check in filters:
        reason = check.check(record)
        if reason:
            return f"{check.name}: {reason}"
    return None


@dataclass
class Tally:
    """Aggregates over the records of the run, fed one record at a time."""

    run_tools: list[str]
    trajectories: int = 0
    kept: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    completed: int = 0
    with_reasoning: int = 0
    gpt_turns: int = 0
    gpt_turns_with_reasoning: int = 0
    api_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    duration_s: float = 0.0
    invalid_tool_calls: int = 0
    without_tool_calls: int = 0
    backends: Counter[str] = field(default_factory=Counter)
    tools: dict[str, Counter[str]] = field(default_factory=dict)
    scores: PassRates = field(default_factory=lambda: PassRates())

    def add(self, record: Record, reason: str | None) -> None:
        self.trajectories += 1
        if reason is None:
            self.kept += 1
        else:
            self.rejected[reason.split(":", 1)[0]] += 1
        self.completed += bool(record["completed"])
        gpt = [t for t in record["conversations"] if t["from"] == "gpt"]
        reasoned = sum(1 for t in gpt if t.get("reasoning"))
        self.gpt_turns += len(gpt)
        self.gpt_turns_with_reasoning += reasoned
        self.with_reasoning += reasoned > 0
        self.api_calls += record["api_calls"]
        usage = record["usage"]
        self.prompt_tokens += usage["prompt_tokens"]
        self.completion_tokens += usage["completion_tokens"]
        self.cost += usage["cost"] or 0.0
        self.duration_s += record["duration_s"]
        self.invalid_tool_calls += record.get("invalid_tool_calls", 0)
        self.without_tool_calls += not any(t.get("tool_calls") for t in gpt)
        self.backends[record["sandbox"]["backend"]] += 1
        for name, stat in record["tool_stats"].items():
            self.tools.setdefault(name, Counter()).update(stat)
        self.scores.add(record)

    def as_dict(self) -> dict[str, Any]:
        tools = {}
        for name in sorted(set(self.run_tools) | set(self.tools)):
            stat = self.tools.get(name, Counter())
            count = stat["count"]
            tools[name] = {
                "count": count,
                "success": stat["success"],
                "failure": stat["failure"],
                "success_rate": round(stat["success"] / count, 4) if count else None,
                "failure_rate": round(stat["failure"] / count, 4) if count else None,
            }
        return {
            "trajectories": self.trajectories,
            "kept": self.kept,
            "rejected": self.trajectories - self.kept,
            "rejected_by_filter": dict(sorted(self.rejected.items())),
            "completed": self.completed,
            "partial": self.trajectories - self.completed,
            "reasoning_coverage": _ratio(self.with_reasoning, self.trajectories),
            "reasoning_turn_coverage": _ratio(self.gpt_turns_with_reasoning, self.gpt_turns),
            "api_calls": self.api_calls,
            "tokens": {
                "prompt": self.prompt_tokens,
                "completion": self.completion_tokens,
                "total": self.prompt_tokens + self.completion_tokens,
            },
            "cost": round(self.cost, 6),
            "session_seconds": round(self.duration_s, 3),
            "invalid_tool_calls": self.invalid_tool_calls,
            "without_tool_calls": self.without_tool_calls,
            "backends": dict(sorted(self.backends.items())),
            "tools": tools,
            "scores": self.scores.as_dict(),
        }


NO_SOURCE = "(no source)"
"""The ``by_source`` key of records whose row has no ``source`` field."""


@dataclass
class PassRates:
    """How many scored trajectories passed their checks: overall, per toolset offered, per the
    row's ``source`` field, and per row (a row with several samples passes if any sample does)."""

    scored: int = 0
    passed: int = 0
    value: float = 0.0
    by_toolset: dict[str, Counter[str]] = field(default_factory=dict)
    by_source: dict[str, Counter[str]] = field(default_factory=dict)
    rows: dict[int, bool] = field(default_factory=dict)

    def add(self, record: Record) -> None:
        score = record.get("score")
        if not score:
            return
        passed = bool(score["passed"])
        self.scored += 1
        self.passed += passed
        self.value += float(score["value"])
        index = record["prompt_index"]
        self.rows[index] = self.rows.get(index, False) or passed
        offered = record.get("toolsets_offered", record["toolsets_used"])
        groups = [self.by_toolset.setdefault(ts, Counter()) for ts in offered]
        source = record["metadata"].get("source")
        groups.append(self.by_source.setdefault(NO_SOURCE if source is None else str(source), Counter()))
        for group in groups:
            group["scored"] += 1
            group["passed"] += passed

    def as_dict(self) -> dict[str, Any]:
        def rates(groups: dict[str, Counter[str]]) -> dict[str, Any]:
            return {
                name: {
                    "scored": g["scored"],
                    "passed": g["passed"],
                    "pass_rate": _ratio(g["passed"], g["scored"]),
                }
                for name, g in sorted(groups.items())
            }

        return {
            "scored": self.scored,
            "passed": self.passed,
            "failed": self.scored - self.passed,
            "pass_rate": _ratio(self.passed, self.scored),
            "mean_value": round(self.value / self.scored, 4) if self.scored else None,
            "rows_scored": len(self.rows),
            "rows_with_a_pass": sum(self.rows.values()),
            "by_toolset": rates(self.by_toolset),
            "by_source": rates(self.by_source),
        }


def _ratio(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def finalize(
    run_dir: RunDir,
    paired: list[tuple[WorkItem, Location | None]],
    index: LedgerIndex,
    filters: Sequence[TrajectoryFilter],
    writers: Sequence[OutputWriter],
    run_tools: list[str],
    out_dir: RunDir | None = None,
) -> dict[str, Any]:
    """Write every writer's output and ``rejected.jsonl`` into ``out_dir`` (the run directory by
    default); return the record statistics. Without writers nothing is written: only counted."""
    out = out_dir or run_dir
    if writers:
        out.remove_merge_temporaries([w.filename for w in writers])
    offer_tool_schemas(writers, run_dir)
    done = [(item, location) for item, location in paired if location is not None]
    reader = RecordReader(index)
    tally = Tally(run_tools)

    def records() -> Iterator[tuple[dict[str, Any], str | None]]:
        for item, location in done:
            record = reader.read(location)
            record["prompt_index"] = item.index
            record["sample"] = item.sample
            record.setdefault("toolsets_offered", record["toolsets_used"])  # records of older runs
            record.setdefault("score", None)
            yield record, rejection(record, filters)

    try:
        if not writers:
            for record, reason in records():
                tally.add(record, reason)
            return tally.as_dict()
        with (
            atomic_replace(out.rejected_path) as rejected_path,
            rejected_path.open("wb") as rejected_out,
        ):

            def kept() -> Iterator[dict[str, Any]]:
                for record, reason in records():
                    tally.add(record, reason)
                    if reason is None:
                        yield record
                    else:
                        line = {
                            "work_id": record["work_id"],
                            "prompt_index": record["prompt_index"],
                            "reason": reason,
                        }
                        rejected_out.write(dumps_line({**line, "record": record}))

            first, *others = writers
            with atomic_replace(out.output_path(first.filename)) as path:
                first.write(kept(), path)
            for writer in others:
                with atomic_replace(out.output_path(writer.filename)) as path:
                    writer.write((r for r, reason in records() if reason is None), path)
    finally:
        reader.close()
    return tally.as_dict()


def offer_tool_schemas(writers: Sequence[OutputWriter], run_dir: RunDir) -> None:
    """Hand the run's saved tool schemas (``tools.json``) to the writers that render them, so
    they write what the model saw without loading plugins; the file is read only for those."""
    saved = None
    for writer in writers:
        if writer.renders_tools:
            saved = run_dir.tool_schemas() if saved is None else saved
            writer.use_tool_schemas(saved)


def merge_run(
    run_dir: RunDir,
    paired: list[tuple[WorkItem, Location | None]],
    index: LedgerIndex,
    filters: Sequence[TrajectoryFilter],
    writers: Sequence[OutputWriter],
    run_tools: list[str],
    manifest: dict[str, Any],
    out_dir: RunDir | None = None,
    settled: Mapping[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The merge, then ``statistics.json`` and ``checkpoint.json``, all from the ledger; returns the
    statistics. What was spent counts every model response of every invocation, killed ones too.
    With ``out_dir`` the outputs and ``statistics.json`` go there (a reader's view of a run that
    it must not write) and no checkpoint is written; without writers nothing is written at all:
    the statistics of the ledger as it stands are only counted. ``settled``: the rows failed for
    good (:func:`trajkit.model.permanent.failed_for_good`), neither done nor pending."""
    state = run_dir.ledger_state()  # before reading: a run going on may add to it meanwhile
    for bad in index.bad if writers else ():
        log.warning("ledger line skipped, its prompt runs again: %s", bad)
    missing = {item.work_id for item, location in paired if location is None}
    final = {work_id: entry for work_id, entry in (settled or {}).items() if work_id in missing}
    pending = missing - set(final)
    records = finalize(run_dir, paired, index, filters, writers, run_tools, out_dir)
    invocations = manifest.get("invocations") or []
    spend = run_dir.spent(invocations)
    statistics = {
        "run_name": manifest.get("run_name"),
        "dataset_rows": len({item.index for item, _ in paired}),
        "samples_per_prompt": _samples_per_prompt(paired),
        "work_items": len(paired),
        "done": len(paired) - len(missing),
        "pending": len(pending),
        "failed_for_good": len(final),
        **records,
        "spent": spend,
        "failures": failure_summary(run_dir, pending, final),
        "invocations": len(invocations),
        "wall_seconds": round(sum(i.get("wall_seconds", 0) for i in invocations), 3),
        "bad_ledger_lines": len(index.bad),
        "secrets_scrubbed": sum(i.get("secrets_scrubbed", 0) for i in invocations),
        "model_client": _client_counters(invocations, spend),
        "ledger_state": state,
    }
    if not writers:
        return statistics
    (out_dir or run_dir).write_statistics(statistics)
    if out_dir is None:
        config = manifest.get("config") or {}
        run_dir.write_checkpoint(
            {
                "run_name": manifest.get("run_name"),
                "dataset_file": config.get("dataset_file"),
                "done": statistics["done"],
                "pending": sorted(pending),
                "ledger_files": [path.name for _, path in run_dir.batch_files()],
                "outputs": [w.filename for w in writers] + [run_dir.rejected_path.name],
            },
        )
    return statistics


def _client_counters(invocations: list[dict[str, Any]], spend: dict[str, float]) -> dict[str, float]:
    """The model client's counters over every invocation, what was spent as the spend files say
    (to each invocation's last answer, killed ones included)."""
    counters = summed([i.get("model_client") or {} for i in invocations])
    return {**counters, **{key: value for key, value in spend.items() if key in counters or value}}


def _samples_per_prompt(paired: list[tuple[WorkItem, Location | None]]) -> int:
    return max((item.sample for item, _ in paired), default=0) + 1


def failure_summary(
    run_dir: RunDir, pending_work: set[str], final: Mapping[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Failures across invocations: every attempt by class, the rows still failing (pending, tried
    again by a resume) and those failed for good (``final``), the first of them one by one."""
    final = final or {}
    attempts: Counter[str] = Counter()
    last_error: dict[str, str] = {}
    for entry in run_dir.failures():
        attempts[entry.get("error_class", "unknown")] += 1
        last_error[entry.get("work_id", "")] = entry.get("error_class", "unknown")
    still_failing = Counter(cls for work, cls in last_error.items() if work in pending_work)
    for_good = Counter(str(entry.get("error_class", "unknown")) for entry in final.values())
    shown = sorted(final.values(), key=lambda e: (e.get("prompt_index", 0), e.get("work_id", "")))
    return {
        "failed_attempts": sum(attempts.values()),
        "failed_attempts_by_class": dict(sorted(attempts.items())),
        "failing": sum(still_failing.values()),
        "failing_by_class": dict(sorted(still_failing.items())),
        "failed_for_good": len(final),
        "failed_for_good_by_class": dict(sorted(for_good.items())),
        "failed_for_good_rows": [
            {key: entry.get(key) for key in ("prompt_index", "work_id", "error_class", "message")}
            for entry in shown[:SHOWN_ROWS]
        ],
    }
