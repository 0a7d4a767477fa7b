"""A run directory read back for ``trajkit stats`` and ``trajkit report``, and the report's data.

The statistics and the kept and rejected trajectories are the ledger's as it is now
(:mod:`trajkit.run.view`: the last merge's files when they are current, else a merge of the ledger
into a temporary directory), so a run going on, killed or stopped by a full disk reads right.
The totals and charts cover every trajectory; only the conversations embedded for browsing are
capped.
"""

from __future__ import annotations

import contextlib
import heapq
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from trajkit import __version__
from trajkit.run.files import RunIOError
from trajkit.run.rundir import RunDir

if TYPE_CHECKING:
    from trajkit.manager import PluginHost

TURN_CHARS = 20_000
"""Characters of one turn's text kept in the report; tool output can be far longer and adds little."""
HISTOGRAM_BINS = 20
TOP_REASONS = 12


@dataclass(frozen=True)
class RunFiles:
    """The summary files of one run directory."""

    run_dir: RunDir
    statistics: dict[str, Any]
    manifest: dict[str, Any]
    outputs: RunDir
    """Where the kept and rejected trajectories are (the run directory, or a merge of its ledger)."""

    @property
    def config(self) -> dict[str, Any]:
        config: dict[str, Any] = self.manifest.get("config") or {}
        return config

    def failures(self) -> Iterator[dict[str, Any]]:
        return self.run_dir.failures()

    def trajectories(self) -> Iterator[tuple[str, str | None, dict[str, Any]]]:
        """``(status, reason, record)`` for every kept and rejected trajectory, in dataset order.

        Both files are written in dataset order by the same merge, so a streaming merge on the
        prompt index interleaves them without holding either in memory.
        """
        kept = (("kept", None, r) for r in _read_jsonl(self.outputs.kept_path))
        rejected = (
            ("rejected", str(line.get("reason") or ""), line["record"])
            for line in _read_jsonl(self.outputs.rejected_path)
            if isinstance(line.get("record"), dict)
        )
        return heapq.merge(kept, rejected, key=lambda item: item[2].get("prompt_index", 0))


@contextlib.contextmanager
def opened_run(run_dir: RunDir, host: PluginHost) -> Iterator[RunFiles]:
    """The run as its ledger stands now, or a usage error that says what is missing."""
    from trajkit.run.view import NotARun, current_outputs, read_run

    try:
        state = read_run(run_dir, host)
        with current_outputs(state, host) as (outputs, statistics):
            if statistics is None:
                raise click.ClickException(
                    f"{run_dir} cannot be read: {state.problem or 'not a trajkit run directory'}; "
                    "and no merge of it was made"
                )
            yield RunFiles(run_dir, statistics, state.manifest, outputs)
    except (RunIOError, NotARun) as exc:
        raise click.ClickException(str(exc)) from None


def _read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    from trajkit.run.ledger import read_jsonl

    return read_jsonl(path)


# -- the report's data ----------------------------------------------------------------------------


@dataclass
class Trajectories:
    """What one pass over the kept and rejected trajectories gathers for the page."""

    limit: int
    total: int = 0
    api_calls: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    reasons: Counter[str] = field(default_factory=Counter)
    embedded: list[dict[str, Any]] = field(default_factory=list)

    def add(self, status: str, reason: str | None, record: dict[str, Any]) -> None:
        self.total += 1
        self.api_calls.append(int(record.get("api_calls") or 0))
        self.tokens.append(int((record.get("usage") or {}).get("total_tokens") or 0))
        if reason is not None:
            self.reasons[reason] += 1
        if len(self.embedded) < self.limit:
            self.embedded.append(browser_entry(status, reason, record))


def report_data(run: RunFiles, limit: int) -> dict[str, Any]:
    """Everything the page shows, as one JSON-able object."""
    seen = Trajectories(limit)
    for status, reason, record in run.trajectories():
        seen.add(status, reason, record)
    config = run.config
    return {
        "run": {
            "name": run.statistics.get("run_name", run.run_dir.name),
            "dir": str(run.run_dir),
            "model": config.get("model"),
            "distribution": config.get("distribution") or ", ".join(config.get("toolsets") or []) or None,
            "dataset_file": config.get("dataset_file"),
            "trajkit_version": run.manifest.get("trajkit_version", __version__),
            "generated": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        },
        "statistics": run.statistics,
        "charts": charts(run, seen),
        "browse": {
            "total": seen.total,
            "embedded": len(seen.embedded),
            "limit": limit,
            "items": seen.embedded,
            "note": missing_kept_note(run),
        },
    }


