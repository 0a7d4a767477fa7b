"""Datasets in: the prompt file may be JSONL, JSON, CSV, Parquet or a Hugging Face dataset on disk,
with the prompt in another column (``--prompt_field``); bad rows name the file and the row."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import read_jsonl, trajkit, write_jsonl
from trajkit.run.dataset import DatasetError, check_dataset_file, read_dataset

ROWS: list[dict[str, Any]] = [
    {"question": "What is in the notes?", "source": "a", "answer": "x"},
    {"question": "List the files", "source": "b", "answer": None},
    {"question": "What is in the notes?", "source": "a", "answer": "x"},
]


def write(kind: str, path: Path, rows: list[dict[str, Any]]) -> Path:
    if kind == "jsonl":
        return write_jsonl(path.with_suffix(".jsonl"), list(rows))
    if kind == "json":
        target = path.with_suffix(".json")
        target.write_text(json.dumps(rows, indent=1))
        return target
    if kind == "csv":
        target = path.with_suffix(".csv")
        with target.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        return target
    if kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        target = path.with_suffix(".parquet")
        pq.write_table(pa.Table.from_pylist(rows), str(target))
        return target
    import datasets

    target = path.with_suffix("")
    datasets.Dataset.from_list(rows).save_to_disk(str(target))
    return target


KINDS = ["jsonl", "json", "csv", "parquet", "hf"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_format_reads_the_same_rows(tmp_path: Path, kind: str) -> None:
    path = check_dataset_file(write(kind, tmp_path / "rows", ROWS))
    items, errors = read_dataset(path, "question")
    assert errors == []
    assert [i.row.prompt for i in items] == [r["question"] for r in ROWS]
    assert [i.index for i in items] == [0, 1, 2]
    assert [i.occurrence for i in items] == [0, 0, 1]
    assert items[0].prompt_id == items[2].prompt_id
    assert items[0].row.extra_fields == {"source": "a", "answer": "x"}
    assert items[1].row.extra_fields.get("answer") is None


@pytest.mark.parametrize("kind", ["json", "csv", "parquet", "hf"])
def test_bad_rows_name_the_file_and_the_row(tmp_path: Path, kind: str) -> None:
    rows = [
        {"question": "fine", "image": None},
        {"question": None, "image": None},
        {"question": "ok", "image": None},
    ]
    path = write(kind, tmp_path / "bad", rows)
    items, errors = read_dataset(path, "question")
    assert [i.row.prompt for i in items] == ["fine", "ok"]
    assert [i.index for i in items] == [0, 2], "prompt_index is the row's position, bad rows counted"
    [error] = errors
    assert str(error).startswith(f"{path}: row 2: ")
    assert "question" in str(error)


def test_a_jsonl_row_names_its_line_and_a_missing_prompt_field_is_said(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "a"}, {"prompt": "b"}])
    items, errors = read_dataset(path, "question")
    assert [i.row.prompt for i in items] == ["a"]
    assert [str(e) for e in errors] == [f"{path}:2: missing required field 'question' (--prompt_field)"]


def test_a_table_s_own_prompt_column_is_kept(tmp_path: Path) -> None:
    path = write("parquet", tmp_path / "t", [{"question": "q", "prompt": "p"}])
    [item], _ = read_dataset(path, "question")
    assert (item.row.prompt, item.row.extra_fields) == ("q", {"prompt_original": "p"})


def test_unreadable_datasets_are_errors_naming_the_file(tmp_path: Path) -> None:
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not parquet at all")
    with pytest.raises(DatasetError, match=f"{broken} is not a Parquet file"):
        read_dataset(broken)
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(DatasetError, match="save_to_disk"):
        check_dataset_file(plain)
    import datasets

    splits = tmp_path / "splits"
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list([{"prompt": "a"}]),
            "test": datasets.Dataset.from_list([{"prompt": "b"}]),
        }
    ).save_to_disk(str(splits))
    with pytest.raises(DatasetError, match="splits test, train: name one"):
        read_dataset(check_dataset_file(splits))
    [item], _ = read_dataset(check_dataset_file(splits / "train"))
    assert item.row.prompt == "a"
    array = tmp_path / "object.json"
    array.write_text('{"prompt": "one object, not an array or lines"}')
    [item], _ = read_dataset(array)  # a .json file that is no array is read as JSON lines


def test_a_run_from_a_parquet_dataset_with_another_prompt_column(tmp_path: Path) -> None:
    path = write("parquet", tmp_path / "rows", ROWS)
    out = tmp_path / "out"
    result = trajkit(
        "run", "--dataset_file", str(path), "--prompt_field", "question", "--run_name", "pq",
        "--output_dir", str(out), "--quiet",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    records = read_jsonl(out / "pq" / "trajectories.jsonl")
    assert [r["conversations"][1]["value"] for r in records] == [r["question"] for r in ROWS]
    assert [r["metadata"]["source"] for r in records] == ["a", "b", "a"]
    assert records[0]["score"]["passed"] is False  # the 'answer' column is a check


def hub_cache(root: Path, repository: str, splits: dict[str, list[dict[str, Any]]]) -> dict[str, str]:
    """A dataset repository laid out as the Hugging Face cache keeps a download of it (``refs/main``
    naming a snapshot of the repository's files); the environment that points the hub there."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = root / "hub" / f"datasets--{repository.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    data = repo / "snapshots" / commit / "data"
    data.mkdir(parents=True)
    for split, rows in splits.items():
        pq.write_table(pa.Table.from_pylist(rows), data / f"{split}-00000-of-00001.parquet")
    return {
        "HF_HUB_CACHE": str(root / "hub"),
        "HF_DATASETS_CACHE": str(root / "datasets"),
        "HF_HUB_OFFLINE": "1",
    }


def test_a_hub_dataset_is_read_from_the_local_cache_only(tmp_path: Path) -> None:
    env = hub_cache(tmp_path / "cache", "acme/questions", {"train": ROWS, "test": ROWS[:1]})
    out = tmp_path / "out"
    args = ["--prompt_field", "question", "--output_dir", str(out), "--quiet", "--no_filter", "partial"]
    result = trajkit(
        "run",
        "--dataset_file",
        "hf://acme/questions:train",
        "--run_name",
        "hub",
        *args,
        env=env,
        subprocess=True,
    )
    assert result.returncode == 0, result.stderr
    assert "Generating" not in result.stderr  # no progress bars of the datasets library
    records = read_jsonl(out / "hub" / "trajectories.jsonl")
    assert [r["conversations"][1]["value"] for r in records] == [r["question"] for r in ROWS]
    assert [r["metadata"]["source"] for r in records] == ["a", "b", "a"]

    both = trajkit(
        "run", "--dataset_file", "hf://acme/questions", "--run_name", "both", *args, env=env, subprocess=True
    )
    assert both.returncode == 2
    assert (
        "holds the splits test, train: name one, e.g. --dataset_file hf://acme/questions:test" in both.stderr
    )
    missing = trajkit(
        "run", "--dataset_file", "hf://acme/absent", "--run_name", "absent", *args, env=env, subprocess=True
    )
    assert missing.returncode == 2
    assert "acme/absent is not in the local Hugging Face cache (nothing is downloaded)" in missing.stderr
    malformed = trajkit(
        "run", "--dataset_file", "hf://questions", "--run_name", "bad", *args, env=env, subprocess=True
    )
    assert malformed.returncode == 2 and "expected hf://OWNER/NAME" in malformed.stderr
