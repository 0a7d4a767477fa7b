"""Registers the singularity sandbox backend with trajkit (entry point ``trajkit: singularity``)."""

from __future__ import annotations

from collections.abc import Sequence

from trajkit import hookimpl
from trajkit.sandbox import SandboxBackend
from trajkit_singularity.backend import SingularityBackend


@hookimpl
def trajkit_sandbox_backends() -> Sequence[type[SandboxBackend]]:
    return [SingularityBackend]
