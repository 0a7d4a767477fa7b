"""What an MCP server's tools become for the model: names the model API takes, schemas checked
once, and call results as the text of a tool turn."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from trajkit.sandbox import cap_text

NAME_RULE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
"""Tool names the OpenAI API accepts."""
MAX_NAME = 64


def model_name(name: str, taken: set[str]) -> str:
    """``name`` if the model API accepts it and it is free, else a name it accepts: other
    characters become ``_``, and a long or taken one is cut and ends with a digest of the
    original, so the same server always gets the same names."""
    if NAME_RULE.match(name) and name not in taken:
        return name
    cleaned = re.sub(r"[^a-zA-Z0-9_-]", "_", name) or "tool"
    if len(cleaned) <= MAX_NAME and cleaned not in taken:
        return cleaned
    digest = hashlib.sha256(name.encode()).hexdigest()
    for size in range(8, 65):
        candidate = f"{cleaned[: MAX_NAME - size - 1]}_{digest[:size]}"
        if candidate not in taken:
            return candidate
    raise ValueError(f"no free name for {name!r}")  # 57 digests of one name cannot all be taken


def schema_problem(schema: Any) -> str | None:
    """Why ``schema`` cannot be offered as a tool's arguments; None when it can."""
    if not isinstance(schema, dict):
        return "its input schema is not a JSON object"
    if schema.get("type") != "object":
        return f"its input schema describes {schema.get('type')!r}, not an object of arguments"
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import validator_for

    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        return f"its input schema is not valid JSON Schema: {exc.message}"
    return None


def result_text(result: Any, cap: int) -> tuple[str, bool]:
    """A ``CallToolResult`` as the text of a tool turn (at most ``cap`` bytes), and whether the
    server said the call failed (``isError``)."""
    parts = [_block_text(block) for block in result.content or ()]
    texts = [text for text in parts if text]
    if result.structured_content is not None and not any(
        getattr(block, "type", "") == "text" for block in result.content or ()
    ):
        texts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return cap_text("\n".join(texts), cap), bool(result.is_error)


def _block_text(block: Any) -> str:
    kind = getattr(block, "type", "")
    if kind == "text":
        return str(block.text)
    if kind in ("image", "audio"):
        size = len(block.data) * 3 // 4  # base64
        return f"[{kind} {block.mime_type}, {size} bytes]"
    if kind == "resource_link":
        described = f": {block.description}" if block.description else ""
        return f"[resource {block.uri} ({block.name}){described}]"
    if kind == "resource":
        resource = block.resource
        text = getattr(resource, "text", None)
        if text is not None:
            return f"[resource {resource.uri}]\n{text}"
        size = len(getattr(resource, "blob", "")) * 3 // 4
        return f"[resource {resource.uri} {resource.mime_type or 'application/octet-stream'}, {size} bytes]"
    return f"[{kind or 'unknown'} content]"
