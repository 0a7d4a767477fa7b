"""The docker backend's settings (``--sandbox_option docker.KEY=VALUE``, ``[sandbox_options.docker]``).

Values arrive as text from the command line or typed from a configuration file; a typo or a bad
value stops the run before any model call rather than surfacing as an engine error in the middle of
it. Safe by default: no network, 4 GiB of memory (swap included) and 1024 processes per container,
and nothing in it keeps a privilege: no capability, ``no-new-privileges``, a non-root user.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field

from trajkit.config.settings import StrictSettings
from trajkit.sandbox import ByteLimit, CountLimit, lowered

DEFAULT_USER = "1000:1000"
"""Who commands run as when the image names no user but root (``user=auto``)."""
KEEPER_USER = "65534:65534"
"""Who the container's first process (which only waits) runs as, unless ``user=image``: another
user than the commands', so that they can neither signal nor read it."""
BRIDGE_USER = "65533:65533"
"""Who a program bridged to the runner runs as (a browser driven over its DevTools pipe, see
:meth:`~trajkit_docker.sandbox.DockerSandbox.bridge`): a user of its own, so that the commands can
neither read nor write its pipe to the runner, nor signal or trace it."""
_USER = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.-]*(:[A-Za-z0-9_.][A-Za-z0-9_.-]*)?$")


def user_choice(value: str) -> str:
    if value.lower() in ("auto", "image"):
        return value.lower()
    if not _USER.match(value):
        raise ValueError(f"{value!r} is no user: expected auto, image, or USER[:GROUP] (names or numbers)")
    return value


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
    user: Annotated[str, AfterValidator(user_choice)] = Field(
        "auto",
        description=f"who commands run as: auto (the image's own user when it names one other than "
        f"root, else {DEFAULT_USER}, with the working directory handed to that user); image (the "
        f"image's own user, root for most images: the explicit opt-out); or USER[:GROUP]. Whoever "
        f"it is, commands keep no capability and cannot gain one (no-new-privileges)",
    )
    pull: Annotated[Literal["missing", "always", "never"], BeforeValidator(lowered)] = Field(
        "missing",
        description="missing: pull images not present locally; always: pull every image (a local copy "
        "if the pull fails); never: local images only",
    )
    pull_timeout: float = Field(
        600.0, gt=0, description="seconds one pull may take before the image counts as unavailable"
    )
