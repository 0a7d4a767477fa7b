"""The ``terminal`` toolset on every backend: state that carries over, a shell that survives its
timeouts, background processes through the ``process`` tool (the shared suite in
:mod:`trajkit.testing.terminal_conformance`), and the toolset's own settings."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.test_docker_backend import DockerHarness, docker_engine  # noqa: F401 (fixture)
from tests.test_sandbox_conformance import LocalHarness
from tests.test_singularity_backend import SIF, SingularityHarness, apptainer, cache_dir  # noqa: F401
from trajkit.plugins.local.sandbox import LocalBackend
from trajkit.plugins.toolsets import TERMINAL, TerminalSettings, process, terminal
from trajkit.sandbox import SandboxSpec
from trajkit.sandbox.shell import one_line
from trajkit.testing.engines import need_engine
from trajkit.testing.terminal_conformance import TerminalConformance
from trajkit.tools import ToolContext, ToolError, ToolRun, ToolSession


class TestLocalTerminal(TerminalConformance):
    @pytest.fixture
    def harness(self, sandbox_root: Path) -> LocalHarness:
        need_engine("bwrap", None if shutil.which("bwrap") else "bubblewrap is not installed")
        return LocalHarness(sandbox_root, isolation="bwrap")


class TestUnconfinedLocalTerminal(TerminalConformance):
    @pytest.fixture
    def harness(self, tmp_path: Path) -> LocalHarness:
        return LocalHarness(tmp_path, isolation="none")


@pytest.mark.engine("docker")
class TestDockerTerminal(TerminalConformance):
    @pytest.fixture
    def harness(self, docker_engine: None) -> DockerHarness:  # noqa: F811
        return DockerHarness()


@pytest.mark.engine("apptainer")
class TestApptainerTerminal(TerminalConformance):
    @pytest.fixture
    def harness(self, apptainer: None, cache_dir: Path) -> SingularityHarness:  # noqa: F811
        return SingularityHarness(str(SIF), cache_dir)


def test_settings_come_from_options_and_bound_background_processes(tmp_path: Path) -> None:
    settings = TerminalSettings.model_validate({"persistent": "false", "max_processes": "1"})
    assert (settings.persistent, settings.max_processes) == (False, 1)
    with pytest.raises(ValueError, match="max_processes"):
        TerminalSettings(max_processes=0)

    async def main() -> None:
        backend = LocalBackend({"root": str(tmp_path), "isolation": "none"})
        sandbox = await backend.create(SandboxSpec(run_id="settings", work_id="w0"))
        session = ToolSession(ToolRun(settings={TERMINAL.name: TerminalSettings(max_processes=1)}))
        context = ToolContext(sandbox, timeout=30.0, output_cap=4096, session=session)
        try:
            first = json.loads(await terminal({"command": "sleep 600", "background": True}, context))
            with pytest.raises(ToolError, match="1 background processes are running"):
                await terminal({"command": "sleep 600", "background": True}, context)
            await process({"action": "kill", "session_id": first["session_id"]}, context)
            await terminal({"command": "true", "background": True}, context)  # room again
        finally:
            await session.aclose()
            await sandbox.close()
            await backend.aclose()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"command": "echo \0"}, "NUL character"),
        ({"command": "true", "background": "yes"}, "'background' must be true or false"),
        ({"command": "true", "timeout": -1}, "'timeout' must be a positive number"),
        ({"command": "true", "workdir": 3}, "'workdir' must be a string"),
    ],
)
def test_bad_terminal_arguments_are_tool_errors(tmp_path: Path, arguments: dict, message: str) -> None:
    async def main() -> None:
        backend = LocalBackend({"root": str(tmp_path), "isolation": "none"})
        sandbox = await backend.create(SandboxSpec(run_id="arguments", work_id="w0"))
        try:
            with pytest.raises(ToolError, match=message):
                await terminal(arguments, ToolContext(sandbox))
            with pytest.raises(ToolError, match="unknown action 'restart'"):
                await process({"action": "restart", "session_id": "x"}, ToolContext(sandbox))
        finally:
            await sandbox.close()
            await backend.aclose()

    asyncio.run(main())


def test_scripts_are_joined_into_one_line_with_the_same_meaning(tmp_path: Path) -> None:
    script = (
        "# a comment\n"
        "f() {\n    echo in f\n}\n"
        "for x in a b; do\n    echo $x\ndone\n"
        'case "$1" in\nx)\n    echo case x\n    ;;\n*)\n    echo other\n    ;;\nesac\n'
        "sleep 0 &\nwait\n"
        "if true; then\n    f\nelse\n    echo never\nfi\n"
        "echo one \\\n    two\n"
    )
    joined = one_line(script)
    assert "\n" not in joined
    for shell in ("bash", "sh"):
        expected = subprocess.run([shell, "-c", script, "s", "x"], capture_output=True, text=True, check=True)
        got = subprocess.run([shell, "-c", joined, "s", "x"], capture_output=True, text=True, check=True)
        assert got.stdout == expected.stdout == "a\nb\ncase x\nin f\none two\n"
