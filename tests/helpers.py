"""Helpers for tests that drive the real ``trajkit`` CLI (in this process, or in a subprocess)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess as subprocess_
import sys
import textwrap
import time
import traceback
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
    *args: str, env: dict[str, str] | None = None, timeout: float = 120, subprocess: bool = False
) -> subprocess_.CompletedProcess[str]:
    """Run ``trajkit ARGS`` and return what a finished process would (never raises on exit code).

    In this process through click's ``CliRunner`` (``env`` set for the call, no API key of the
    caller's environment, empty stdin), or with ``subprocess=True`` as ``python -m trajkit`` for
    what only a process of its own shows: a signal or a kill, a fresh interpreter, plugins found
    through ``PYTHONPATH`` (``plugin_env``), environment variables a library reads when imported
    (``HF_*``). ``timeout`` bounds a subprocess only.
    """
    overrides: dict[str, str | None] = {k: None for k in os.environ if k.endswith("_API_KEY")}
    overrides.update(env or {})
    if subprocess:
        full_env = {k: v for k, v in {**os.environ, **overrides}.items() if v is not None}
        return subprocess_.run(
            [sys.executable, "-m", "trajkit", *args],
            capture_output=True,
            text=True,
            env=full_env,
            timeout=timeout,
            stdin=subprocess_.DEVNULL,
        )
    read_at_import = [k for k in overrides if k == "PYTHONPATH" or k.startswith("HF_")]
    if read_at_import:  # huggingface_hub reads HF_* once, when it is first imported
        raise ValueError(f"{read_at_import} reach a fresh interpreter only: pass subprocess=True")
    from click.testing import CliRunner

    from trajkit.cli import cli

    before = _process_state()
    result = CliRunner().invoke(cli, list(args), env=overrides, prog_name="trajkit")
    left = _left_behind(before)
    assert not left, f"trajkit {' '.join(args[:1])} left behind in the process: {left}"
    stderr = result.stderr
    if (
        result.exc_info is not None
        and result.exception is not None
        and not isinstance(result.exception, SystemExit)
    ):
        # What the interpreter would print for an uncaught exception.
        stderr += "".join(traceback.format_exception(*result.exc_info))
    return subprocess_.CompletedProcess(
        ["trajkit", *args], result.exit_code, stdout=result.stdout, stderr=stderr
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


def _left_behind(before: dict[str, set[str]]) -> dict[str, list[str]]:
    """What the process holds now and did not before. A model server running in this process (in a
    thread) closes its end of a connection once it reads the client's close, a moment after the
    command returned: sockets alone are looked at again for up to two seconds."""
    deadline = time.monotonic() + 2.0
    while True:
        after = _process_state()
        left = {kind: sorted(after[kind] - before[kind]) for kind in after if after[kind] - before[kind]}
        sockets_only = set(left) == {"open files"} and all("socket:" in f for f in left["open files"])
        if not sockets_only or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def _process_state() -> dict[str, set[str]]:
    """What a command run in this process must leave as it found: threads, open files, the
    environment, the working directory, logging handlers, the child watcher."""
    import asyncio
    import gc
    import threading

    gc.collect()  # what is only waiting for the collector is not left behind
    fds = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            fds.add(f"{fd} -> {os.readlink(f'/proc/self/fd/{fd}')}")
    handlers = [*logging.getLogger().handlers, *logging.getLogger("trajkit").handlers]
    return {
        # The ledger's one fsync thread is the process's, made when first needed and kept.
        "threads": {t.name for t in threading.enumerate() if not t.name.startswith("trajkit-fsync")},
        "open files": fds,
        "environment": {f"{key}={value}" for key, value in os.environ.items()},
        "working directory": {os.getcwd()},
        "logging handlers": {repr(handler) for handler in handlers},
        "logging level": {logging.getLevelName(logging.getLogger("trajkit").level)},
        "child watcher": {repr(getattr(asyncio.get_event_loop_policy(), "_watcher", None))},
    }
