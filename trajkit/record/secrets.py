"""The last line against leaked secrets: every record is scrubbed of the run's known secrets.

Sandboxes keep the runner's environment and processes out of reach; should a secret still find its
way into a trajectory (a hostile command, a model that was handed one, an error body echoing a
header), it is replaced before the record is written anywhere, and the run counts it.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

log = logging.getLogger(__name__)

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL", re.IGNORECASE)
"""Environment variables whose values are taken for secrets."""
MIN_LENGTH = 8
"""Shorter values are too likely to be ordinary words or numbers to be replaced everywhere."""
REDACTED = "[REDACTED]"


def read_key_file(path: Path, name: str) -> str:
    """The key a file holds (surrounding blanks stripped); a :class:`ValueError` naming the
    setting and the file, never the content, when it cannot be read or is empty."""
    try:
        key = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{name} {path}: cannot be read ({type(exc).__name__})") from None
    if not key:
        raise ValueError(f"{name} {path} is empty")
    return key


def environment_secrets(environ: dict[str, str] | None = None) -> list[str]:
    """Values of the environment variables whose names say they hold a secret."""
    environ = dict(os.environ) if environ is None else environ
    return [value for name, value in environ.items() if SECRET_NAME.search(name)]


class Scrubber:
    """Replaces each known secret by ``[REDACTED]`` in every string of a record."""

    def __init__(self, secrets: Iterable[str]) -> None:
        kept = {secret.strip() for secret in secrets if len(secret.strip()) >= MIN_LENGTH}
        self.secrets = sorted(kept, key=len, reverse=True)  # a secret inside a longer one: longest first
        self.needles = [secret.encode() for secret in self.secrets]
        self.scrubbed = 0
        """Records in which a secret was found, over this scrubber's life."""

    def scrub(self, record: dict[str, Any]) -> dict[str, Any]:
        """``record`` itself when it holds no secret (the common case, one serialisation), else a copy."""
        if not self.secrets:
            return record
        text = orjson.dumps(record)
        if not any(needle in text for needle in self.needles):
            return record
        self.scrubbed += 1
        log.warning("a secret of the run was found in record %s and replaced", record.get("work_id", "?"))
        cleaned: dict[str, Any] = self._clean(record)
        return cleaned

    def text(self, value: str) -> str:
        for secret in self.secrets:
            value = value.replace(secret, REDACTED)
        return value

    def _clean(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.text(key): self._clean(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [self._clean(item) for item in value]
        return value
