"""Shared fixtures. Engine tests skip on a machine without the engine, and fail in CI instead.

``TRAJKIT_REQUIRE_ENGINES`` (comma-separated engine names, or ``all``) turns the skip of a missing
engine into a failure, so a CI run without the engine can never pass silently.
"""

from __future__ import annotations

import os

import pytest


def engine_required(name: str) -> bool:
    wanted = {part.strip() for part in os.environ.get("TRAJKIT_REQUIRE_ENGINES", "").split(",") if part.strip()}
    return "all" in wanted or name in wanted


def need_engine(name: str, reason: str | None) -> None:
    """Skip (or, when required, fail) the calling test if ``reason`` says the engine is missing."""
    if reason is None:
        return
    message = f"{name} engine not available: {reason}"
    if engine_required(name):
        pytest.fail(f"{message} (TRAJKIT_REQUIRE_ENGINES requires it)", pytrace=False)
    pytest.skip(message)
