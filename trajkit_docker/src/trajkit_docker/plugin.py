"""Registers the docker sandbox backend with trajkit (entry point ``trajkit: docker``)."""

from __future__ import annotations

from collections.abc import Sequence

from trajkit import hookimpl
from trajkit.sandbox import SandboxBackend
from trajkit_docker.backend import DockerBackend


@hookimpl
def trajkit_sandbox_backends() -> Sequence[type[SandboxBackend]]:
    return [DockerBackend]
