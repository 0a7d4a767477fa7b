"""Failures that end a row for good: no attempt can succeed with the run's settings.

A conversation that outgrows the model's context is one: the same prompt, model and settings grow
it the same way. Such a failure is written to ``failures.jsonl`` with ``"permanent": true`` and
the key of the settings that shape a session (:func:`settings_key`). Its row is then neither
pending nor done: it is *failed for good*. A later invocation does not run it again, unless one
of those settings has changed since (another model, a larger ``max_tokens``...), when the row may
fit and runs like any pending one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from trajkit.jsonutil import dumps_line

if TYPE_CHECKING:
    from trajkit.config.run_config import RunConfig
    from trajkit.run.rundir import RunDir

SHOWN_ROWS = 20
"""Rows failed for good that ``status`` and ``stats`` list one by one; the rest are counted."""


def settings_key(config: RunConfig) -> str:
    """A digest of the settings that shape what a session produces (:meth:`RunConfig.watched`)."""
    saved = config.manifest()
    watched = {key: saved.get(key) for key in sorted(config.watched())}
    return hashlib.sha256(dumps_line(watched)).hexdigest()[:16]


def failed_for_good(
    run_dir: RunDir, done: Collection[str] = (), settings: str | None = None
) -> dict[str, dict[str, Any]]:
    """Work id -> the ``failures.jsonl`` entry that ended it for good, for rows not in ``done``.

    A work item counts when its last failure is permanent and, given ``settings`` (the current
    :func:`settings_key`), happened under those same settings; without it (a reader that has no
    configuration, such as ``trajkit status``) every such last failure counts.
    """
    last: dict[str, dict[str, Any]] = {}
    for entry in run_dir.failures():
        work_id = entry.get("work_id")
        if isinstance(work_id, str):
            last[work_id] = entry
    return {
        work_id: entry
        for work_id, entry in last.items()
        if entry.get("permanent")
        and work_id not in done
        and (settings is None or entry.get("settings_key") == settings)
    }


def describe(entries: dict[str, dict[str, Any]], limit: int = SHOWN_ROWS) -> list[str]:
    """One line per row failed for good (``prompt N (class): message``), by prompt, at most ``limit``."""
    ordered = sorted(entries.values(), key=lambda e: (e.get("prompt_index", 0), e.get("work_id", "")))
    lines = [
        f"prompt {e.get('prompt_index')} ({e.get('error_class', 'unknown')}): {str(e.get('message', ''))[:300]}"
        for e in ordered[:limit]
    ]
    if len(ordered) > limit:
        lines.append(f"... and {len(ordered) - limit} more (failures.jsonl has them all)")
    return lines
