"""Reading the prompt file and planning the work items of a run.

A prompt's identity is its content: the prompt and the fields that change how it executes
(image, cwd, backend), hashed. k identical rows are k work items, told apart by their occurrence
number (and with ``--samples_per_prompt N``, each row is N work items, numbered the same way), so a dataset may be reordered or edited between invocations and still resume exactly.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from trajkit.config.settings import did_you_mean

if TYPE_CHECKING:
    from trajkit.sandbox.check_files import CheckFile

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
    check_files: tuple[CheckFile, ...] = ()
    """The row's ``check_files`` checked and resolved against the dataset's directory (the plan
    fills it in: :func:`trajkit.run.plan.read_work`)."""

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
    """The line of a JSONL file, or the 1-based row of a table (Parquet, CSV, a JSON array, an HF dataset)."""
    message: str

    def __str__(self) -> str:
        if dataset_kind(self.path) in _LINE_FORMATS:
            return f"{self.path}:{self.line}: {self.message}"
        return f"{display_path(self.path)}: row {self.line}: {self.message}"


class DatasetError(ValueError):
    """The dataset cannot be run at all; the message names the file and what is wrong."""


HF_DATASET_FILES = ("dataset_info.json", "dataset_dict.json")
"""What a directory written by ``datasets``' ``save_to_disk`` holds (a dataset, or a dict of splits)."""
_LINE_FORMATS = ("jsonl", "json lines")


HUB_SCHEME = "hf:/"
"""``hf://OWNER/NAME[:SPLIT]``: a dataset repository of the Hugging Face Hub, read from the local
cache only (a path keeps one slash of the two)."""


def display_path(path: Path) -> str:
    """The dataset as the user wrote it: ``hf://OWNER/NAME`` (a Path keeps one slash of the two)."""
    hub = hub_dataset(path)
    if hub is None:
        return str(path)
    return f"hf://{hub[0]}" + (f":{hub[1]}" if hub[1] else "")


def hub_dataset(path: Path) -> tuple[str, str | None] | None:
    """(repository, split) of an ``hf://OWNER/NAME[:SPLIT]`` dataset, else None."""
    text = str(path)
    if not text.startswith(HUB_SCHEME):
        return None
    repository, _, split = text.removeprefix(HUB_SCHEME).strip("/").partition(":")
    return repository, split or None


@functools.lru_cache(maxsize=64)
def dataset_kind(path: Path) -> str:
    """``jsonl``, ``json lines``, ``json`` (an array of objects), ``csv``, ``parquet``, ``hf``
    (a dataset directory saved with ``save_to_disk``) or ``hub`` (``hf://``), from the path alone
    (and a ``.json`` file's first character)."""
    if hub_dataset(path) is not None:
        return "hub"
    if path.is_dir():
        return "hf"
    suffix = path.suffix.lower()
    if suffix in {".parquet", ".pq"}:
        return "parquet"
    if suffix == ".csv":
        return "csv"
    if suffix == ".json":
        try:
            with path.open("rb") as handle:
                head = handle.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
        except OSError:
            return "json lines"
        return "json" if head.startswith(b"[") else "json lines"
    return "jsonl"


def check_dataset_file(path: Path | None) -> Path:
    """The dataset file, if it is one with something in it; else :class:`DatasetError`."""
    if path is None:
        raise DatasetError("no dataset file given (--dataset_file)")
    hub = hub_dataset(path)
    if hub is not None:
        if hub[0].count("/") != 1 or not all(hub[0].split("/")):
            raise DatasetError(
                f"--dataset_file {display_path(path)}: expected hf://OWNER/NAME or hf://OWNER/NAME:SPLIT"
            )
        return path
    if path.is_dir():
        if any((path / name).is_file() for name in HF_DATASET_FILES):
            return path
        raise DatasetError(
            f"dataset file {path} is a directory; name the JSONL (or Parquet, CSV, JSON) file inside it, "
            "or a Hugging Face dataset directory saved with save_to_disk"
        )
    if not path.exists():
        raise DatasetError(f"dataset file {path} does not exist")
    if not path.is_file():
        raise DatasetError(f"dataset file {path} is not a regular file")
    if path.stat().st_size == 0:
        raise DatasetError(f"dataset file {path} is empty: one JSON object per line expected")
    return path


