"""Shell scripts that trajkit runs inside sandboxes, kept as readable files and run as one line.

A script put in front of a model's command (the terminal's state) or around it (the local
sandbox's supervisor) would otherwise shift the line numbers in the shell's error messages: a
model that runs ``nosuch`` must read ``bash: line 1: nosuch: command not found``, as from
``bash -c``, not ``line 40``. So the scripts are written one command per line and joined into one
line when loaded (:func:`script`), and a command follows them on that same line.

The files keep to what the join understands: no comment after a command (comments on lines of
their own), no here-document, no line continued inside quotes.
"""

from __future__ import annotations

import functools
from importlib import resources

_JOINING_WORDS = frozenset(("do", "then", "else", "{", "(", "in", "&&", "||", "|", ";;", ";"))
"""A line whose last word is one of these goes on into the next line: no ``;`` between them."""


@functools.cache
def script(package: str, name: str) -> str:
    """The script ``name`` of ``package``'s ``scripts`` directory, as one line."""
    return one_line((resources.files(package) / "scripts" / name).read_text())


def one_line(text: str) -> str:
    """``text``, a script of one command per line, joined into one line with the same meaning."""
    joined = ""
    previous = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if joined:
            joined += " " if _continues(previous) or line.startswith(";;") else "; "
        previous = line
        if line.endswith("\\"):  # continued on the next line
            line = line[:-1].rstrip()
            previous = "|"
        joined += line
    return joined


def _continues(line: str) -> bool:
    """Whether the line that follows ``line`` goes on with its command rather than a new one."""
    if line.endswith("&") and not line.endswith("&&"):
        return True  # a background job ends its command: `a &; b` would be a syntax error
    if line.rsplit(None, 1)[-1] in _JOINING_WORDS:
        return True
    return line.endswith(")") and "(" not in line and line != ")"  # a case pattern: `x)`