def charts(run: RunFiles, seen: Trajectories) -> dict[str, Any]:
    """The data of the page's charts: from the statistics, and from every trajectory (``seen``)."""
    s = run.statistics
    failures = s.get("failures") or {}
    samples: dict[str, str] = {}
    for entry in run.failures():
        samples[str(entry.get("error_class", "unknown"))] = str(entry.get("message", ""))[:300]
    return {
        "tools": [
            {"name": name, "success": stat.get("success", 0), "failure": stat.get("failure", 0)}
            for name, stat in sorted(
                (s.get("tools") or {}).items(), key=lambda kv: (-kv[1].get("count", 0), kv[0])
            )
        ],
        "api_calls": histogram(seen.api_calls),
        "tokens": histogram(seen.tokens),
        "failures": [
            {"name": cls, "attempts": n, "failing": (failures.get("failing_by_class") or {}).get(cls, 0)}
            for cls, n in (failures.get("failed_attempts_by_class") or {}).items()
        ],
        "failure_samples": samples,
        "rejections": top_counts(seen.reasons, TOP_REASONS),
        "backends": [{"name": k, "count": v} for k, v in (s.get("backends") or {}).items()],
        "pass_rates": pass_rates(s),
    }


def pass_rates(statistics: dict[str, Any]) -> list[dict[str, Any]]:
    """Scored trajectories and how many passed their checks, per toolset offered and per source."""
    scores = statistics.get("scores") or {}
    return [
        {"group": group, "name": name, "scored": g.get("scored", 0), "passed": g.get("passed", 0)}
        for group, key in (("toolset", "by_toolset"), ("source", "by_source"))
        for name, g in (scores.get(key) or {}).items()
    ]


def missing_kept_note(run: RunFiles) -> str | None:
    """Kept conversations are read from the ``sharegpt`` writer's file; a run without it has none to show."""
    if run.statistics.get("kept") and not run.outputs.kept_path.is_file():
        return (
            f"This run wrote no {run.outputs.kept_path.name} (run it with --writer sharegpt), so only rejected "
            "trajectories can be browsed here; the summary and charts still count every one."
        )
    return None


def histogram(values: list[int], bins: int = HISTOGRAM_BINS) -> list[dict[str, int]]:
    """Bins ``[lo, hi]`` (inclusive integers) with counts: one bin per value when few values differ."""
    if not values:
        return []
    low, high = min(values), max(values)
    width = max(1, math.ceil((high - low + 1) / bins))
    counts = Counter((v - low) // width for v in values)
    return [
        {"lo": low + i * width, "hi": low + (i + 1) * width - 1, "count": counts.get(i, 0)}
        for i in range((high - low) // width + 1)
    ]


def top_counts(counter: Counter[str], keep: int) -> list[dict[str, Any]]:
    top = counter.most_common(keep)
    rest = sum(counter.values()) - sum(n for _, n in top)
    items = [{"name": name, "count": n} for name, n in top]
    if rest:
        items.append({"name": f"{len(counter) - keep} other reasons", "count": rest})
    return items


def browser_entry(status: str, reason: str | None, record: dict[str, Any]) -> dict[str, Any]:
    """The part of one record the browser needs, long turn texts shortened."""
    usage = record.get("usage") or {}
    sandbox = record.get("sandbox") or {}
    metadata = {
        k: v for k, v in (record.get("metadata") or {}).items() if k not in {"batch_num", "timestamp"}
    }
    return {
        "index": record.get("prompt_index"),
        "work_id": record.get("work_id"),
        "status": status,
        "reason": reason,
        "backend": sandbox.get("backend"),
        "image": sandbox.get("image"),
        "tools": sorted(n for n, st in (record.get("tool_stats") or {}).items() if st.get("count")),
        "toolsets": record.get("toolsets_used") or [],
        "toolsets_offered": record.get("toolsets_offered") or record.get("toolsets_used") or [],
        "sample": record.get("sample", 0),
        "score": record.get("score"),
        "api_calls": record.get("api_calls"),
        "tokens": usage.get("total_tokens"),
        "cost": usage.get("cost"),
        "duration_s": record.get("duration_s"),
        "completed": record.get("completed"),
        "finish_reason": record.get("finish_reason"),
        "metadata": metadata,
        "turns": [_turn(t) for t in record.get("conversations") or []],
    }


def _turn(turn: dict[str, Any]) -> dict[str, Any]:
    shown: dict[str, Any] = {"from": turn.get("from"), "value": _clip(turn.get("value"))}
    if turn.get("reasoning"):
        shown["reasoning"] = _clip(turn["reasoning"])
    if turn.get("tool_calls"):
        shown["tool_calls"] = [
            {"id": c.get("id"), "name": c.get("name"), "arguments": _clip(c.get("arguments"))}
            for c in turn["tool_calls"]
        ]
    for key in ("tool_call_id", "name"):
        if turn.get(key):
            shown[key] = turn[key]
    return shown


def _clip(text: Any) -> str:
    text = "" if text is None else str(text)
    if len(text) <= TURN_CHARS:
        return text
    return f"{text[:TURN_CHARS]}\n… [{len(text) - TURN_CHARS:,} more characters not shown in the report]"
