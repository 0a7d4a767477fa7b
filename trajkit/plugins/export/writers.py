"""Built-in output writers: ``sharegpt`` (the default), ``hermes``, ``openai`` and ``parquet``.

Trainers load these files through Arrow (``datasets.load_dataset``), which keeps one type per
column: a column whose shape differs between rows fails to load, or loads as a union of every
shape with nulls filled in. So the writers give every row of a run the same columns with the
same types, and every top-level key is present in every row, null where it does not apply.
Values whose shape varies between rows are handled one of two ways:

- As JSON strings: everything variable in the ``parquet`` rows. One string column, any content.
- As JSON values that ``datasets`` (5 and later) types as ``Json`` (stored as JSON text, handed
  back as the object): the ``openai`` rows' messages (keys present only where they apply) with
  their tool-call ``arguments`` objects, the offered tools' ``parameters``, and ``metadata`` (the
  row's own fields, any names and types), kept in every format. ``trajkit export --format hf``
  declares these features explicitly, so the saved dataset does not depend on inference.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from trajkit import hookimpl
from trajkit.config.settings import StrictSettings
from trajkit.jsonutil import dumps_line
from trajkit.manager import PluginError, load_plugins
from trajkit.record.filters import Record
from trajkit.record.schema import arrow_rows, arrow_schema, carried_fields, with_defaults
from trajkit.record.writers import OutputWriter

log = logging.getLogger("trajkit")

ToolSchema = dict[str, Any]
"""A tool as the OpenAI ``tools`` list has it: ``{"type": "function", "function": {...}}``."""


@hookimpl
def trajkit_writers() -> list[type[OutputWriter]]:
    return [ShareGPTWriter, HermesWriter, OpenAIWriter, ParquetWriter]


class ShareGPTWriter(OutputWriter):
    name = "sharegpt"
    default = True
    filename = "trajectories.jsonl"
    description = "trajectory records with ShareGPT conversations (the default)"

    def write(self, records: Iterable[Record], path: Path) -> int:
        return write_jsonl(records, path)


def write_jsonl(rows: Iterable[Mapping[str, Any]], path: Path) -> int:
    """One compact JSON line per row (orjson; see :mod:`trajkit.jsonutil`), deterministic."""
    count = 0
    with path.open("wb") as out:
        for row in rows:
            out.write(dumps_line(row))
            count += 1
    return count


def scalar_fields(record: Record) -> dict[str, Any]:
    """The record fields a derived row carries beside its conversation
    (:func:`trajkit.record.schema.carried_fields`); those that records of older runs lack at
    their defaults."""
    full = with_defaults(record)
    return {key: full.get(key) for key in carried_fields()}


# -- writers that render the offered tools --------------------------------------------------------


class ToolSchemaWriter(OutputWriter):
    """A writer whose rows carry the schemas of the tools offered to each prompt.

    Records name the offered tools and the key of their schemas (``tool_schemas_key``); the run
    saves each distinct set of schemas once, in ``tools.json``, and the merge and ``trajkit export``
    hand those to the writer (:meth:`use_tool_schemas`), so the rows say exactly what the model
    saw, whatever plugins are installed now. Records without a saved set (runs made before
    ``tools.json``, served sessions) take the schemas of the installed toolset plugins, loaded on
    first use; a tool that is not installed is written with an empty parameter schema and a
    warning, rather than failing the whole export.
    """

    renders_tools = True

    def __init__(self, settings: StrictSettings | Mapping[str, Any] | None = None) -> None:
        super().__init__(settings)
        self._saved: dict[str, dict[str, ToolSchema]] = {}
        self._installed: dict[str, ToolSchema] | None = None
        self._warned: set[str] = set()

    def use_tool_schemas(self, saved: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
        """The run's saved schema sets (``tools.json``): key -> the schemas of one offer."""
        self._saved = {
            key: {schema["function"]["name"]: dict(schema) for schema in schemas}
            for key, schemas in saved.items()
        }

    def schemas_for(self, record: Record) -> list[ToolSchema]:
        """The schemas of the tools offered to the record's prompt, in ``tools_offered`` order."""
        names: Sequence[str] = record["tools_offered"]
        saved = self._saved.get(record.get("tool_schemas_key") or "")
        if saved is not None and all(name in saved for name in names):
            return [saved[name] for name in names]
        if self._installed is None:
            self._installed = installed_tool_schemas()
        schemas = []
        for name in names:
            schema = self._installed.get(name)
            if schema is None:
                if name not in self._warned:
                    log.warning(
                        "%s writer: tool %r is not installed; written without its schema", self.name, name
                    )
                    self._warned.add(name)
                schema = _bare_schema(name)
            schemas.append(schema)
        return schemas


def installed_tool_schemas() -> dict[str, ToolSchema]:
    """Every tool the installed plugins register, by name."""
    return {name: tool.schema() for name, tool in load_plugins().tools.items()}


