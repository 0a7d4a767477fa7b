"""Built-in toolset distributions over the built-in toolsets (terminal, file, code)."""

from __future__ import annotations

from trajkit import hookimpl
from trajkit.distributions import Distribution


@hookimpl
def trajkit_distributions() -> list[Distribution]:
    return [
        Distribution("default", "every built-in toolset", {"terminal": 1.0, "file": 1.0, "code": 1.0}),
        Distribution("development", "mostly terminal and files", {"terminal": 0.8, "file": 0.8, "code": 0.5}),
        Distribution("terminal_only", "terminal and files", {"terminal": 1.0, "file": 1.0}),
        Distribution("balanced", "each toolset half the time", {"terminal": 0.5, "file": 0.5, "code": 0.5}),
        Distribution("file_only", "file tools alone", {"file": 1.0}),
        Distribution("code_only", "Python execution alone", {"code": 1.0}),
    ]
