"""Shared by the whole test tree (core and plugin packages)."""

import asyncio
import inspect
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run ``async def`` tests on a fresh event loop each."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    arguments = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    asyncio.run(pyfuncitem.obj(**arguments))
    return True


@pytest.fixture
def sandbox_root() -> Iterator[Path]:
    """A directory for local sandboxes that their unprivileged user can reach when the tests run as
    root (pytest's own temporary directories let no other user through)."""
    root = Path(tempfile.mkdtemp(prefix="trajkit-test-sandboxes-"))
    root.chmod(0o711)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)
