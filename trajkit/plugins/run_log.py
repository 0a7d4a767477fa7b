"""What a run says in its log as it goes: a plugin of the run's lifecycle hooks, as a third-party
observer (a metrics exporter, a notifier) would be.

- at the start, how much work this invocation attempts;
- with ``--verbose``, each finished trajectory and why a filter rejected it;
- at the end, when the filters rejected every trajectory, which did and the command that merges
  the run again without them (the outputs are empty, which is easy to miss in a long log).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from trajkit import hookimpl

if TYPE_CHECKING:
    from trajkit.hookspecs import RunInfo
    from trajkit.record.filters import Record

log = logging.getLogger("trajkit")


@hookimpl
def trajkit_run_start(run: RunInfo, pending: int) -> None:
    log.info("%s: %d sessions to run", run.run_name, pending)


@hookimpl
def trajkit_trajectory_finished(run: RunInfo, record: Record, rejection: str | None) -> None:
    if run.config.verbose:
        log.info(
            "finished %s (prompt %d)%s",
            record["work_id"],
            record["prompt_index"],
            f": {rejection}" if rejection else "",
        )


@hookimpl
def trajkit_run_end(run: RunInfo, statistics: Mapping[str, Any]) -> None:
    if not statistics["trajectories"] or statistics["kept"]:
        return
    from trajkit.run.settings import resume_command

    filters = sorted(statistics["rejected_by_filter"])
    disable = [part for name in filters for part in ("--no_filter", name)]
    log.warning(
        "every trajectory was rejected (by %s): the outputs are empty; to merge again without %s: %s",
        ", ".join(filters),
        "it" if len(filters) == 1 else "them",
        resume_command(run.config, *disable, "--allow_change", "disabled_filters"),
    )
