"""``tools.json``: the tool schemas offered to the model in a run, once per distinct set, which
records name by key (``tool_schemas_key``), so writers and ``trajkit export`` render what the model
saw without the plugins that made them. The file is the run directory's
(:attr:`trajkit.run.rundir.RunDir.tools_path`), read and kept through it."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trajkit.run.files import read_json_object, write_atomic

log = logging.getLogger("trajkit")

ToolSchemas = list[dict[str, Any]]
"""A set of tool schemas as the OpenAI ``tools`` list has them, sorted by tool name."""


def tool_schemas_key(schemas: Sequence[Mapping[str, Any]]) -> str:
    """The key of a set of tool schemas in ``tools.json``: a hash of exactly what they say."""
    canonical = json.dumps(schemas, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def read_tool_schemas(path: Path) -> dict[str, ToolSchemas]:
    """``tools.json`` at ``path``: every schema set offered in the run, by key; empty for a run made
    before the file existed (or with a warning when it is damaged: readers then use the installed
    tools)."""
    data = read_json_object(path, {}, "the tools' schemas are taken from the installed plugins instead")
    if data is None:
        return {}
    sets = {key: value for key, value in data.items() if _is_schema_list(value)}
    if len(sets) != len(data):
        log.warning("%s: entries that are not lists of tool schemas are ignored", path)
    return sets


def _is_schema_list(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(s, dict) and isinstance(s.get("function"), dict) and "name" in s["function"] for s in value
    )


class ToolCatalog:
    """``tools.json`` as the invocation holding the lock keeps it: each new schema set is added and
    the file written whole (sets are few: one per combination of toolsets)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sets = read_tool_schemas(path)
        self.unsaved: dict[str, ToolSchemas] = {}
        """Sets the disk refused so far, written with the next set or by :meth:`flush`."""

    def add(self, sets: Mapping[str, ToolSchemas]) -> None:
        """Keep the sets not known yet; a :class:`RunIOError` if the file cannot be written."""
        new = {key: list(schemas) for key, schemas in sets.items() if key not in self.sets}
        if new:
            self.unsaved.update(new)
            self.flush()

    def flush(self) -> None:
        if not self.unsaved:
            return
        merged = {**self.sets, **self.unsaved}
        # keys in the order the model was sent them: the writers render the schemas as text
        write_atomic(self.path, json.dumps(merged, indent=2, ensure_ascii=False) + "\n")
        self.sets, self.unsaved = merged, {}
