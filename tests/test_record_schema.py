"""The record is defined once: a field added to ``TrajectoryRecord`` reaches the ledger's check,
every writer, the Parquet schema, the Hugging Face features and the manual without touching them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import Field, create_model

from tests.test_records import RUN_TOOLS, fields, session, three_tool_calls
from trajkit.plugins.export.hf import features
from trajkit.plugins.export.writers import HermesWriter, OpenAIWriter, ParquetWriter, ShareGPTWriter
from trajkit.record import trajectory as records
from trajkit.record.schema import fields_markdown, record_problem
from trajkit.record.trajectory import CARRIED, TrajectoryRecord, record_json

ROOT = Path(__file__).resolve().parent.parent


def a_record(**extra: Any) -> dict[str, Any]:
    return {**record_json(session(three_tool_calls()), RUN_TOOLS, **fields()), **extra}


@pytest.fixture
def with_temperature(monkeypatch: pytest.MonkeyPatch) -> None:
    """The record schema with one more field: the sampling temperature, carried by derived rows."""
    grown = create_model(
        "TrajectoryRecord",
        __base__=TrajectoryRecord,
        temperature=(float, Field(json_schema_extra=CARRIED, description="The sampling temperature.")),
    )
    monkeypatch.setattr(records, "TrajectoryRecord", grown)


def test_the_manual_s_field_table_is_made_from_the_record() -> None:
    page = (ROOT / "docs" / "outputs.md").read_text()
    marker = "<!-- record fields: trajkit.record.schema.fields_markdown() -->\n"
    start = page.index(marker) + len(marker)
    assert page[start : page.index("\n\n", start) + 1] == fields_markdown(), (
        "stale: paste trajkit.record.schema.fields_markdown() into docs/outputs.md"
    )


def test_the_ledger_check_refuses_what_the_record_cannot_be() -> None:
    record = a_record()
    assert record_problem(record) is None
    assert record_problem({**record, "api_calls": True}) == "field 'api_calls' missing or of the wrong type"
    assert record_problem({**record, "finish_reason": None}) is None  # optional, but present
    missing = {key: value for key, value in record.items() if key != "finish_reason"}
    assert record_problem(missing) == "field 'finish_reason' missing or of the wrong type"
    older = {key: value for key, value in record.items() if key not in ("sample", "score")}
    assert record_problem(older) is None  # fields with defaults: records of older runs lack them
    assert (
        record_problem({**record, "usage": {"prompt_tokens": 1}})
        == "field 'usage' lacks its 'completion_tokens'"
    )
    assert record_problem({**record, "work_id": "other.0"}) is not None


def test_a_field_added_to_the_record_reaches_every_format(with_temperature: None, tmp_path: Path) -> None:
    record = a_record(temperature=0.7)
    assert record_problem(record) is None
    lacking = a_record()
    assert record_problem(lacking) == "field 'temperature' missing or of the wrong type"
    assert record_problem({**record, "temperature": "hot"}) is not None

    ShareGPTWriter().write([record], tmp_path / "sharegpt.jsonl")
    assert json.loads((tmp_path / "sharegpt.jsonl").read_text())["temperature"] == 0.7
    assert HermesWriter().row(record)["temperature"] == 0.7
    assert OpenAIWriter().row(record)["temperature"] == 0.7

    import pyarrow.parquet as pq

    ParquetWriter().write([record], tmp_path / "t.parquet")
    table = pq.read_table(tmp_path / "t.parquet")
    assert str(table.schema.field("temperature").type) == "double"
    assert table.column("temperature").to_pylist() == [0.7]
    assert table.column("tool_stats").to_pylist()[0][0] == {
        "tool": "execute_code",
        "count": 0,
        "success": 0,
        "failure": 0,
    }

    import datasets

    declared = features(datasets)
    assert declared["temperature"] == datasets.Value("float64")
    assert declared["score"]["checks"] == datasets.List(
        {
            "scorer": datasets.Value("string"),
            "passed": datasets.Value("bool"),
            "value": datasets.Value("float64"),
            "detail": datasets.Value("string"),
        }
    )
    assert "| `temperature` | number | The sampling temperature. |" in fields_markdown()
