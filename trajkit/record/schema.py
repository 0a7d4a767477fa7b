"""The trajectory record's shape in every place that holds it, derived from its one definition,
:class:`trajkit.record.trajectory.TrajectoryRecord`.

A field added to the model (with its type and docstring) reaches, without further change: the
ledger's check of each line (:func:`record_problem`), the fields the derived formats carry
(:func:`carried_fields`, ``json_schema_extra={"carried": True}``), the Parquet writer's Arrow
schema and rows (:func:`arrow_schema`, :func:`arrow_row`), the Hugging Face export's features
(:func:`hf_features`) and the field table of ``docs/outputs.md`` (:func:`fields_markdown`).

The model is looked up when each function is called, so what they derive always follows it.
"""

from __future__ import annotations

import functools
import json
import re
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from trajkit.config.settings import unwrap_optional
from trajkit.record import trajectory as records

JSONKinds = tuple[type, ...]


def _model() -> type[BaseModel]:
    return records.TrajectoryRecord


def _extra(field: FieldInfo) -> dict[str, Any]:
    return field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _name(name: str, field: FieldInfo) -> str:
    return field.alias or name


# -- the ledger ------------------------------------------------------------------------------------


def _json_kinds(annotation: Any) -> JSONKinds:
    """The Python types of the parsed JSON a value of ``annotation`` may be."""
    inner, optional = unwrap_optional(annotation)
    origin = typing.get_origin(inner) or inner
    kinds: JSONKinds = {
        str: (str,),
        int: (int,),
        float: (int, float),
        bool: (bool,),
        list: (list,),
        dict: (dict,),
        Literal: (str,),
    }.get(origin, (dict,) if _is_model(inner) else (object,))
    return (*kinds, type(None)) if optional else kinds


@functools.cache
def _checks(model: type[BaseModel]) -> tuple[tuple[str, JSONKinds, tuple[tuple[str, JSONKinds], ...]], ...]:
    """Per required field of ``model``: its key, JSON kinds, and those of its own required fields
    when it is a model itself (one level: ``usage``'s token counts, ``sandbox``'s backend)."""
    checks = []
    for name, field in model.model_fields.items():
        if not field.is_required():
            continue  # records of older runs may lack it
        inner, _ = unwrap_optional(field.annotation)
        nested = tuple(
            (_name(n, f), _json_kinds(f.annotation))
            for n, f in (inner.model_fields.items() if _is_model(inner) else ())
            if f.is_required()
        )
        checks.append((_name(name, field), _json_kinds(field.annotation), nested))
    return tuple(checks)


def _fits(value: Any, kinds: JSONKinds) -> bool:
    # a bool is an int to Python, never to the record
    return isinstance(value, kinds) and not (type(value) is bool and bool not in kinds)


def record_problem(record: Any) -> str | None:
    """Why ``record`` (a parsed ledger line) is not a trajectory record, or None."""
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not a record"
    for key, kinds, nested in _checks(_model()):
        value = record.get(key)
        if key not in record or not _fits(value, kinds):
            return f"field {key!r} missing or of the wrong type"
        if isinstance(value, dict):
            for inner, inner_kinds in nested:
                if inner not in value or not _fits(value[inner], inner_kinds):
                    return f"field {key!r} lacks its {inner!r}"
    prompt_id, dot, occurrence = record["work_id"].rpartition(".")
    if not dot or prompt_id != record["prompt_id"] or not (occurrence.isascii() and occurrence.isdigit()):
        return f"work_id {record['work_id']!r} does not belong to prompt_id {record['prompt_id']!r}"
    return None


# -- what derived formats carry --------------------------------------------------------------------


def carried_fields() -> tuple[str, ...]:
    """The record fields that the derived formats (hermes, openai, chat-template exports) carry
    beside the conversation, in the record's order."""
    return tuple(_name(n, f) for n, f in _model().model_fields.items() if _extra(f).get("carried"))


def with_defaults(record: Mapping[str, Any]) -> dict[str, Any]:
    """``record`` with the fields that records of older runs lack set to their defaults."""
    full = dict(record)
    for name, field in _model().model_fields.items():
        key = _name(name, field)
        if key not in full and not field.is_required():
            fallback = _extra(field).get("default_from")
            full[key] = full.get(fallback) if fallback else field.get_default(call_default_factory=True)
    return full


# -- Arrow (the parquet writer) --------------------------------------------------------------------

_ARROW_SCALARS = {str: "string", int: "int64", float: "float64", bool: "bool_"}


def _keyed(field: FieldInfo) -> tuple[str, str] | None:
    """A mapping by name stored as a list of rows: (the key's column, the value's column)."""
    extra = _extra(field)
    return (extra["keyed_by"], extra.get("value_name", "value")) if "keyed_by" in extra else None


