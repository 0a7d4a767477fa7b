"""The ``--sandbox_option docker.KEY=VALUE`` settings, parsed and checked once per run.

Options arrive as strings from the command line; a typo or a bad value must stop the run before any
model call rather than surface as an engine error in the middle of it, so every key is known and
every value is validated here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from trajkit.sandbox import positive_option

NETWORKS = ("none", "host", "bridge")
PULL_POLICIES = ("missing", "always", "never")
_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([bkmg]?)b?\s*$", re.IGNORECASE)
_MEMORY_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


DEFAULT_MEMORY = 4 * 1024**3
"""Bytes of memory (swap included) a container may use unless ``docker.memory`` says otherwise."""
DEFAULT_PIDS_LIMIT = 1024
"""Processes a container may hold at once unless ``docker.pids_limit`` says otherwise: a fork bomb
fills its own container, not the machine."""
OFF = "none"
"""The value that lifts a limit (``docker.memory=none``)."""


@dataclass(frozen=True)
class DockerOptions:
    network: str = "none"
    cpus: float | None = None
    memory: int | None = DEFAULT_MEMORY
    """Bytes; None means no limit."""
    pids_limit: int | None = DEFAULT_PIDS_LIMIT
    """None means no limit."""
    pull: str = "missing"
    pull_timeout: float = 600.0
    """Seconds one pull may take before the image counts as unavailable."""

    @classmethod
    def parse(cls, options: Mapping[str, object]) -> DockerOptions:
        """Build options from ``KEY -> VALUE`` strings; raise ValueError naming the bad one."""
        known = {"network", "cpus", "memory", "pids_limit", "pull", "pull_timeout"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"unknown docker option(s) {unknown}; known: {sorted(known)}")
        values = {key: str(value).strip() for key, value in options.items()}
        return cls(
            network=_choice(values, "network", NETWORKS, cls.network),
            cpus=positive_option(values, "docker.cpus", float),
            memory=_memory(values.get("memory", str(DEFAULT_MEMORY))),
            pids_limit=_pids_limit(values),
            pull=_choice(values, "pull", PULL_POLICIES, cls.pull),
            pull_timeout=positive_option(values, "docker.pull_timeout", float) or cls.pull_timeout,
        )


def _choice(values: Mapping[str, str], key: str, allowed: tuple[str, ...], default: str) -> str:
    value = values.get(key, default).lower()
    if value not in allowed:
        raise ValueError(f"docker.{key}={value!r}: expected one of {', '.join(allowed)}")
    return value


def _pids_limit(values: Mapping[str, str]) -> int | None:
    if values.get("pids_limit", "").lower() == OFF:
        return None
    return positive_option(values, "docker.pids_limit", int) or DEFAULT_PIDS_LIMIT


def _memory(value: str) -> int | None:
    if value.lower() == OFF:
        return None
    match = _MEMORY.match(value)
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"docker.memory={value!r}: expected a size such as 512m or 2g, or none")
    return int(float(match.group(1)) * _MEMORY_UNITS[match.group(2).lower()])
