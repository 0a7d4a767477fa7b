"""What ``trajkit serve`` adds to the run configuration: the listener, its safety limits, recording."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from trajkit.record.secrets import read_key_file

KEY_VARIABLE = "TRAJKIT_SERVER_KEY"
MIN_KEY_LENGTH = 16
"""Shorter keys are accepted on loopback with a warning; a public listener needs a real one."""


class ServerKeyError(ValueError):
    """The server key cannot be used, or a listener would be open to the network without one."""


class ServeSettings(BaseModel):
    """Every setting of ``trajkit serve`` that ``trajkit run`` does not have."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    """Address to listen on."""
    port: int = Field(8642, ge=0, le=65535)
    """Port to listen on (0: any free one)."""
    server_key: SecretStr | None = Field(None, json_schema_extra={"cli": False})
    """The bearer key clients must send (--server_key_file, or $TRAJKIT_SERVER_KEY)."""
    cors_origins: list[str] = Field([], json_schema_extra={"flag": "cors_origin"})
    """Exact ``scheme://host[:port]`` origins a browser page may call from; none: CORS off."""
    max_concurrent: int = Field(16, ge=1)
    """Chat completions in flight at once; more are answered 429 with ``Retry-After``."""
    request_timeout: float = Field(600.0, gt=0)
    """Seconds one chat completion may take, agent session and sandbox included."""
    max_body_bytes: int = Field(4 << 20, ge=1024)
    """Largest request body accepted."""
    record: Path | None = None
    """A run directory whose ledger receives every served session."""
    tool_progress: Literal["off", "sse", "inline"] = "sse"
    """How tool calls in progress are shown to a streaming client."""
    housekeeping: Literal["on", "off"] = "on"
    """Answer chat UIs' title/tag/follow-up requests with a plain model call."""
    keepalive: float = Field(15.0, gt=0)
    """Seconds of silence on a stream before a keepalive comment is sent."""
    merge_interval: float = Field(60.0, gt=0)
    """Seconds between merges of the recorded run directory (when something new was recorded)."""

    @field_validator("cors_origins")
    @classmethod
    def _exact_origins(cls, origins: list[str]) -> list[str]:
        for origin in origins:
            scheme, sep, rest = origin.partition("://")
            if origin == "*" or not sep or scheme not in ("http", "https") or not rest or "/" in rest:
                raise ValueError(
                    f"{origin!r}: give exact origins like https://chat.example.com (no '*', no path)"
                )
        return origins

    def key(self) -> str | None:
        return self.server_key.get_secret_value() if self.server_key is not None else None


def read_server_key(path: Path | None) -> str | None:
    """The key from ``--server_key_file``, else ``$TRAJKIT_SERVER_KEY``, else None; never echoed."""
    if path is not None:
        try:
            key = read_key_file(path, "--server_key_file")
        except ValueError as exc:
            raise ServerKeyError(str(exc)) from None
    else:
        key = os.environ.get(KEY_VARIABLE, "").strip()
        if not key:
            return None
    if not key.isascii() or not key.isprintable() or any(c.isspace() for c in key):
        raise ServerKeyError("the server key must be printable ASCII without whitespace")
    return key


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(settings: ServeSettings) -> str | None:
    """Raise when the listener would be reachable from the network without a usable key; return a
    warning to log for what is allowed but weak (no key, or a short one, on loopback)."""
    key = settings.key()
    if not loopback(settings.host):
        if key is None:
            raise ServerKeyError(
                f"refusing to listen on {settings.host} without a key: set ${KEY_VARIABLE} or "
                "--server_key_file (or listen on 127.0.0.1)"
            )
        if len(key) < MIN_KEY_LENGTH:
            raise ServerKeyError(
                f"refusing to listen on {settings.host} with a key of fewer than {MIN_KEY_LENGTH} characters"
            )
        return None
    if key is None:
        return (
            f"no server key (${KEY_VARIABLE} or --server_key_file): any process of this machine may use "
            "the agent and its sandboxes"
        )
    if len(key) < MIN_KEY_LENGTH:
        return f"the server key is shorter than {MIN_KEY_LENGTH} characters"
    return None
