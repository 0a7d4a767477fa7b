"""Which package provides the sandbox backends and executors that live outside the core, for "not
installed" errors."""

from __future__ import annotations

from trajkit import hookimpl


@hookimpl
def trajkit_package_hints() -> dict[str, str]:
    return {
        "docker": "trajkit-docker",
        "modal": "trajkit-modal",
        "singularity": "trajkit-singularity",
        "ray": "trajkit-ray",
    }
