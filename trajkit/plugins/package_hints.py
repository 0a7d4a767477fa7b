"""Which package provides the sandbox backends and executors that live outside the core, for "not
installed" errors. They are not on a package index: each installs from its directory of the
trajkit repository, as the README's set-up does."""

from __future__ import annotations

from trajkit import hookimpl
from trajkit.hookspecs import PackageHint

FROM_THE_REPOSITORY = "from the root of the trajkit repository (it is not on a package index)"


def _from_the_repository(name: str, concern: str) -> PackageHint:
    package = f"trajkit-{name}"
    install = f"pip install ./trajkit_{name} {FROM_THE_REPOSITORY}"
    return PackageHint(package, concern, install)


@hookimpl
def trajkit_package_hints() -> dict[str, PackageHint]:
    backends = {
        name: _from_the_repository(name, "sandbox backend") for name in ("docker", "modal", "singularity")
    }
    return {**backends, "ray": _from_the_repository("ray", "executor")}