def read_dataset(path: Path, prompt_field: str = "prompt") -> tuple[list[WorkItem], list[RowError]]:
    """Parse every row (of a JSONL, JSON, CSV or Parquet file, or a dataset saved by ``datasets``);
    bad rows become errors naming file and line (or row), the good ones still run.

    ``prompt_field`` names the column that holds the prompt (it becomes the row's ``prompt``).
    """
    items: list[WorkItem] = []
    errors: list[RowError] = []
    seen: dict[str, int] = {}
    fields = FieldsSeen(prompt_field)
    for number, data in _rows(path):
        if isinstance(data, str):
            errors.append(RowError(path, number, data))
            continue
        fields.add(data)
        if prompt_field != "prompt":
            if prompt_field not in data:
                errors.append(
                    RowError(path, number, f"missing required field '{prompt_field}' (--prompt_field)")
                )
                continue
            prompt = data[prompt_field]
            data = {key: value for key, value in data.items() if key != prompt_field}
            if "prompt" in data:  # the table's own 'prompt' column is kept, under another name
                data["prompt_original"] = data.pop("prompt")
            data["prompt"] = prompt
        try:
            valid = DatasetRow.model_validate(data)
        except ValidationError as exc:
            errors.append(RowError(path, number, _describe(exc, prompt_field)))
            continue
        if not valid.prompt.strip():
            errors.append(RowError(path, number, f"'{prompt_field}' is empty"))
            continue
        row = PlannedRow(valid.prompt, valid.image, valid.cwd, valid.backend, valid.model_extra or None)
        identity = prompt_id(row.prompt, row.image, row.cwd, row.backend)
        occurrence = seen.get(identity, 0)
        seen[identity] = occurrence + 1
        items.append(WorkItem(number - 1, number, row, identity, occurrence))
    fields.check(path)
    return items, errors


class FieldsSeen:
    """The rows' field names, to tell a prompt field that no row has (a misspelt ``--prompt_field``:
    one error for the dataset) from one that some rows lack (an error for each of those rows)."""

    KEPT = 50

    def __init__(self, prompt_field: str) -> None:
        self.prompt_field = prompt_field
        self.names: set[str] = set()
        self.rows = 0
        self.found = False

    def add(self, row: dict[str, Any]) -> None:
        self.rows += 1
        self.found = self.found or self.prompt_field in row
        if len(self.names) < self.KEPT:
            self.names.update(str(key) for key in row)

    def check(self, path: Path) -> None:
        if self.found or not self.rows:
            return
        shown = ", ".join(sorted(self.names)[:20]) or "none"
        where = f"no row of {display_path(path)} has a {self.prompt_field!r} field (the rows have: {shown})"
        if self.prompt_field == "prompt":
            raise DatasetError(f"{where}; name the field that holds the prompt with --prompt_field")
        raise DatasetError(
            f"--prompt_field {self.prompt_field}: {where}{did_you_mean(self.prompt_field, self.names)}"
        )


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


Row = tuple[int, dict[str, Any] | str]
"""A row's number (its line in a JSONL file, else its 1-based position) and its fields, or what is
wrong with it."""


def _rows(path: Path) -> Iterator[Row]:
    kind = dataset_kind(path)
    if kind == "parquet":
        return _parquet_rows(path)
    if kind == "csv":
        return _csv_rows(path)
    if kind == "json":
        return _json_array_rows(path)
    if kind == "hf":
        return _hf_rows(path)
    if kind == "hub":
        return _hub_rows(path)
    return _jsonl_rows(path)


def _jsonl_rows(path: Path) -> Iterator[Row]:
    for line_number, raw in _lines(path):
        if isinstance(raw, UnicodeDecodeError):
            yield line_number, f"invalid UTF-8 ({raw.reason} at byte {raw.start + 1})"
            continue
        if not raw.strip():
            continue
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            yield line_number, f"invalid JSON: {exc.msg} at column {exc.colno}"
            continue
        if not isinstance(data, dict):
            yield line_number, f"expected a JSON object, got {type(data).__name__}"
            continue
        yield line_number, data


