"""Executors: where a run's sessions run. The contract between the runner and an executor plugin.

The runner plans the work (:mod:`trajkit.run.plan`), hands it to the executor chosen with
``--executor``, and records what comes back (:mod:`trajkit.run.recording`). Everything that crosses
between the two is plain, picklable data, so an executor may run sessions in other processes or on
other machines: :class:`SessionPlan` (how to build the session function anywhere), a
:class:`WorkOrder` per pending work item, and a :class:`Finished` or :class:`Failed` outcome per
attempt.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from trajkit.config.settings import Configurable, StrictSettings

if TYPE_CHECKING:
    from trajkit.config.run_config import RunConfig
    from trajkit.manager import PluginHost
    from trajkit.run.dataset import WorkItem
    from trajkit.tools.distributions import Distribution


@dataclass(frozen=True)
class SessionPlan:
    """Everything besides the installed plugins that running this run's sessions takes.

    With :func:`trajkit.manager.load_plugins` on the node that runs them, this is enough to build
    the session function there (:class:`trajkit.run.attempt.Sessions`): the model client from the
    configuration, the backends, the tools of the distribution's toolsets.
    """

    config: RunConfig
    run_id: str
    """Labels the run's sandboxes, so a backend can reap what this invocation left behind."""
    distribution: Distribution
    run_tools: tuple[str, ...]
    """Every tool of the distribution, sorted: the columns of every record's ``tool_stats``."""
    backends: tuple[str, ...]
    """The sandbox backends the pending work routes to."""
    images: tuple[tuple[str, str], ...]
    """(backend, image) pairs of the pending work, to verify before any model call is spent."""
    key_variables: tuple[str, ...] = ()
    """The environment variables the run's model client reads its key from
    (:attr:`trajkit.model.ModelClient.key_variables`): an executor whose sessions run in other
    processes hands over those that are set, never the plan (which is saved and logged) their values."""


@dataclass(frozen=True, slots=True)
class WorkOrder:
    """One pending work item and the backend its row is routed to."""

    item: WorkItem
    backend: str

    @property
    def work_id(self) -> str:
        return self.item.work_id


