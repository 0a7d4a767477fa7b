"""Modal cloud sandboxes for trajkit (``--sandbox modal``).

Importing this package does not import the Modal SDK; the backend loads it on first use.
"""

from trajkit_modal.backend import ModalBackend, ModalSandbox

__all__ = ["ModalBackend", "ModalSandbox"]
