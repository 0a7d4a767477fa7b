"""Unified diffs for the ``patch`` tool: parsed by ``unidiff``, applied to text in memory.

Nothing here touches a file: the caller reads each file through the sandbox's confined file
operations, applies the hunks here, and writes the results back the same way, so a path in a diff
is held to the same rules as a path given to ``read_file``. ``unidiff`` parses (git headers,
``/dev/null``, ``\\ No newline at end of file``, binary, symlink and rename markers); applying is
done here because the libraries that apply diffs either write files on the host (``patch-ng``) or
insist on each hunk's stated line and drop a missing final newline (``whatthepatch``), while a
model's line numbers are often off by a few: a hunk is looked for at its stated line first, then
ever further away (as GNU patch does, without fuzz: its context must match exactly).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from unidiff import PatchedFile, PatchSet, UnidiffParseError
from unidiff.constants import LINE_TYPE_ADDED, LINE_TYPE_CONTEXT, LINE_TYPE_NO_NEWLINE, LINE_TYPE_REMOVED


class DiffError(ValueError):
    """The diff cannot be read or does not apply; the message is for the model."""


@dataclass
class FileChange:
    """What a diff does to one file."""

    path: str
    """As the diff names it, ``a/`` and ``b/`` prefixes taken off."""
    created: bool
    hunks: list[tuple[int, int, list[str], list[str]]] = field(default_factory=list)
    """(stated start line, hunk number, old lines, new lines); lines keep their line endings."""


def parse(text: str) -> list[FileChange]:
    """The file changes of a unified diff; :class:`DiffError` for anything else, or for what the
    ``patch`` tool does not do (delete, rename, binary, symlinks)."""
    try:
        patch_set = PatchSet(text)
    except UnidiffParseError as exc:
        raise DiffError(f"the patch is not a valid unified diff: {exc}") from None
    if not patch_set:
        raise DiffError(
            "the patch holds no file changes: expected a unified diff (--- a/PATH, +++ b/PATH, @@ hunks)"
        )
    return [_change(patched) for patched in patch_set]


def _change(patched: PatchedFile) -> FileChange:
    path = patched.path.strip('"')
    refusal = (
        "a binary diff" if patched.is_binary_file
        else "a symbolic link" if patched.is_symlink or patched.is_submodule
        else "a deletion: delete files with the terminal" if patched.is_removed_file
        else "a rename: rename files with the terminal" if patched.is_rename
        else "no file name" if not path
        else None
    )  # fmt: skip
    if refusal:
        raise DiffError(f"{path or 'a file'}: the patch tool does not apply {refusal}")
    change = FileChange(path, created=patched.is_added_file)
    for number, hunk in enumerate(patched, 1):
        old: list[str] = []
        new: list[str] = []
        sides: list[list[str]] = []
        for line in hunk:
            if line.line_type == LINE_TYPE_NO_NEWLINE:  # the line before it has no line ending
                for side in sides:
                    side[-1] = side[-1].removesuffix("\n").removesuffix("\r")
                continue
            sides = {LINE_TYPE_CONTEXT: [old, new], LINE_TYPE_REMOVED: [old], LINE_TYPE_ADDED: [new]}.get(
                line.line_type, []
            )
            for side in sides:
                side.append(line.value)
        change.hunks.append((hunk.source_start, number, old, new))
    return change


def apply(change: FileChange, text: str) -> str:
    """``text`` with the change's hunks applied in order; :class:`DiffError` naming the hunk that
    does not match."""
    lines = text.splitlines(keepends=True)
    earliest = 0  # a hunk applies after the previous one
    shift = 0  # lines added minus lines removed by the hunks applied so far
    for start, number, old, new in change.hunks:
        stated = (start if not old else start - 1) + shift
        at = _find(lines, old, stated, earliest)
        if at is None:
            raise DiffError(
                f"{change.path}: hunk {number} (at line {start}) does not apply: {_mismatch(lines, old, stated)}"
            )
        lines[at : at + len(old)] = new
        earliest = at + len(new)
        shift += len(new) - len(old)
    return "".join(lines)


def _find(lines: list[str], old: list[str], stated: int, earliest: int) -> int | None:
    """Where ``old`` stands in ``lines`` at or after ``earliest``: the nearest place to ``stated``."""
    if not old:
        return min(max(stated, earliest), len(lines))
    last = len(lines) - len(old)
    for distance in range(max(stated - earliest, last - stated, 0) + 1):
        for at in (stated - distance, stated + distance) if distance else (stated,):
            if earliest <= at <= last and lines[at : at + len(old)] == old:
                return at
    return None


def _mismatch(lines: list[str], old: list[str], stated: int) -> str:
    """What differs at the stated place, so the model can fix its diff."""
    for offset, expected in enumerate(old):
        index = stated + offset
        if index >= len(lines):
            return (
                f"the file has {len(lines)} lines; the hunk expects {expected.rstrip()!r} at line {index + 1}"
            )
        if lines[index] != expected:
            return (
                f"line {index + 1} is {lines[index].rstrip(chr(10))!r}, the hunk expects "
                f"{expected.rstrip(chr(10))!r} (and its lines are nowhere else after the previous hunk)"
            )
    return "its lines are nowhere after the previous hunk"
