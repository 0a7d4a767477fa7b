"""One run directory read for ``trajkit compare``: every finished trajectory in its ledger.

The ledger is the truth and is written as each prompt finishes, so a run that is still going (or
was killed) compares with what it has so far; nothing here needs ``statistics.json`` or the merged
``trajectories.jsonl``. Filters do not matter to an evaluation: rejected trajectories count like
kept ones. Only what the figures need is kept of each record, so memory holds a few numbers per
trajectory, never the conversations.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from trajkit.run.files import RunIOError
from trajkit.run.finalize import NO_SOURCE, failure_summary
from trajkit.run.ledger import BadLine, records, scan
from trajkit.run.lock import Holder
from trajkit.run.rundir import RunDir
from trajkit.tools.catalog import tool_schemas_key


@dataclass(frozen=True, slots=True)
class Trajectory:
    """What ``compare`` needs of one finished trajectory."""

    prompt_id: str
    source: str
    passed: bool | None
    """None: the row has no check."""
    api_calls: int
    prompt_tokens: int
    completion_tokens: int
    cost: float | None
    duration_s: float
    tool_calls: tuple[tuple[str, int, int], ...]
    """(tool, calls, failed calls) for every tool the trajectory called."""
    invalid_tool_calls: int
    toolsets_offered: tuple[str, ...]
    completed: bool

    @classmethod
    def of(cls, record: Mapping[str, Any]) -> Trajectory:
        usage = record["usage"]
        score = record.get("score")
        source = record["metadata"].get("source")
        cost = usage.get("cost")
        return cls(
            # interned: a prompt's samples (and runs of one suite) share one string
            prompt_id=sys.intern(record["prompt_id"]),
            source=sys.intern(NO_SOURCE if source is None else str(source)),
            passed=bool(score["passed"]) if isinstance(score, dict) else None,
            api_calls=record["api_calls"],
            prompt_tokens=usage["prompt_tokens"],
            completion_tokens=usage["completion_tokens"],
            cost=float(cost) if isinstance(cost, int | float) else None,
            duration_s=float(record["duration_s"]),
            tool_calls=tuple(
                (sys.intern(name), int(stat.get("count", 0)), int(stat.get("failure", 0)))
                for name, stat in sorted(record["tool_stats"].items())
                if stat.get("count")
            ),
            invalid_tool_calls=int(record.get("invalid_tool_calls") or 0),
            toolsets_offered=tuple(
                sys.intern(name) for name in record.get("toolsets_offered", record.get("toolsets_used") or ())
            ),
            completed=bool(record["completed"]),
        )


@dataclass(frozen=True)
class RunRead:
    """A run directory as ``compare`` sees it."""

    run_dir: Path
    name: str
    config: dict[str, Any]
    running: Holder | None
    trajectories: list[Trajectory]
    failing_prompts: frozenset[str]
    """Prompts with failed attempts and no finished trajectory."""
    failures: dict[str, Any]
    """Failed attempts by error class, and the work items still failing by the class of their last
    failure (:func:`trajkit.run.finalize.failure_summary`)."""
    tool_schemas: dict[str, str]
    """Tool name -> the key of the schema the model was offered for it (``tools.json``)."""
    bad_lines: list[BadLine]

    @property
    def model(self) -> str | None:
        model = self.config.get("model")
        return None if model is None else str(model)


def read_run(path: Path) -> RunRead:
    """Read one run directory; a usage error (click) naming it when it holds no run."""
    run_dir = RunDir(path)
    try:
        if not run_dir.holds_a_run():
            raise click.ClickException(
                f"{run_dir}: not a trajkit run directory (no batch_*.jsonl ledger and no "
                f"{run_dir.failures_path.name})"
            )
        index = scan(run_dir)
        trajectories = [Trajectory.of(record) for record in records(index)]
        failed = list(run_dir.failures())
        manifest = run_dir.run_json("comparing the run without it", required={}) or {}
        schemas = run_dir.tool_schemas()
        running = run_dir.holder()
    except RunIOError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(str(RunIOError.of(exc, path))) from None
    done = {t.prompt_id for t in trajectories}
    unfinished = {str(e.get("work_id")) for e in failed if e.get("work_id") not in index.records}
    config = manifest.get("config")
    return RunRead(
        run_dir=path,
        name=str(manifest.get("run_name") or run_dir.name),
        config=config if isinstance(config, dict) else {},
        running=running,
        trajectories=trajectories,
        failing_prompts=frozenset(e["prompt_id"] for e in failed if isinstance(e.get("prompt_id"), str))
        - done,
        failures=failure_summary(run_dir, unfinished),
        tool_schemas=schemas_by_tool(schemas.values()),
        bad_lines=index.bad,
    )


def schemas_by_tool(sets: Iterable[list[dict[str, Any]]]) -> dict[str, str]:
    """Tool name -> the key of its schema, over every schema set a run offered (a tool whose schema
    changed between invocations keeps the keys of both, joined)."""
    keys: dict[str, set[str]] = {}
    for schemas in sets:
        for schema in schemas:
            keys.setdefault(schema["function"]["name"], set()).add(tool_schemas_key([schema]))
    return {name: "+".join(sorted(found)) for name, found in sorted(keys.items())}
