"""The docker backend's settings (``--sandbox_option docker.KEY=VALUE``, ``[sandbox_options.docker]``).

Values arrive as text from the command line or typed from a configuration file; a typo or a bad
value stops the run before any model call rather than surfacing as an engine error in the middle of
it. Safe by default: no network, 4 GiB of memory (swap included) and 1024 processes per container.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, ConfigDict, Field

from trajkit.sandbox import ByteLimit, CountLimit, lowered
from trajkit.settings import StrictSettings


class DockerSettings(StrictSettings):
    """One container per prompt: its network, limits and how images are pulled."""

    model_config = ConfigDict(str_strip_whitespace=True)

    network: Annotated[Literal["none", "host", "bridge"], BeforeValidator(lowered)] = Field(
        "none",
        description="none: loopback only; host: the host's network; bridge: the engine's default network",
    )
    cpus: float | None = Field(None, gt=0, description="CPU share of a container, e.g. 1.5; unset: no limit")
    memory: ByteLimit = Field(
        4 * 1024**3,
        gt=0,
        description="memory a container may use, swap included, e.g. 512m or 2g (default 4g); none lifts it",
    )
    pids_limit: CountLimit = Field(
        1024,
        gt=0,
        description="processes a container may hold at once, so a fork bomb fills its own container "
        "and not the machine; none lifts it",
    )
    pull: Annotated[Literal["missing", "always", "never"], BeforeValidator(lowered)] = Field(
        "missing",
        description="missing: pull images not present locally; always: pull every image (a local copy "
        "if the pull fails); never: local images only",
    )
    pull_timeout: float = Field(
        600.0, gt=0, description="seconds one pull may take before the image counts as unavailable"
    )
