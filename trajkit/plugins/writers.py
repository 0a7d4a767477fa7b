"""The default output writer: the trajectory records, one JSON object per line (ShareGPT turns)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from trajkit import hookimpl
from trajkit.filters import Record
from trajkit.writers import OutputWriter


@hookimpl
def trajkit_writers() -> list[type[OutputWriter]]:
    return [ShareGPTWriter]


class ShareGPTWriter(OutputWriter):
    name = "sharegpt"
    filename = "trajectories.jsonl"
    description = "trajectory records with ShareGPT conversations (the default)"

    def write(self, records: Iterable[Record], path: Path) -> int:
        count = 0
        with path.open("w", encoding="utf-8") as out:
            for record in records:
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
                count += 1
        return count
