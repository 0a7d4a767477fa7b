"""Built-in token counters: an offline estimate, and a Hugging Face ``tokenizers`` tokenizer.

The tokenizer is read from a local ``tokenizer.json`` (or a directory holding one) or from the
files of a model already in the local Hugging Face cache. Nothing is fetched from the network and
no repository code runs: ``tokenizers`` reads the JSON description of the tokenizer and nothing
else, which is why ``trust_remote_code`` never comes into it.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from trajkit.compress.base import StrictSettings, TokenCounter

if TYPE_CHECKING:
    from tokenizers import Tokenizer

# Chat templates whose per-turn wrapping can be recognised from the tokenizer's special tokens:
# the text around one turn's content, with ROLE standing for a role name.
KNOWN_TEMPLATES = {
    "chatml": ("<|im_start|>", "<|im_start|>ROLE\n", "<|im_end|>\n"),
    "llama3": ("<|start_header_id|>", "<|start_header_id|>ROLE<|end_header_id|>\n\n", "<|eot_id|>"),
}


class TokenizerError(ValueError):
    """The tokenizer cannot be loaded as configured; the message says what to change."""


class EstimateCounter(TokenCounter):
    """Characters divided by a ratio: no download, no dependency, about right for English and code."""

    name = "estimate"
    description = "offline estimate: characters / chars_per_token, plus a per-turn overhead"

    class Settings(StrictSettings):
        chars_per_token: float = Field(4.0, gt=0, description="characters per token")
        turn_overhead: int = Field(4, ge=0, description="tokens a chat template adds per turn")

    settings: Settings

    @property
    def turn_overhead(self) -> int:
        return self.settings.turn_overhead

    def count_text(self, text: str) -> int:
        return math.ceil(len(text) / self.settings.chars_per_token)

    def describe(self) -> str:
        return f"estimate({self.settings.chars_per_token:g} chars/token)"


class HFTokenizerCounter(TokenCounter):
    """A ``tokenizers`` tokenizer from a local file or the local Hugging Face cache."""

    name = "hf"
    description = "Hugging Face tokenizer: a tokenizer.json, a directory holding one, or a cached model id"
    accepts_source = True

    class Settings(StrictSettings):
        source: str = Field(
            description="tokenizer.json, a directory holding one, or a model id in the HF cache"
        )
        revision: str | None = Field(None, description="the cached revision of a model id (default: main)")
        turn_overhead: int | None = Field(
            None,
            ge=0,
            description="tokens the chat template adds per turn; default: detected from the tokenizer's "
            "special tokens (ChatML, Llama 3), else 0",
        )

    settings: Settings

    def __init__(self, settings: StrictSettings) -> None:
        super().__init__(settings)
        self.path = resolve_tokenizer_file(self.settings.source, self.settings.revision)
        self.tokenizer = _load(self.path)
        self.template: str | None = None
        self._overhead = self._detect_overhead() if self.settings.turn_overhead is None else None

    @property
    def turn_overhead(self) -> int:
        if self.settings.turn_overhead is not None:
            return self.settings.turn_overhead
        return self._overhead or 0

    def count_text(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def count(self, turns: list[dict[str, Any]]) -> int:
        from trajkit.compress.base import turn_text

        # One call for the whole conversation: the Rust side tokenizes the batch in parallel.
        texts = [turn_text(turn) for turn in turns]
        encoded = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        return sum(len(e.ids) for e in encoded) + self.turn_overhead * len(turns)

    def describe(self) -> str:
        template = f", {self.template} template" if self.template else ""
        return f"hf({self.settings.source}{template})"

    def _detect_overhead(self) -> int:
        """Mean tokens of the known template's wrapping over the four roles, if the template is known."""
        vocabulary = self.tokenizer.get_vocab(with_added_tokens=True)
        for template, (marker, head, tail) in KNOWN_TEMPLATES.items():
            if marker in vocabulary:
                self.template = template
                roles = ("system", "user", "assistant", "tool")
                sizes = [self.count_text(head.replace("ROLE", name) + tail) for name in roles]
                return round(sum(sizes) / len(sizes))
        return 0


def resolve_tokenizer_file(source: str, revision: str | None = None) -> Path:
    """The ``tokenizer.json`` that ``source`` names, found without any network access."""
    path = Path(source).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        if (path / "tokenizer.json").is_file():
            return path / "tokenizer.json"
        raise TokenizerError(f"{path} holds no tokenizer.json")
    if source.startswith((".", "/", "~")) or source.endswith(".json"):
        raise TokenizerError(f"tokenizer file {source} does not exist")
    return _from_cache(source, revision)


def _from_cache(model_id: str, revision: str | None) -> Path:
    try:
        from huggingface_hub import try_to_load_from_cache
        from huggingface_hub.constants import HF_HUB_CACHE
    except ImportError:
        raise TokenizerError(
            f"{model_id!r} is not a file; reading a model from the Hugging Face cache needs "
            "huggingface_hub (pip install 'trajkit[tokenizers]')"
        ) from None
    # try_to_load_from_cache reads the cache directory only: it never makes a request.
    found = try_to_load_from_cache(model_id, "tokenizer.json", revision=revision)
    if isinstance(found, str) and os.path.isfile(found):
        return Path(found)
    raise TokenizerError(
        f"{model_id!r} is neither a tokenizer file nor a model with a tokenizer.json in the local "
        f"Hugging Face cache ({HF_HUB_CACHE}); download it first (huggingface-cli download {model_id} "
        "tokenizer.json) or pass the path of a tokenizer.json"
    )


def _load(path: Path) -> Tokenizer:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise TokenizerError(
            "a Hugging Face tokenizer needs the tokenizers package: pip install 'trajkit[tokenizers]'"
        ) from None
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust side raises its own exception type
        raise TokenizerError(f"{path}: not a tokenizers tokenizer.json ({exc})") from None
