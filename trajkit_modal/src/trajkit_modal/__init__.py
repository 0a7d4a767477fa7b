"""Modal cloud sandboxes for trajkit (``--sandbox modal``).

Importing this package does not import the Modal SDK; the backend loads it on first use. Nor does it
import the sandbox class: ``ModalSandbox`` is imported when first asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trajkit_modal.backend import ModalBackend

if TYPE_CHECKING:
    from trajkit_modal.sandbox import ModalSandbox

__all__ = ["ModalBackend", "ModalSandbox"]


def __getattr__(name: str) -> Any:
    if name == "ModalSandbox":
        from trajkit_modal.sandbox import ModalSandbox

        return ModalSandbox
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
