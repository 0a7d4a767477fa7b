"""Docker sandbox backend for trajkit: one container per prompt, via dockerd or podman's Docker API.

Importing the package imports the backend class and its settings only; ``DockerSandbox`` (with the
engine client behind it) is imported when first asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trajkit_docker.backend import DockerBackend
from trajkit_docker.settings import DockerSettings

if TYPE_CHECKING:
    from trajkit_docker.sandbox import DockerSandbox

__all__ = ["DockerBackend", "DockerSandbox", "DockerSettings"]


def __getattr__(name: str) -> Any:
    if name == "DockerSandbox":
        from trajkit_docker.sandbox import DockerSandbox

        return DockerSandbox
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