def _bare_schema(name: str) -> ToolSchema:
    return {
        "type": "function",
        "function": {"name": name, "description": "", "parameters": {"type": "object", "properties": {}}},
    }


# -- hermes -------------------------------------------------------------------------------------

TOOLS_PREAMBLE = (
    "You may call the functions whose signatures are listed as a JSON list inside <tools></tools>. "
    "To call one, write a JSON object with its name and its arguments object inside "
    "<tool_call></tool_call>; several calls may follow one another. Each result comes back inside "
    "<tool_response></tool_response>."
)


class HermesWriter(ToolSchemaWriter):
    """The reference's training strings: one ``{from, value}`` list per row, tags inside the text.

    The system turn is the run's saved system prompt followed by the offered tools as a
    ``<tools>`` JSON list (what a model trained on these strings is then prompted with). Each gpt turn is ``<think>reasoning</think>`` (empty when the turn had
    none, so every turn has the same layout), then the content, then one ``<tool_call>`` block per
    call. The answers to one turn's calls are merged into one tool turn of ``<tool_response>``
    blocks, in call order, as the reference does.
    """

    name = "hermes"
    filename = "trajectories.hermes.jsonl"
    description = "Hermes training strings: <tools>, <think>, <tool_call> and <tool_response> in the text"

    def write(self, records: Iterable[Record], path: Path) -> int:
        return write_jsonl((self.row(record) for record in records), path)

    def row(self, record: Record) -> dict[str, Any]:
        tools = self.schemas_for(record)
        return {"conversations": hermes_turns(record["conversations"], tools), **scalar_fields(record)}


def hermes_turns(turns: Sequence[Mapping[str, Any]], tools: Sequence[ToolSchema]) -> list[dict[str, str]]:
    rendered: list[dict[str, str]] = []
    responses: list[str] = []
    for turn in turns:
        if turn["from"] == "tool":
            responses.append(_tool_response(turn))
            continue
        if responses:
            rendered.append({"from": "tool", "value": "\n".join(responses)})
            responses = []
        if turn["from"] == "system":
            rendered.append({"from": "system", "value": _system_with_tools(turn["value"], tools)})
        elif turn["from"] == "gpt":
            rendered.append({"from": "gpt", "value": _gpt_value(turn)})
        else:
            rendered.append({"from": turn["from"], "value": turn["value"]})
    if responses:
        rendered.append({"from": "tool", "value": "\n".join(responses)})
    if not rendered or rendered[0]["from"] != "system":
        rendered.insert(0, {"from": "system", "value": _system_with_tools("", tools)})
    return rendered


def _system_with_tools(prompt: str, tools: Sequence[ToolSchema]) -> str:
    listed = json.dumps([tool["function"] for tool in tools], ensure_ascii=False)
    block = f"{TOOLS_PREAMBLE}\n<tools>\n{listed}\n</tools>"
    return f"{prompt}\n\n{block}" if prompt else block


def _gpt_value(turn: Mapping[str, Any]) -> str:
    reasoning = turn.get("reasoning") or ""
    parts = [f"<think>\n{reasoning}\n</think>" if reasoning else "<think>\n</think>"]
    if turn["value"].strip():
        parts.append(turn["value"])
    for call in turn.get("tool_calls") or []:
        body = {"name": call["name"], "arguments": _arguments(call["arguments"])}
        parts.append(f"<tool_call>\n{json.dumps(body, ensure_ascii=False)}\n</tool_call>")
    return "\n".join(parts)


def _arguments(raw: str) -> Any:
    """The arguments object the model sent; the raw text if it was not JSON (kept, not guessed)."""
    try:
        return json.loads(raw) if raw.strip() else {}
    except ValueError:
        return raw


def _tool_response(turn: Mapping[str, Any]) -> str:
    body: dict[str, Any] = {}
    if turn.get("tool_call_id") is not None:
        body["tool_call_id"] = turn["tool_call_id"]
    body["name"] = turn.get("name")
    body["content"] = _json_or_text(turn["value"])
    return f"<tool_response>\n{json.dumps(body, ensure_ascii=False)}\n</tool_response>"


def _json_or_text(content: str) -> Any:
    """Structured tool output (a JSON object or list) embedded as JSON, as the reference does."""
    if content.lstrip().startswith(("{", "[")):
        try:
            return json.loads(content)
        except ValueError:
            pass
    return content


# -- openai ---------------------------------------------------------------------------------------

OPENAI_ROLES = {"system": "system", "human": "user", "gpt": "assistant", "tool": "tool"}


