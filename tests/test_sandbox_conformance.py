"""The conformance suite on the built-in local backend: unconfined (the explicit opt-out), with
/bin/sh as its shell, without pidfds (a thread waits for each command instead), and isolated by
bubblewrap (the default wherever it is installed).

Other backends run the same suite from their own test modules.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from trajkit.plugins.local.sandbox import LocalBackend
from trajkit.sandbox import SandboxBackend
from trajkit.testing.engines import need_engine
from trajkit.testing.sandbox_conformance import SandboxConformance


class LocalHarness:
    image = None

    def __init__(self, root: Path, **options: str) -> None:
        self.options = {"root": str(root), **options}
        self.isolated = options.get("isolation") != "none"
        self.own_init = self.isolated  # PID 1 is the session's own supervisor, as its user
        self.host_paths = (str(root),)

    def make_backend(self) -> SandboxBackend:
        return LocalBackend(self.options)

    async def leftovers(self, backend: SandboxBackend, run_id: str) -> list[str]:
        root = Path(self.options["root"])
        return [p.name for p in root.glob(f"{run_id}.*")] if root.exists() else []


class TestLocalConformance(SandboxConformance):
    @pytest.fixture
    def harness(self, tmp_path: Path) -> LocalHarness:
        return LocalHarness(tmp_path, isolation="none")


class TestLocalShConformance(SandboxConformance):
    @pytest.fixture
    def harness(self, tmp_path: Path) -> LocalHarness:
        return LocalHarness(tmp_path, shell="/bin/sh", isolation="none")


class TestLocalWithoutPidfdConformance(SandboxConformance):
    @pytest.fixture
    def harness(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LocalHarness:
        monkeypatch.delattr(os, "pidfd_open", raising=False)
        return LocalHarness(tmp_path, isolation="none")


class TestBubblewrapConformance(SandboxConformance):
    @pytest.fixture
    def harness(self, sandbox_root: Path) -> LocalHarness:
        need_engine("bwrap", None if shutil.which("bwrap") else "bubblewrap is not installed")
        return LocalHarness(sandbox_root, isolation="bwrap")
