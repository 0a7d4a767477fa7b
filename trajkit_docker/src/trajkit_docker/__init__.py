"""Docker sandbox backend for trajkit: one container per prompt, via dockerd or podman's Docker API."""

from trajkit_docker.backend import DockerBackend
from trajkit_docker.sandbox import DockerSandbox
from trajkit_docker.settings import DockerSettings

__all__ = ["DockerBackend", "DockerSandbox", "DockerSettings"]