@dataclass(frozen=True, slots=True)
class Finished:
    """A session that produced a record (not yet scrubbed of secrets, not yet in the ledger)."""

    work_id: str
    record: dict[str, Any]
    tool_schemas: Mapping[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Tool schema sets (key -> schemas, see :func:`trajkit.tools.catalog.tool_schemas_key`) that the
    record's ``tool_schemas_key`` names and that were not handed back before by this executor;
    sending a set more than once is allowed."""


@dataclass(frozen=True, slots=True)
class Failed:
    """One failed attempt of a work item."""

    work_id: str
    attempt: int
    error_class: str
    message: str
    final: bool
    """No further attempt of this work item is made in this invocation."""
    stops_run: bool = False
    """The failure would fail every session (refused credentials...): no new session may start."""
    permanent: bool = False
    """No attempt of this work item can succeed with the run's settings (its conversation outgrows
    the model's context): a later invocation does not run it again unless those settings change.
    Implies ``final``."""


Outcome = Finished | Failed

SHARED_LIMITER_STATISTICS = frozenset({"throttled", "throttle_recovered"})
"""Counters of a run-wide limiter (:mod:`trajkit.model.shared_limiter`) that every process reports
in full: the largest counts, not the sum."""


def combined_statistics(parts: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The model client counters of several processes (``ModelClient.statistics``) as one: numbers
    summed (but :data:`SHARED_LIMITER_STATISTICS`), anything else as the last part has it."""
    total: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            if not isinstance(value, int | float) or isinstance(value, bool):
                total[key] = value
            elif key in SHARED_LIMITER_STATISTICS:
                total[key] = max(total.get(key, 0), value)
            else:
                total[key] = total.get(key, 0) + value
    if "limiter_wait_s" in total:
        total["limiter_wait_s"] = round(total["limiter_wait_s"], 3)
    return total


class Attempts(Protocol):
    """Where the attempts of work items are reported (what :meth:`trajkit.run.attempt.Sessions.run`
    needs of a :class:`Driver`)."""

    def started(self, work_id: str, attempt: int) -> None:
        """An attempt of a work item has started (for the progress display and the budget)."""

    def report(self, outcome: Outcome) -> None:
        """An attempt has ended: the runner records it (ledger, ``failures.jsonl``, counters)."""


class Driver(Attempts, Protocol):
    """What the runner offers an executor, called on the runner's event loop."""

    def may_start(self) -> bool:
        """Whether one more work item may start now; True admits it (start it). False while the
        budget cannot take another session yet (``--max_cost``: it may be True again once an
        answer arrives or a session ends), and for good once :meth:`stopped`."""

    async def admit(self) -> bool:
        """Wait until one more work item may start (True: start it), or the run stops admitting
        any (False). For executors that can wait; others call :meth:`may_start` again later."""

    def withdraw(self) -> None:
        """A work item admitted by :meth:`may_start` will not start after all (it goes back to be
        admitted again: an actor was lost before it started it)."""

    def stopped(self) -> bool:
        """No new work item will be admitted any more (``--max_cost`` reached, a disk error, a
        failure that stops the run): start no more, finish those in flight."""

    def paid(self) -> None:
        """:meth:`Executor.statistics` has grown (a model answer arrived): the runner saves what
        was spent at once. Call it as soon as the executor learns of an answer."""


def hand_back(
    driver: Driver,
    lost: Sequence[WorkOrder],
    attempts: dict[str, int],
    began: set[str],
    failure: tuple[str, str],
) -> None:
    """The work a lost holder (a worker process, a Ray actor) had, made ready to run elsewhere: each
    attempt in flight is reported as ``failure`` (error class, message; not final), each order
    admitted but never started is withdrawn. ``attempts`` (work id -> attempt in flight) and
    ``began`` (work ids whose first attempt started since admitted) lose the lost orders."""
    error_class, message = failure
    for order in lost:
        attempt = attempts.pop(order.work_id, None)
        if attempt is not None:
            driver.report(Failed(order.work_id, attempt, error_class, message, final=False))
        elif order.work_id not in began:
            driver.withdraw()  # admitted, never started: admitted again from the queue
        began.discard(order.work_id)


class Executor(Configurable, ABC):
    """Runs the run's sessions somewhere and hands back what each attempt produced.

    The runner calls, in this order and on its event loop:

    1. :meth:`start` with the :class:`SessionPlan`: build what runs the sessions (where they run:
       this process, worker processes, other machines); check the model client (``check()``),
       start the backends the plan names, verify its images. An error here stops the run before
       any session starts.
    2. :meth:`execute` with the pending :class:`WorkOrder` s and a :class:`Driver`. Before starting
       a work item, be admitted (``await driver.admit()``, or ``driver.may_start()`` asked again
       until ``driver.stopped()``); report each attempt's start with ``driver.started`` and its
       end with ``driver.report`` (a :class:`Finished` record or a :class:`Failed` attempt), and
       each growth of the model's spend with ``driver.paid()`` as soon as it is known. Retrying a work item within the invocation (up to
       ``config.max_attempts``, with ``config.retry_backoff``) is the executor's, and each failed
       attempt is reported. Return once every work order has ended or may not start. The task
       running :meth:`execute` is cancelled when the run is interrupted (SIGINT/SIGTERM): stop
       the sessions in flight, closing their sandboxes, and return or raise ``CancelledError``.
       (It is cancelled too when ``--max_cost_policy stop`` ends the sessions in flight.)
    3. :meth:`statistics` and :meth:`spent` at any time: what the model answers received so far
       have cost, summed over everywhere sessions run (``--max_cost`` holds to it, ``run.json``
       keeps it).
    4. :meth:`aclose`, always, even when :meth:`start` failed: release everything, reap sandboxes.

    An executor never touches the run directory: the runner is the ledger's only writer, and it
    scrubs secrets from records and failures. Work orders, plans and outcomes are plain data
    that pickle, so an executor may ship them anywhere; the session function is built where it
    runs, from the plan and the plugins installed there (:class:`trajkit.run.attempt.Sessions`).
    """

    name: ClassVar[str]
    description: ClassVar[str] = ""
    Settings: ClassVar[type[StrictSettings]] = StrictSettings
    """The executor's settings (``--executor_option NAME.KEY=VALUE``, ``--NAME.KEY``, the
    configuration file's ``[executor_options.NAME]``); none by default."""

    @abstractmethod
    async def start(self, plan: SessionPlan, host: PluginHost) -> None:
        """Build where sessions run; ``host`` is this process's plugins (a remote node loads its own)."""

    @abstractmethod
    async def execute(self, work: Sequence[WorkOrder], driver: Driver) -> None:
        """Run every work order, reporting each attempt through ``driver``."""

    def statistics(self) -> dict[str, Any]:
        """The model client counters so far (``ModelClient.statistics``), summed; empty by default."""
        return {}

    def spent(self) -> float:
        """What the model answers received so far have cost (``ModelClient.spent``), summed."""
        return 0.0

    async def aclose(self) -> None:
        """Release what :meth:`start` built; called once, after :meth:`execute` or a failed start."""
