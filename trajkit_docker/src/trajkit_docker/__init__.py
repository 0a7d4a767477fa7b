"""Docker sandbox backend for trajkit: one container per prompt, via dockerd or podman's Docker API."""

from trajkit_docker.backend import DockerBackend
from trajkit_docker.options import DockerOptions
from trajkit_docker.sandbox import DockerSandbox

__all__ = ["DockerBackend", "DockerOptions", "DockerSandbox"]