class OpenAIWriter(ToolSchemaWriter):
    """OpenAI chat messages plus a ``tools`` column: what TRL's SFTTrainer, Axolotl's
    ``chat_template`` dataset type and LLaMA-Factory's ``openai`` formatting read (each checked
    against the trainer's own source in ``docs/chat_templates.md``).

    Schema choices, each so that every row loads through ``datasets`` with one type per column and
    the trainers hand the template exactly what the model saw:

    - ``function.arguments`` is the arguments object the model sent, not the JSON string of the
      OpenAI wire format: most templates (Qwen2.5, Llama 3.1, Mistral) apply ``tojson`` to it
      whatever it is, so a string comes out double-encoded. Arguments that were not JSON at all
      stay the string the model sent. A template that concatenates arguments as strings gets them
      from ``trajkit export --chat_template`` (:mod:`trajkit.plugins.export.chat_templates`).
    - ``tools`` is the list of the offered tools' schemas. Axolotl's loader accepts only a list;
      TRL and LLaMA-Factory take a list or a JSON string, so no trainer needs the string.
    - A message has only the keys that apply to it, never a null: ``reasoning_content`` on an
      assistant turn with reasoning (Axolotl's default thinking field and the key reasoning
      templates read), ``tool_calls`` when it called tools, ``tool_call_id`` and ``name`` on a
      tool result. Templates test keys with ``is defined`` or ``in``, and an explicit null breaks
      every renderer that does not drop null keys first. ``datasets`` 5 reads such messages (and
      the tools' ``parameters``) as ``Json`` values, each row's own, with no keys of other rows
      filled in.
    - ``metadata`` is the record's (the row's own fields, the model, the batch), as in sharegpt.
    """

    name = "openai"
    filename = "trajectories.openai.jsonl"
    description = "OpenAI messages with tool_calls, reasoning_content and a tools column (TRL, Axolotl)"

    def write(self, records: Iterable[Record], path: Path) -> int:
        return write_jsonl((self.row(record) for record in records), path)

    def row(self, record: Record) -> dict[str, Any]:
        return {
            "messages": [openai_message(turn) for turn in record["conversations"]],
            "tools": self.schemas_for(record),
            **scalar_fields(record),
        }


def openai_message(turn: Mapping[str, Any]) -> dict[str, Any]:
    """One ShareGPT turn as an OpenAI message with only the keys that apply (no nulls)."""
    message: dict[str, Any] = {"role": OPENAI_ROLES[turn["from"]], "content": turn["value"]}
    if turn["from"] == "gpt":
        if turn.get("reasoning"):
            message["reasoning_content"] = turn["reasoning"]
        calls = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": _arguments(c["arguments"])},
            }
            for c in turn.get("tool_calls") or []
        ]
        if calls:
            message["tool_calls"] = calls
    elif turn["from"] == "tool":
        for key in ("tool_call_id", "name"):
            if turn.get(key) is not None:
                message[key] = turn[key]
    return message


# -- parquet --------------------------------------------------------------------------------------


class ParquetWriter(OutputWriter):
    """The sharegpt rows as Parquet, with a fixed schema and every variably-shaped part made safe.

    The schema is declared up front rather than inferred, so a column that happens to be null in
    the first row group (``finish_reason``, ``sandbox.image``) still has its real type. Shapes that
    vary are flattened: ``metadata`` (the row's own fields, any names and types) is a JSON
    string, and ``tool_stats`` / ``tool_error_counts`` (keyed by tool name, so their shape depends
    on the run's tools) are lists of ``{tool, ...}`` structs, sorted by tool. Records are written
    in row groups of bounded size, so memory stays flat however large the run.
    """

    name = "parquet"
    filename = "trajectories.parquet"
    description = "the sharegpt rows as Parquet with one fixed schema (needs the parquet extra)"

    rows_per_group: ClassVar[int] = 1000
    bytes_per_group: ClassVar[int] = 64 << 20
    """Text held before a row group is flushed (an estimate from the turns' text)."""

    def __init__(self, settings: StrictSettings | Mapping[str, Any] | None = None) -> None:
        super().__init__(settings)
        _pyarrow()  # fail when the run starts, not after every prompt has been paid for

    def write(self, records: Iterable[Record], path: Path) -> int:
        pa, pq = _pyarrow()
        schema = arrow_schema(pa)
        row = arrow_rows()
        count = 0
        with pq.ParquetWriter(str(path), schema) as out:
            for batch in _batches(records, self.rows_per_group, self.bytes_per_group):
                out.write_table(pa.Table.from_pylist([row(r) for r in batch], schema=schema))
                count += len(batch)
        return count


def _batches(records: Iterable[Record], max_rows: int, max_bytes: int) -> Iterator[list[Record]]:
    batch: list[Record] = []
    size = 0
    for record in records:
        batch.append(record)
        size += sum(len(t["value"]) + len(t.get("reasoning") or "") for t in record["conversations"])
        if len(batch) >= max_rows or size >= max_bytes:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


PARQUET_MISSING = "the parquet writer needs pyarrow: pip install 'trajkit[parquet]'"


def _pyarrow() -> tuple[Any, Any]:
    """pyarrow and pyarrow.parquet, imported only when Parquet is written (an optional extra)."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError as exc:
        raise PluginError(f"{PARQUET_MISSING} ({exc})") from exc
    return pyarrow, pyarrow.parquet
