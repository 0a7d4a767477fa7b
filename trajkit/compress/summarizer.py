"""Summaries through the run's model client, cached so that no summary is paid for twice.

The cache is an SQLite file beside the output, keyed by a hash of the request (the region as
shown, the prompt holding the asking strategy's settings, and the model): a rerun, a resume after ``kill -9`` or another budget
that picks the same region reuses the summary. SQLite commits each summary as it arrives (WAL),
survives a killed process, and keeps memory flat however many summaries the file holds.
"""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
from pathlib import Path

import orjson

from trajkit.compress.base import SummaryResult, Turn
from trajkit.model import ModelClient, ModelError

ROLE_LABELS = {"system": "SYSTEM", "human": "USER", "gpt": "ASSISTANT", "tool": "TOOL RESULT"}


class SummaryCache:
    """Summaries by key in an SQLite file; one writer (the command's event loop)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.db = sqlite3.connect(path, isolation_level=None)  # autocommit: each put is durable
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")  # in WAL mode this survives a killed process
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS summaries "
            "(key TEXT PRIMARY KEY, text TEXT NOT NULL, model TEXT NOT NULL, cost REAL NOT NULL)"
        )

    def get(self, key: str) -> tuple[str, str] | None:
        row = self.db.execute("SELECT text, model FROM summaries WHERE key = ?", (key,)).fetchone()
        return None if row is None else (str(row[0]), str(row[1]))

    def put(self, key: str, text: str, model: str, cost: float) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO summaries (key, text, model, cost) VALUES (?, ?, ?, ?)",
            (key, text, model, cost),
        )

    def close(self) -> None:
        self.db.close()


class Summarizer:
    """Callable as :data:`trajkit.compress.base.Summarize`: region and settings in, summary out."""

    def __init__(self, client: ModelClient, model: str, cache: SummaryCache) -> None:
        self.client = client
        self.model = model
        self.cache = cache
        self.pending: dict[str, asyncio.Future[str]] = {}
        """Requests in flight by key: a second record asking for the same region waits for the first."""

    async def __call__(self, region: list[Turn], prompt: str, turn_chars: int) -> SummaryResult:
        excerpt = render_region(region, turn_chars)
        messages = [{"role": "system", "content": prompt}, {"role": "user", "content": excerpt}]
        key = cache_key(messages, self.model)
        cached = self.cache.get(key)
        if cached is not None:
            return SummaryResult(text=cached[0], model=cached[1])
        if key in self.pending:
            return SummaryResult(text=await asyncio.shield(self.pending[key]), model=self.model)
        future = self.pending[key] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_retrieved)  # nobody may be waiting: no "never retrieved" warning
        try:
            result = await self._ask(messages, key)
        except BaseException as exc:
            reason = str(exc) or type(exc).__name__
            self.pending.pop(key).set_exception(ModelError(f"the same region's summary failed: {reason}"))
            raise
        self.pending.pop(key).set_result(result.text)
        return result

    async def _ask(self, messages: list[dict[str, str]], key: str) -> SummaryResult:
        message = await self.client.complete(messages, [])
        text = message.content.strip()
        if not text:
            raise ModelError("the summariser answered with no text")
        cost = message.usage.cost or 0.0
        self.cache.put(key, text, self.model, cost)
        return SummaryResult(text=text, model=self.model, cost=cost, requests=1)


def _retrieved(future: asyncio.Future[str]) -> None:
    if not future.cancelled():
        future.exception()


def cache_key(messages: list[dict[str, str]], model: str) -> str:
    """The request itself: the region as shown, the prompt with the strategy's settings in it, the
    model. Settings that do not change the request (``keep_last``, the budget) do not change the key,
    so the same region asked for again is never paid for twice."""
    material = orjson.dumps({"messages": messages, "model": model}, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(material).hexdigest()


def render_region(region: list[Turn], turn_chars: int) -> str:
    """The region as the summariser reads it: each turn labelled, long values cut in the middle."""
    blocks = []
    for turn in region:
        label = ROLE_LABELS.get(str(turn.get("from")), str(turn.get("from")).upper())
        if turn.get("name"):
            label += f" ({turn['name']})"
        lines = [f"[{label}]", _clip(str(turn.get("value") or ""), turn_chars)]
        if turn.get("reasoning"):
            lines.insert(1, f"(reasoning) {_clip(str(turn['reasoning']), turn_chars // 2)}")
        for call in turn.get("tool_calls") or ():
            if isinstance(call, dict):
                lines.append(
                    f"(calls {call.get('name')}) {_clip(str(call.get('arguments') or ''), turn_chars)}"
                )
        blocks.append("\n".join(line for line in lines if line))
    return "\n\n".join(blocks)


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters left out ...]\n{text[-half:]}"
