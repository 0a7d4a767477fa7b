"""Reading the prompt file and planning the work items of a run.

A prompt's identity is its content: the prompt and the fields that change how it executes
(image, cwd, backend), hashed. k identical rows are k work items, told apart by their occurrence
number (and with ``--samples_per_prompt N``, each row is N work items, numbered the same way), so a dataset may be reordered or edited between invocations and still resume exactly.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

_CANONICAL_JSON = json.JSONEncoder(sort_keys=True, ensure_ascii=False, separators=(",", ":"))
"""The identity's spelling, made once: it must never change, or finished prompts would run again."""


class DatasetRow(BaseModel):
    """One line of the prompt file. Fields beyond these travel to the record's metadata."""

    model_config = ConfigDict(extra="allow", frozen=True, strict=True)

    prompt: str
    image: str | None = None
    cwd: str | None = None
    backend: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _docker_image_alias(cls, data: Any) -> Any:
        if isinstance(data, dict) and "docker_image" in data:
            data = dict(data)
            alias = data.pop("docker_image")
            if data.get("image") is None:
                data["image"] = alias
        return data

    def prompt_id(self) -> str:
        return prompt_id(self.prompt, self.image, self.cwd, self.backend)


def prompt_id(prompt: str, image: str | None, cwd: str | None, backend: str | None) -> str:
    identity = {"prompt": prompt, "image": image, "cwd": cwd, "backend": backend}
    return hashlib.sha256(_CANONICAL_JSON.encode(identity).encode()).hexdigest()[:20]


@dataclass(frozen=True, slots=True)
class PlannedRow:
    """A validated row as a run holds it: plain and slotted, because a run holds one per dataset
    row and a pydantic model per row would take about twice the memory."""

    prompt: str
    image: str | None
    cwd: str | None
    backend: str | None
    extra: dict[str, Any] | None
    """The row's other fields (they travel to the record's metadata), None when it has none."""

    @property
    def extra_fields(self) -> dict[str, Any]:
        return dict(self.extra or {})


@dataclass(frozen=True, slots=True)
class WorkItem:
    index: int
    """0-based line position of the row in the dataset file as it is now (the record's prompt_index)."""
    line: int
    row: PlannedRow
    prompt_id: str
    occurrence: int
    """0 for the first work item with this prompt_id, 1 for the second, ... (identical rows and
    the samples of a row are all work items of one prompt_id)."""
    sample: int = 0
    """Which of the row's ``--samples_per_prompt`` samples this is (0-based)."""

    @property
    def work_id(self) -> str:
        return f"{self.prompt_id}.{self.occurrence}"


@dataclass(frozen=True)
class RowError:
    path: Path
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


class DatasetError(ValueError):
    """The dataset cannot be run at all; the message names the file and what is wrong."""


def check_dataset_file(path: Path | None) -> Path:
    """The dataset file, if it is one with something in it; else :class:`DatasetError`."""
    if path is None:
        raise DatasetError("no dataset file given (--dataset_file)")
    if path.is_dir():
        raise DatasetError(f"dataset file {path} is a directory; name the JSONL file inside it")
    if not path.exists():
        raise DatasetError(f"dataset file {path} does not exist")
    if not path.is_file():
        raise DatasetError(f"dataset file {path} is not a regular file")
    if path.stat().st_size == 0:
        raise DatasetError(f"dataset file {path} is empty: one JSON object per line expected")
    return path


def read_dataset(path: Path) -> tuple[list[WorkItem], list[RowError]]:
    """Parse every line; bad lines become errors naming file and line, the good ones still run."""
    items: list[WorkItem] = []
    errors: list[RowError] = []
    seen: dict[str, int] = {}
    for line_number, raw in _lines(path):
        if isinstance(raw, UnicodeDecodeError):
            errors.append(
                RowError(path, line_number, f"invalid UTF-8 ({raw.reason} at byte {raw.start + 1})")
            )
            continue
        if not raw.strip():
            continue
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            errors.append(RowError(path, line_number, f"invalid JSON: {exc.msg} at column {exc.colno}"))
            continue
        if not isinstance(data, dict):
            errors.append(RowError(path, line_number, f"expected a JSON object, got {type(data).__name__}"))
            continue
        try:
            valid = DatasetRow.model_validate(data)
        except ValidationError as exc:
            errors.append(RowError(path, line_number, _describe(exc)))
            continue
        if not valid.prompt.strip():
            errors.append(RowError(path, line_number, "'prompt' is empty"))
            continue
        row = PlannedRow(valid.prompt, valid.image, valid.cwd, valid.backend, valid.model_extra or None)
        identity = prompt_id(row.prompt, row.image, row.cwd, row.backend)
        occurrence = seen.get(identity, 0)
        seen[identity] = occurrence + 1
        items.append(WorkItem(line_number - 1, line_number, row, identity, occurrence))
    return items, errors


def with_samples(items: list[WorkItem], samples: int) -> list[WorkItem]:
    """Each row's work item ``samples`` times in a row (sample 0, 1, ...), numbered as identical
    rows are: a prompt's occurrences count every sample of every copy of it."""
    if samples == 1:
        return items
    expanded: list[WorkItem] = []
    seen: dict[str, int] = {}
    for item in items:
        first = seen.get(item.prompt_id, 0)
        seen[item.prompt_id] = first + samples
        expanded += [replace(item, occurrence=first + s, sample=s) for s in range(samples)]
    return expanded


def _lines(path: Path) -> Iterator[tuple[int, str | UnicodeDecodeError]]:
    """Each line decoded, or why it is not UTF-8 (never replaced: the prompt would change)."""
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                text = raw.decode()
            except UnicodeDecodeError as exc:
                yield number, exc
                continue
            yield number, text.removeprefix("\ufeff") if number == 1 else text


def _describe(exc: ValidationError) -> str:
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "row"
        if error["type"] == "missing":
            problems.append(f"missing required field '{where}'")
        else:
            problems.append(f"field '{where}': {error['msg'].lower()}")
    return "; ".join(problems)
