"""Built-in toolset distributions: the reference agent's, by its names and weights, and trajkit's own.

The reference's names keep the reference's weights, so a dataset made with ``--distribution
research`` here draws what the reference's would. They name toolsets that other plugins provide
(``web``, ``vision``, ``image_gen``, ``browser``): a run leaves out those it cannot offer and
draws over the rest (see :mod:`trajkit.tools.offer`). trajkit's own distributions use names the
reference does not have; ``sandboxed`` is the default, since it needs nothing beyond the sandbox
(no network, no key).
"""

from __future__ import annotations

from trajkit import hookimpl
from trajkit.tools.distributions import Distribution

_SIX = ("web", "vision", "image_gen", "terminal", "file", "browser")

REFERENCE: tuple[tuple[str, str, dict[str, int]], ...] = (
    ("default", "the reference's default: every toolset", dict.fromkeys(_SIX, 100)),
    ("image_gen", "image generation and vision", {"image_gen": 90, "vision": 90, "web": 55, "terminal": 45}),
    ("research", "web research", {"web": 90, "browser": 70, "vision": 50, "terminal": 10}),
    ("science", "web research with computation",
     {"web": 94, "terminal": 94, "file": 94, "vision": 65, "browser": 50, "image_gen": 15}),
    ("development", "software development", {"terminal": 80, "file": 80, "web": 30, "vision": 10}),
    ("safe", "no terminal and no files", {"web": 80, "browser": 70, "vision": 60, "image_gen": 60}),
    ("balanced", "six toolsets, each half the time", dict.fromkeys(_SIX, 50)),
    ("minimal", "web search alone", {"web": 100}),
    ("terminal_only", "terminal and files", {"terminal": 100, "file": 100}),
    ("terminal_web", "terminal, files and the web", {"terminal": 100, "file": 100, "web": 100}),
    ("creative", "images first", {"image_gen": 90, "vision": 90, "web": 30}),
    ("reasoning", "web, files and a little terminal", {"web": 90, "file": 60, "terminal": 20}),
    ("browser_use", "the browser first", {"browser": 100, "web": 80, "vision": 70}),
    ("browser_only", "the browser alone", {"browser": 100}),
    ("browser_tasks", "browser tasks", {"browser": 97, "vision": 12, "terminal": 15}),
    ("terminal_tasks", "terminal tasks",
     {"terminal": 97, "file": 97, "web": 97, "browser": 75, "vision": 50, "image_gen": 10}),
    ("mixed_tasks", "browser and terminal tasks",
     {"browser": 92, "terminal": 92, "file": 92, "web": 35, "vision": 15, "image_gen": 15}),
)  # fmt: skip
"""(name, description, percent per toolset), as the reference has them (REFERENCE.md, section H)."""


@hookimpl
def trajkit_distributions() -> list[Distribution]:
    own = [
        Distribution(
            "sandboxed",
            "every toolset that needs nothing beyond the sandbox: no network, no key",
            {"terminal": 1.0, "file": 1.0, "code": 1.0},
            default=True,
        ),
        Distribution("file_only", "file tools alone", {"file": 1.0}),
        Distribution("code_only", "Python execution alone", {"code": 1.0}),
    ]
    reference = [
        Distribution(name, description, {toolset: percent / 100 for toolset, percent in weights.items()})
        for name, description, weights in REFERENCE
    ]
    return [*own, *reference]
