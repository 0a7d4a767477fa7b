"""The modal backend's settings (``--sandbox_option modal.KEY=VALUE``, ``[sandbox_options.modal]``).

Values arrive as text from the command line or typed from a configuration file; a typo or a bad
value stops the run before any model call. Credentials are no setting: they come only from Modal's
own configuration (``MODAL_TOKEN_ID``/``MODAL_TOKEN_SECRET`` or ``~/.modal.toml``).
"""

from __future__ import annotations

from pydantic import Field

from trajkit.config.settings import StrictSettings


class ModalSettings(StrictSettings):
    """One Modal Sandbox per prompt, in one Modal app per run; creations paced across the run."""

    app: str = Field(
        "trajkit", min_length=1, description="Modal app the sandboxes belong to (created if missing)"
    )
    environment: str | None = Field(None, description="Modal environment; unset: Modal's configured one")
    cpu: float | None = Field(
        None, gt=0, description="cores requested for each sandbox; unset: Modal's default"
    )
    memory: int | None = Field(
        None, gt=0, description="MiB requested for each sandbox; unset: Modal's default"
    )
    block_network: bool = Field(True, description="true: sandboxes are cut off from the network")
    registry_secret: str | None = Field(
        None, description="name of a Modal Secret holding credentials for a private image registry"
    )
    create_rate: float = Field(4.0, gt=0, description="sandbox creations per second, across the whole run")
    create_burst: float | None = Field(
        None, ge=1, description="how many creations may start at once; unset: the rate (at least 1)"
    )
    create_retries: int = Field(
        6, ge=0, description="retries of a creation Modal refuses for rate or capacity reasons"
    )
    create_backoff: float = Field(
        1.0, ge=0, description="seconds before the first such retry, doubling after"
    )
    create_timeout: float = Field(600.0, gt=0, description="seconds creating one sandbox may take")
    build_timeout: float = Field(1800.0, gt=0, description="seconds building one image may take")
    call_timeout: float = Field(120.0, gt=0, description="seconds any other call to Modal may take")

    @property
    def burst(self) -> float:
        return self.create_burst if self.create_burst is not None else max(1.0, self.create_rate)
