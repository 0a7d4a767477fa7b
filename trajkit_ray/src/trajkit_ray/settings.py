"""The ``ray`` executor's settings (``--ray_address``, ``--ray.KEY``, ``[executor_options.ray]``)."""

from __future__ import annotations

from pydantic import Field

from trajkit.config.settings import StrictSettings


class RaySettings(StrictSettings):
    address: str | None = Field(None, json_schema_extra={"flag": "ray_address"})
    """The Ray cluster to join (auto, HOST:6379 or ray://HOST:10001); none: start a Ray of this
    machine alone, which gives the run all its cores."""
    actors_per_node: int | None = Field(None, ge=1)
    """Session actors on each node; none: one per CPU the node offers Ray (none on a node that
    offers no CPU, such as a head node started with --num-cpus 0)."""
    local_cpus: int | None = Field(None, ge=1)
    """CPUs of the Ray started when no address is given; none: all of this machine's."""
    batch_wait: float = Field(0.02, ge=0)
    """Seconds an actor keeps results back once one is ready, so they travel to the driver together."""
    poll_interval: float = Field(1.0, gt=0)
    """Seconds an actor with nothing to report answers the driver anyway (then given new work)."""
    lost_permits_after: float = Field(60.0, ge=0)
    """Seconds after a session actor is lost before the request permits it held count as free
    again (its process may finish the requests it had sent; its own releases free them sooner)."""