def _json_array_rows(path: Path) -> Iterator[Row]:
    try:
        data = json.loads(path.read_bytes().decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise DatasetError(
            f"dataset file {path} is not UTF-8 ({exc.reason} at byte {exc.start + 1})"
        ) from None
    except json.JSONDecodeError as exc:
        raise DatasetError(
            f"dataset file {path}: invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    if not isinstance(data, list):
        raise DatasetError(
            f"dataset file {path}: expected an array of JSON objects, got {type(data).__name__}"
        )
    for number, row in enumerate(data, start=1):
        yield number, row if isinstance(row, dict) else f"expected a JSON object, got {type(row).__name__}"


def _csv_rows(path: Path) -> Iterator[Row]:
    """CSV with a header row; empty cells are missing values (CSV cannot tell them apart)."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as handle:
            for number, row in enumerate(csv.DictReader(handle), start=1):
                if None in row:
                    yield number, f"{len(row[None])} more cells than the header has columns"
                    continue
                yield number, {key: (value if value != "" else None) for key, value in row.items()}
    except UnicodeDecodeError as exc:
        raise DatasetError(f"dataset file {path} is not UTF-8 ({exc.reason})") from None
    except csv.Error as exc:
        raise DatasetError(f"dataset file {path}: not CSV: {exc}") from None


def _parquet_rows(path: Path) -> Iterator[Row]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError(f"reading {path} needs pyarrow: pip install 'trajkit[parquet]'") from None
    try:
        parquet = pq.ParquetFile(str(path))
    except Exception as exc:
        raise DatasetError(f"dataset file {path} is not a Parquet file: {exc}") from None
    number = 0
    for batch in parquet.iter_batches(batch_size=4096):
        for row in batch.to_pylist():
            number += 1
            yield number, row


def _hf_rows(path: Path) -> Iterator[Row]:
    datasets = _datasets(path)
    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as exc:
        raise DatasetError(f"{path} is not a dataset saved with save_to_disk: {exc}") from None
    yield from _split_rows(datasets, loaded, path, lambda split: str(path / split))


def _hub_rows(path: Path) -> Iterator[Row]:
    """A Hub dataset's rows from the local cache: nothing is downloaded, no repository code runs
    (its data files are read as data: Parquet, CSV, JSON)."""
    repository, split = hub_dataset(path) or ("", None)
    datasets = _datasets(path)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        directory = snapshot_download(repository, repo_type="dataset", local_files_only=True)
    except LocalEntryNotFoundError:
        raise DatasetError(
            f"{display_path(path)}: {repository} is not in the local Hugging Face cache (nothing is "
            f"downloaded); fetch it once with huggingface_hub's command: hf download --repo-type dataset {repository}"
        ) from None
    try:
        loaded = datasets.load_dataset(directory, split=split)
    except Exception as exc:
        raise DatasetError(
            f"{display_path(path)}: the cached files of {repository} cannot be read: {exc}"
        ) from None
    yield from _split_rows(datasets, loaded, path, lambda name: f"hf://{repository}:{name}")


def _datasets(path: Path) -> Any:
    try:
        import datasets
    except ImportError:
        raise DatasetError(
            f"reading {display_path(path)} needs the datasets package: pip install datasets"
        ) from None
    datasets.disable_progress_bars()  # the run has its own progress display
    return datasets


def _split_rows(datasets: Any, loaded: Any, path: Path, naming: Callable[[str], str]) -> Iterator[Row]:
    """The rows of a dataset, or of the one split of a dataset dict (several: name one)."""
    if isinstance(loaded, datasets.DatasetDict):
        splits = sorted(loaded)
        if len(splits) != 1:
            raise DatasetError(
                f"{display_path(path)} holds the splits {', '.join(splits)}: name one, "
                f"e.g. --dataset_file {naming(splits[0])}"
            )
        loaded = loaded[splits[0]]
    for number, row in enumerate(loaded, start=1):
        yield number, dict(row)


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


def _describe(exc: ValidationError, prompt_field: str = "prompt") -> str:
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "row"
        where = prompt_field if where == "prompt" else where
        if error["type"] == "missing":
            problems.append(f"missing required field '{where}'")
        else:
            problems.append(f"field '{where}': {error['msg'].lower()}")
    return "; ".join(problems)
