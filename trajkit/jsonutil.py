"""JSON lines for the ledger and the merged outputs: orjson where it is exact, the standard library
where it is not.

orjson is several times faster than ``json`` but refuses some values ``json`` writes (strings
with lone surrogates, which model output decoded from JSON can hold, and integers beyond 64
bits), and reads an integer beyond 64 bits as a float without a word. So:

- :func:`dumps_bytes` writes orjson's compact JSON, and what orjson refuses with ``json.dumps``
  in its default spelling (a space after ``:`` and ``,``; ASCII only, so a lone surrogate is kept
  as its ``\\ud800`` escape and the line is still valid UTF-8). No value is ever refused that
  ``json.dumps`` would write.
- :func:`loads` reads compact text (orjson's, which holds no integer beyond 64 bits) with orjson,
  and text in ``json.dumps``' spelling (the fallback above, and every ledger written before
  orjson was used) with ``json.loads``, so every value reads back exactly as it was written.

Both are deterministic: the same value always gives the same bytes.
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def dumps_bytes(value: Any) -> bytes:
    """``value`` as UTF-8 JSON text: orjson's compact form, or ``json.dumps`` where orjson refuses."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(value).encode("ascii")


def dumps_line(value: Any) -> bytes:
    """:func:`dumps_bytes` followed by a newline: one JSONL line."""
    try:
        return orjson.dumps(value, option=orjson.OPT_APPEND_NEWLINE)
    except orjson.JSONEncodeError:
        return json.dumps(value).encode("ascii") + b"\n"


def loads(data: bytes) -> Any:
    """Parse JSON text written by :func:`dumps_bytes` or by ``json.dumps``, exactly.

    Compact text goes to orjson; text with a space after its first key (``json.dumps``' default
    spelling, which may hold integers orjson would turn into floats) and anything orjson
    rejects (NaN, lone surrogate escapes) go to ``json.loads``.
    """
    colon = data.find(b'":')
    if colon > 0 and data[colon + 2 : colon + 3] != b" ":
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data)
