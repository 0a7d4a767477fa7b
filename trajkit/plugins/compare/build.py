"""The comparison of ``trajkit compare``: runs matched prompt by prompt, as one JSON-able object.

Rows are matched by prompt identity (the ``prompt_id`` content hash: the prompt, image, working
directory and backend), never by line number, so runs of reordered or overlapping datasets line
up. Each run's figures cover the prompts every run has finished (so the columns are comparable);
what only some runs have is counted apart. Paired differences are against the first run (the
baseline), on the prompts both scored.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trajkit.plugins.compare.read import RunRead, Trajectory
from trajkit.plugins.compare.stats import CONFIDENCE, at_k, paired, percentile, wilson

NOT_OFFERED = frozenset(
    {
        # what is compared, where it was served and what it cost
        "model", "base_url", "api_key", "api_key_file", "prices", "transport",
        # where the run lives and how it was carried out
        "run_name", "output_dir", "dataset_file", "prompt_field", "max_samples", "resume", "overwrite",
        "batch_size", "num_workers", "verbose", "quiet", "log_prefix_chars", "seed", "executor",
        "executor_options", "max_concurrent_requests", "max_rpm", "max_tpm", "max_cost",
        "max_retries", "request_timeout", "retry_budget", "retry_backoff", "max_attempts",
        # what is made of the trajectories afterwards
        "filters", "disabled_filters", "filter_options", "writers", "writer_options", "compress",
        "distributions",  # compared as the definition of the distribution each run used
    }
)  # fmt: skip
"""Saved settings that say nothing of what the model was offered; every other setting of
``run.json`` that differs between the runs is reported as a difference."""


def compare_runs(runs: Sequence[RunRead], labels: Sequence[str]) -> dict[str, Any]:
    """Everything ``compare`` shows, for the terminal, ``--json`` and the page alike."""
    source_of: dict[str, str] = {}
    for run in runs:
        for t in run.trajectories:
            source_of.setdefault(t.prompt_id, t.source)
    done = [{t.prompt_id for t in run.trajectories} for run in runs]
    shared = set.intersection(*done) if done else set()
    sources = sorted({source_of[p] for p in shared})
    scored = {source_of[t.prompt_id] for run in runs for t in run.trajectories if t.passed is not None}
    baseline = runs[0]
    return {
        "confidence": CONFIDENCE,
        "baseline": labels[0],
        "differences": offered_differences(runs, labels),
        "rows": {
            "shared": len(shared),
            "in_any_run": len(set().union(*done)),
            "sources": sources,
            "scored_sources": [s for s in sources if s in scored],
        },
        "runs": [
            run_entry(
                run,
                label,
                shared,
                set().union(*(d for j, d in enumerate(done) if j != i)) - done[i],
                source_of,
                sources,
                None if run is baseline else baseline,
            )
            for i, (run, label) in enumerate(zip(runs, labels, strict=True))
        ],
    }


def run_entry(
    run: RunRead,
    label: str,
    shared: set[str],
    missing: set[str],
    source_of: dict[str, str],
    sources: list[str],
    baseline: RunRead | None,
) -> dict[str, Any]:
    on_shared = [t for t in run.trajectories if t.prompt_id in shared]
    apart = [t for t in run.trajectories if t.prompt_id not in shared]
    return {
        "label": label,
        "name": run.name,
        "dir": str(run.run_dir),
        "model": run.model,
        "running": str(run.running) if run.running else None,
        "trajectories_in_ledger": len(run.trajectories),
        "bad_ledger_lines": [str(bad) for bad in run.bad_lines],
        "figures": figures(on_shared),
        "by_source": {s: figures([t for t in on_shared if source_of[t.prompt_id] == s]) for s in sources},
        "apart": {
            **counts(apart),
            "missing_prompts": len(missing),
            "missing_prompts_failing": len(missing & run.failing_prompts),
        },
        "paired": None if baseline is None else paired_entry(baseline, run, source_of, sources),
        "failures": run.failures,
    }


def counts(trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    """Prompts, trajectories and the pass rate of trajectories outside the shared prompts."""
    scored = [t for t in trajectories if t.passed is not None]
    passed = sum(bool(t.passed) for t in scored)
    return {
        "prompts": len({t.prompt_id for t in trajectories}),
        "trajectories": len(trajectories),
        "scored": len(scored),
        "passed": passed,
        "pass_rate": _ratio(passed, len(scored)),
    }


def figures(trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    """One run's figures over some of its trajectories."""
    n = len(trajectories)
    found = counts(trajectories)
    scored, passed = found["scored"], found["passed"]
    per_prompt = prompt_scores(trajectories)
    samples = Counter(t.prompt_id for t in trajectories).values()
    interval = wilson(passed, scored)
    costs = [t.cost for t in trajectories if t.cost is not None]
    cost = math.fsum(costs) if costs else None
    durations = [t.duration_s for t in trajectories]
    tool_calls = sum(calls for t in trajectories for _, calls, _ in t.tool_calls)
    tool_errors = sum(failed for t in trajectories for _, _, failed in t.tool_calls)
    at = at_k(list(per_prompt.values())) if max(samples, default=0) > 1 else []
    return {
        **found,
        "samples_per_prompt": {"min": min(samples, default=0), "max": max(samples, default=0)},
        "pass_rate_interval": None if interval is None else [_r(interval[0]), _r(interval[1])],
        "at_k": [
            {"k": a.k, "pass_at_k": _r(a.pass_at_k), "pass_hat_k": _r(a.pass_hat_k), "prompts": a.prompts}
            for a in at
        ],
        "completed": _ratio(sum(t.completed for t in trajectories), n),
        "turns": _mean([t.api_calls for t in trajectories]),
        "tokens": {
            "prompt": _mean([t.prompt_tokens for t in trajectories]),
            "completion": _mean([t.completion_tokens for t in trajectories]),
            "total": _mean([t.prompt_tokens + t.completion_tokens for t in trajectories]),
        },
        "cost": _r(cost),
        "cost_per_trajectory": None if cost is None or not n else _r(cost / n),
        "cost_per_passed": None if cost is None or not passed else _r(cost / passed),
        "latency_s": {
            "mean": _mean(durations),
            "median": _r(percentile(durations, 0.5)),
            "p90": _r(percentile(durations, 0.9)),
            "max": _r(max(durations, default=None)),
        },
        "tool_calls": _ratio(tool_calls, n),
        "tool_error_rate": _ratio(tool_errors, tool_calls),
        "tools": tool_use(trajectories),
        "invalid_tool_calls": _ratio(sum(t.invalid_tool_calls for t in trajectories), n),
        "toolsets_offered": {
            name: _ratio(count, n)
            for name, count in sorted(Counter(s for t in trajectories for s in t.toolsets_offered).items())
        },
    }


