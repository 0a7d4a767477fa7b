"""Helpers for tests that drive the real ``trajkit`` CLI in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any


def write_jsonl(path: Path, rows: list[dict[str, Any] | str]) -> Path:
    with path.open("w") as handle:
        for row in rows:
            handle.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def trajkit(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m trajkit ARGS`` and return the finished process (never raises on exit code)."""
    full_env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "trajkit", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def install_fake_distribution(site: Path, dist: str, module: str, source: str, entry_name: str) -> None:
    """A real installed distribution as importlib.metadata sees one: a module plus its .dist-info."""
    (site / f"{module}.py").write_text(textwrap.dedent(source))
    info = site / f"{dist.replace('-', '_')}-0.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.3\n")
    (info / "entry_points.txt").write_text(f"[trajkit]\n{entry_name} = {module}\n")


def plugin_env(tmp_path: Path, name: str, source: str) -> dict[str, str]:
    """The environment of a ``trajkit`` subprocess that sees ``source`` installed as the plugin
    package ``trajkit-NAME`` (entry point ``NAME``)."""
    site = tmp_path / "site"
    site.mkdir()
    install_fake_distribution(site, f"trajkit-{name}", f"trajkit_{name}", source, name)
    return {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}


def build_tokenizer(
    directory: Path, template: str, special: dict[str, str], extra_special: list[str] | None = None
) -> None:
    """A byte-level tokenizer (every text round-trips) with the model's template and special tokens
    (``extra_special``: further special tokens, e.g. ChatML's ``<|im_start|>``), saved the way
    transformers saves a model's tokenizer; nothing is downloaded."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tokens = {**special, "pad_token": "<|pad|>"}
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, **tokens)
    tokenizer.add_special_tokens(tokens)
    if extra_special:
        tokenizer.add_special_tokens({"additional_special_tokens": list(extra_special)})
    tokenizer.chat_template = template
    tokenizer.save_pretrained(str(directory))
