"""Built-in token counters: ``estimate`` (offline, the default) and ``hf`` (a local tokenizer)."""

from __future__ import annotations

from collections.abc import Sequence

from trajkit import hookimpl
from trajkit.compress.base import TokenCounter


@hookimpl
def trajkit_token_counters() -> Sequence[type[TokenCounter]]:
    from trajkit.compress.counters import EstimateCounter, HFTokenizerCounter

    return [EstimateCounter, HFTokenizerCounter]
