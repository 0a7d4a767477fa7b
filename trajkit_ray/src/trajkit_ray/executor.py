"""The ``ray`` executor: a run's sessions in async Ray actors across a cluster's nodes.

- **Where sessions run.** Each node that offers Ray CPUs gets one session actor per CPU
  (``--ray.actors_per_node``), pinned to it; ``--num_workers`` is the number of sessions in flight
  in the whole run, shared out among the actors. Each actor builds the session function
  (:class:`trajkit.run.attempt.Sessions`) from the pickled plan with the plugins installed on its
  node, so the sandbox backends, their reaping and the image checks are that node's, done before
  any of its sessions spends a token.
- **Streaming.** The driver keeps one :meth:`~trajkit_ray.worker.SessionWorker.exchange` call
  open per actor: it carries new work to the actor and comes back with every event (an attempt
  started, a record, a failure) since the last one, in one message. No ``ray.wait`` loop.
- **Exactly once.** Actor calls are at most once (no restarts, no retries). When an actor or its
  node is lost, every work item it held that has not ended goes back to the front of the queue
  and runs on another actor; its lost attempt is reported as a ``node_lost`` failure (not
  final). A record is final once the driver has it; the runner, the ledger's only writer,
  ignores any second outcome for a work id.
- **Run-wide limits.** ``--max_cost`` is the runner's ``may_start`` before each item leaves the
  driver (asked again after each exchange while the budget cannot take more yet), with
  :meth:`spent` summed over the actors and handed to the runner (``driver.paid``) as each
  exchange brings it; the model client's request limits are kept
  by one limiter actor (:mod:`trajkit_ray.limiter`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trajkit.run.executor import (
    Driver,
    Executor,
    Failed,
    SessionPlan,
    WorkOrder,
    combined_statistics,
    hand_back,
)
from trajkit_ray.settings import RaySettings

if TYPE_CHECKING:
    from trajkit.manager import PluginHost

log = logging.getLogger("trajkit")

CLOSE_TIMEOUT = 120.0
HEAD_RESOURCE = "node:__internal_head__"


@dataclass(eq=False)
class _Actor:
    """The driver's view of one session actor."""

    handle: Any
    holder: str
    node: str
    capacity: int = 0
    alive: bool = True
    outstanding: dict[str, WorkOrder] = field(default_factory=dict)
    """Work sent to it that has not ended, by work id."""
    attempts: dict[str, int] = field(default_factory=dict)
    """The attempt each of those is at, once started."""
    statistics: dict[str, Any] = field(default_factory=dict)
    spent: float = 0.0