def _arrow_type(pa: Any, annotation: Any, field: FieldInfo | None = None) -> Any:
    inner, _ = unwrap_optional(annotation)
    origin = typing.get_origin(inner)
    if origin is Literal or inner in _ARROW_SCALARS:
        return getattr(pa, _ARROW_SCALARS.get(inner, "string"))()
    if origin is list:
        return pa.list_(_arrow_type(pa, typing.get_args(inner)[0]))
    if _is_model(inner):
        return pa.struct(
            [(_name(n, f), _arrow_type(pa, f.annotation, f)) for n, f in inner.model_fields.items()]
        )
    if origin is dict:
        keyed = _keyed(field) if field is not None else None
        value = typing.get_args(inner)[1]
        if keyed is None or value is Any:
            return pa.string()  # any names and types: a JSON string
        key, value_name = keyed
        columns = (
            [(_name(n, f), _arrow_type(pa, f.annotation, f)) for n, f in value.model_fields.items()]
            if _is_model(value)
            else [(value_name, _arrow_type(pa, value))]
        )
        return pa.list_(pa.struct([(key, pa.string()), *columns]))
    raise TypeError(f"no Arrow type for the record's {annotation!r}")


def arrow_schema(pa: Any) -> Any:
    """The Arrow schema of a record written as Parquet: the record's columns, in its order."""
    model = _model()
    return pa.schema([(_name(n, f), _arrow_type(pa, f.annotation, f)) for n, f in model.model_fields.items()])


def _arrow_converters() -> dict[str, Callable[[Any], Any]]:
    converters: dict[str, Callable[[Any], Any]] = {}
    for name, field in _model().model_fields.items():
        inner, _ = unwrap_optional(field.annotation)
        if typing.get_origin(inner) is not dict:
            continue
        keyed = _keyed(field)
        if keyed is None or typing.get_args(inner)[1] is Any:
            converters[_name(name, field)] = _json_text
        else:
            converters[_name(name, field)] = functools.partial(_rows, *keyed)
    return converters


def _json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _rows(key: str, value_name: str, mapping: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [
        {key: name, **(value if isinstance(value, dict) else {value_name: value})}
        for name, value in sorted(mapping.items())
    ]


def arrow_row(
    record: Mapping[str, Any], converters: Mapping[str, Callable[[Any], Any]] | None = None
) -> dict[str, Any]:
    """A record as a row of :func:`arrow_schema`: mappings by name as lists of rows, mappings of
    any content as JSON text, fields older records lack at their defaults."""
    converters = _arrow_converters() if converters is None else converters
    row = with_defaults(record)
    for key, convert in converters.items():
        row[key] = convert(row[key])
    return row


def arrow_rows() -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    """:func:`arrow_row` with the converters worked out once, for many records."""
    return functools.partial(arrow_row, converters=_arrow_converters())


# -- Hugging Face features (the hf export) ---------------------------------------------------------


def _feature(datasets: Any, annotation: Any) -> Any:
    inner, _ = unwrap_optional(annotation)
    origin = typing.get_origin(inner)
    if origin is Literal or inner in _ARROW_SCALARS:
        return datasets.Value(_ARROW_SCALARS.get(inner, "string").removesuffix("_"))
    if origin is list:
        return datasets.List(_feature(datasets, typing.get_args(inner)[0]))
    if _is_model(inner):
        return {_name(n, f): _feature(datasets, f.annotation) for n, f in inner.model_fields.items()}
    if origin is dict:
        return datasets.Json()  # each row's own keys
    raise TypeError(f"no feature for the record's {annotation!r}")


def hf_features(datasets: Any) -> dict[str, Any]:
    """The features of the carried fields (:func:`carried_fields`) in a ``datasets`` dataset."""
    model = _model()
    return {
        _name(n, f): _feature(datasets, f.annotation)
        for n, f in model.model_fields.items()
        if _extra(f).get("carried")
    }


# -- the manual ------------------------------------------------------------------------------------


def fields_markdown() -> str:
    """The record's fields as the Markdown table of ``docs/outputs.md``."""
    from trajkit.config.settings import documented

    lines = ["| field | type | |", "|---|---|---|"]
    for name, field in documented(_model()).model_fields.items():
        kind = _type_text(field.annotation)
        description = " ".join((field.description or "").split()).replace("|", "\\|")
        description = re.sub(r":\w+:`", "`", description).replace("``", "`")  # reST to Markdown
        lines.append(f"| `{_name(name, field)}` | {kind} | {description} |")
    return "\n".join(lines) + "\n"


def _type_text(annotation: Any) -> str:
    inner, optional = unwrap_optional(annotation)
    origin = typing.get_origin(inner)
    if origin is Literal:
        text = " or ".join(f'"{a}"' for a in typing.get_args(inner))
    elif origin is list:
        text = f"list of {_type_text(typing.get_args(inner)[0])}"
    elif origin is dict:
        value = typing.get_args(inner)[1]
        text = "object" if value is Any else f"object of {_type_text(value)}"
    elif _is_model(inner):
        text = "{" + ", ".join(_name(n, f) for n, f in inner.model_fields.items()) + "}"
    else:
        text = {str: "string", int: "integer", float: "number", bool: "boolean"}.get(inner, str(inner))
    return f"{text} or null" if optional else text
