"""trajkit plugin entry point (group ``trajkit``, name ``modal``): registers the Modal backend.

Kept tiny on purpose: loading it imports neither the Modal SDK nor anything that talks to Modal.
"""

from __future__ import annotations

from trajkit import hookimpl
from trajkit.sandbox import SandboxBackend
from trajkit_modal.backend import ModalBackend


@hookimpl
def trajkit_sandbox_backends() -> list[type[SandboxBackend]]:
    return [ModalBackend]