class RayExecutor(Executor):
    name = "ray"
    description = (
        "sessions in async Ray actors over a cluster's nodes (--ray_address), or over this machine's cores"
    )
    Settings = RaySettings
    settings: RaySettings

    def __init__(self, settings: Any = None) -> None:
        super().__init__(settings)
        self.actors: list[_Actor] = []
        self.limiter: Any = None
        self.connected = False
        self.queue: deque[WorkOrder] = deque()
        self.driver: Driver | None = None
        self.began: set[str] = set()
        """Work sent to an actor since it was last admitted whose first attempt has started."""

    # -- start -------------------------------------------------------------------------------------

    async def start(self, plan: SessionPlan, host: PluginHost) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from trajkit.model.shared_limiter import SharedLimiter

        self._connect()  # in the main thread: Ray sets its signal handlers there
        nodes = [node for node in ray.nodes() if node.get("Alive")]
        # The limiter lives on the head node (the cluster's one node it cannot lose anyway).
        head = next(
            (n["NodeID"] for n in nodes if HEAD_RESOURCE in n.get("Resources", {})),
            ray.get_runtime_context().get_node_id(),
        )
        self.limiter = (
            ray.remote(SharedLimiter)
            .options(
                num_cpus=0,
                max_concurrency=100_000,
                scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=False),
            )
            .remote()
        )
        self._place_actors(nodes)
        live = await self._open_actors(plan)
        share = math.ceil(plan.config.num_workers / len(live))
        for actor in live:
            actor.capacity = max(1, share)
        log.info(
            "ray: %d session actors on %d nodes, up to %d sessions each",
            len(live),
            len({actor.node for actor in live}),
            share,
        )

    def _place_actors(self, nodes: list[dict[str, Any]]) -> None:
        """One session actor per CPU of every node that offers CPUs (or ``actors_per_node``)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from trajkit_ray.worker import SessionWorker

        worker = ray.remote(SessionWorker)
        for node in nodes:
            cpus = int(node.get("Resources", {}).get("CPU", 0))
            if cpus < 1:
                continue
            node_id = node["NodeID"]
            for number in range(self.settings.actors_per_node or cpus):
                holder = f"{node_id[:12]}/{number}"
                handle = worker.options(
                    num_cpus=0,
                    max_restarts=0,
                    max_task_retries=0,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                ).remote(holder)
                self.actors.append(_Actor(handle, holder, node.get("NodeManagerHostname", node_id)))
        if not self.actors:
            raise RuntimeError("ray: no node of the cluster offers a CPU to run sessions on")

    async def _open_actors(self, plan: SessionPlan) -> list[_Actor]:
        """Each actor builds its sessions from the plan (its node's plugins, backends, images);
        returns the actors that could, or raises the first error a session would have met."""
        import ray

        # the model client's key variables, so that it finds its key on every node
        environment = {name: os.environ[name] for name in plan.key_variables if os.environ.get(name)}
        opened = await asyncio.gather(
            *(self._call(actor.handle.open.remote(plan, self.limiter, environment)) for actor in self.actors),
            return_exceptions=True,
        )
        for actor, result in zip(self.actors, opened, strict=True):
            if isinstance(result, ray.exceptions.RayActorError):
                log.warning("ray: the session actor %s could not start: %s", actor.holder, result)
                actor.alive = False
            elif isinstance(result, BaseException):
                # the model client's check, a backend, ...: the run stops before any session, with
                # the error as the local executor gives it (not Ray's wrapper and its traceback)
                cause = result.cause if isinstance(result, ray.exceptions.RayTaskError) else None
                raise (cause if isinstance(cause, BaseException) else result) from None
        live = [actor for actor in self.actors if actor.alive]
        if not live:
            raise RuntimeError("ray: no session actor could start")
        return live

    def _connect(self) -> None:
        import ray

        if ray.is_initialized():
            return  # the caller's Ray: left as it is at the end
        address = self.settings.address
        if address is None:
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            ray.init(
                address="local",
                num_cpus=self.settings.local_cpus,
                include_dashboard=False,
                logging_level=logging.WARNING,
            )
        else:
            ray.init(address=address, logging_level=logging.WARNING)
        self.connected = True

    @staticmethod
    async def _call(ref: Any) -> Any:
        return await ref

    # -- execute -----------------------------------------------------------------------------------

    async def execute(self, work: Sequence[WorkOrder], driver: Driver) -> None:
        self.queue = deque(work)
        self.driver = driver
        loops = [asyncio.create_task(self._drive(actor)) for actor in self.actors if actor.alive]
        try:
            for result in await asyncio.gather(*loops, return_exceptions=True):
                if isinstance(result, Exception):
                    log.error("ray: a driver loop stopped: %s: %s", type(result).__name__, result)
        finally:  # cancelled (the run was interrupted): so are the sessions, their sandboxes closed
            for loop in loops:
                loop.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            await self._stop_sessions()
        if self.queue and not driver.stopped():
            log.error("ray: every session actor is lost; %d work items were not run", len(self.queue))

    async def _drive(self, actor: _Actor) -> None:
        """Keep one actor busy: send it work, take back what happened, until nothing is left."""
        import ray

        driver = self.driver
        assert driver is not None
        settings = self.settings
        while True:
            orders: list[WorkOrder] = []
            while len(actor.outstanding) < actor.capacity and self.queue and driver.may_start():
                order = self.queue.popleft()
                actor.outstanding[order.work_id] = order
                orders.append(order)
            if not actor.outstanding:
                idle = not any(other.outstanding for other in self.actors if other.alive)
                if idle and (not self.queue or driver.stopped()):
                    return  # nothing can come back to the queue any more
                await asyncio.sleep(settings.poll_interval)  # a lost actor's work may come back
                continue
            try:
                events, statistics, spent = await actor.handle.exchange.remote(
                    orders, settings.poll_interval, settings.batch_wait
                )
            except Exception as exc:
                if not isinstance(exc, ray.exceptions.RayActorError):
                    log.error("ray: session actor %s failed: %s: %s", actor.holder, type(exc).__name__, exc)
                self._lost(actor, exc)
                return
            if (statistics, spent) != (actor.statistics, actor.spent):
                actor.statistics, actor.spent = statistics, spent
                driver.paid()  # saved by the runner at once: a killed driver loses no more than this
            for event in events:
                if isinstance(event, tuple):
                    work_id, attempt = event
                    actor.attempts[work_id] = attempt
                    self.began.add(work_id)
                    driver.started(work_id, attempt)
                    continue
                actor.attempts.pop(event.work_id, None)
                if not isinstance(event, Failed) or event.final:
                    actor.outstanding.pop(event.work_id, None)
                driver.report(event)

    def _lost(self, actor: _Actor, error: BaseException) -> None:
        """An actor (or its node) is gone: what it held runs again on the others."""
        import ray

        assert self.driver is not None
        actor.alive = False
        with contextlib.suppress(Exception):
            ray.kill(actor.handle, no_restart=True)  # at most once: if it still runs, it runs no more
        if self.limiter is not None:
            self.limiter.forget.remote(actor.holder, self.settings.lost_permits_after)
        lost = list(actor.outstanding.values())
        message = f"the Ray actor {actor.holder} on {actor.node} was lost ({type(error).__name__}); run again"
        hand_back(self.driver, lost, actor.attempts, self.began, ("node_lost", message))
        actor.outstanding.clear()
        self.queue.extendleft(reversed(lost))
        log.warning(
            "ray: session actor %s on %s lost: %d work items go to the other actors (%s)",
            actor.holder,
            actor.node,
            len(lost),
            error,
        )

    async def _stop_sessions(self) -> None:
        """Cancel what still runs on the actors (their sandboxes closed); nothing does after a
        normal end. A lost actor's answer is not waited for beyond the close timeout."""
        stops = [asyncio.ensure_future(self._call(a.handle.stop.remote())) for a in self.actors if a.alive]
        if stops:
            _, waiting = await asyncio.wait(stops, timeout=CLOSE_TIMEOUT)
            for task in stops:
                if task in waiting:
                    task.cancel()
                elif task.exception() is not None:
                    log.warning("ray: stopping sessions: %s", task.exception())

    # -- accounts ----------------------------------------------------------------------------------

    def statistics(self) -> dict[str, Any]:
        return combined_statistics(actor.statistics for actor in self.actors)

    def spent(self) -> float:
        return sum(actor.spent for actor in self.actors)

    # -- close -------------------------------------------------------------------------------------

    async def aclose(self) -> None:
        if not self.actors and not self.connected:
            return
        import ray

        live = [actor for actor in self.actors if actor.alive]
        closing = [asyncio.ensure_future(self._call(actor.handle.close.remote())) for actor in live]
        if closing:
            _, waiting = await asyncio.wait(closing, timeout=CLOSE_TIMEOUT)
            for actor, task in zip(live, closing, strict=True):
                if task in waiting:
                    task.cancel()
                    log.warning("ray: session actor %s did not close in time", actor.holder)
                elif task.exception() is not None:
                    log.warning("ray: session actor %s closed with %s", actor.holder, task.exception())
        for handle in [actor.handle for actor in self.actors] + [self.limiter]:
            if handle is not None:
                with contextlib.suppress(Exception):
                    ray.kill(handle, no_restart=True)
        self.actors.clear()
        if self.connected:
            await asyncio.to_thread(ray.shutdown)
            self.connected = False