def tool_use(trajectories: Sequence[Trajectory]) -> dict[str, dict[str, Any]]:
    calls: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    for t in trajectories:
        for name, count, failed in t.tool_calls:
            calls[name] += count
            errors[name] += failed
    n = len(trajectories)
    return {
        name: {
            "calls": calls[name],
            "errors": errors[name],
            "calls_per_trajectory": _ratio(calls[name], n),
            "error_rate": _ratio(errors[name], calls[name]),
        }
        for name in sorted(calls)
    }


def prompt_scores(trajectories: Sequence[Trajectory]) -> dict[str, tuple[int, int]]:
    """Prompt -> (scored samples, passed samples), for prompts with a scored sample."""
    scores: dict[str, tuple[int, int]] = {}
    for t in trajectories:
        if t.passed is not None:
            n, c = scores.get(t.prompt_id, (0, 0))
            scores[t.prompt_id] = (n + 1, c + t.passed)
    return scores


def paired_entry(
    baseline: RunRead, run: RunRead, source_of: dict[str, str], sources: list[str]
) -> dict[str, Any]:
    """The run against the baseline on the prompts both scored: overall and per source."""
    mine, theirs = prompt_scores(run.trajectories), prompt_scores(baseline.trajectories)
    both = tuple(sorted(set(mine) & set(theirs)))

    @functools.cache
    def difference(prompts: tuple[str, ...]) -> dict[str, Any] | None:
        found = paired([mine[p][1] / mine[p][0] - theirs[p][1] / theirs[p][0] for p in prompts])
        if found is None:
            return None
        return {
            "prompts": found.prompts,
            "difference": _r(found.difference),
            "interval": [_r(found.interval[0]), _r(found.interval[1])],
            "method": found.method,
            "better": found.better,
            "worse": found.worse,
            "same": found.same,
        }

    return {
        **(difference(both) or {"prompts": 0, "difference": None}),
        "by_source": {s: difference(tuple(p for p in both if source_of[p] == s)) for s in sources},
    }


def offered_differences(runs: Sequence[RunRead], labels: Sequence[str]) -> list[dict[str, Any]]:
    """What the runs offered the model that is not the same in all of them: settings saved in
    ``run.json``, the definition of the distribution used, the tools and their schemas, the
    toolsets drawn. Runs without a saved configuration are left out of the settings."""
    found: list[dict[str, Any]] = []

    def note(what: str, values: Sequence[Any], named: Sequence[str] = labels) -> None:
        if any(v != values[0] for v in values[1:]):
            found.append({"what": what, "values": dict(zip(named, values, strict=True))})

    configs = [(run.config, label) for run, label in zip(runs, labels, strict=True) if run.config]
    named = [label for _, label in configs]
    if len(configs) > 1:
        for key in sorted(set().union(*(config for config, _ in configs)) - NOT_OFFERED):
            note(key, [config.get(key) for config, _ in configs], named)
        used = [(config.get("distributions") or {}).get(config.get("distribution")) for config, _ in configs]
        note("distribution definition", used, named)
    note("tools offered", [sorted(run.tool_schemas) for run in runs])
    for tool in sorted(set.intersection(*(set(run.tool_schemas) for run in runs))):
        note(f"tool schema: {tool}", [run.tool_schemas[tool] for run in runs])
    note(
        "toolsets drawn", [sorted({s for t in run.trajectories for s in t.toolsets_offered}) for run in runs]
    )
    return found


def run_labels(runs: Sequence[RunRead], given: Sequence[Path]) -> list[str]:
    """Each run's name, or the directory as given where two runs share a name."""
    names = Counter(run.name for run in runs)
    return [run.name if names[run.name] == 1 else str(path) for run, path in zip(runs, given, strict=True)]


def _mean(values: Sequence[float]) -> float | None:
    return _r(statistics.fmean(values)) if values else None


def _ratio(part: float, whole: float) -> float | None:
    return _r(part / whole) if whole else None


def _r(value: float | None) -> float | None:
    """Twelve significant digits: no float noise (0.30000000000000004) in the JSON, tiny costs kept."""
    return None if value is None else float(f"{value:.12g}")
