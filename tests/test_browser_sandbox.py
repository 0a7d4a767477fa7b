"""The browser inside a row's container (``--browser.where sandbox|auto``), on the real Docker
engine: the image's Chromium, driven over its DevTools pipe through the backend's bridge, browses a
web app that the session serves on the container's own loopback (its network is ``none``), and
goes with the session; rows without an image, or whose image has no Chromium, browse from the
runner behind its proxy."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import read_jsonl, write_jsonl
from tests.test_browser_run import run_trajkit
from tests.test_browser_tools import call, chromium_missing, ref_of, site
from trajkit.config.resolve import resolve
from trajkit.manager import load_plugins
from trajkit.plugins.local.sandbox import LocalBackend
from trajkit.sandbox import Sandbox, SandboxBackend, SandboxInfo, SandboxSpec
from trajkit.testing.engines import need_engine
from trajkit.testing.openai_server import OpenAITestServer
from trajkit.tools import ToolContext, ToolError, ToolSession, close_session, open_toolsets

CHROMIUM_IMAGE = "trajkit-test/chromium:latest"
BUSYBOX = "trajkit-test/busybox:latest"
APP = "http://127.0.0.1:8000"
# The task's web app: two pages and python3 -m http.server on the container's loopback.
SERVE = (
    "mkdir -p site && cd site"
    " && printf '%s' '<title>Guest book</title><h1>Inside</h1><input aria-label=\"Your name\">"
    '<a href="next.html">Next page</a>\' > index.html'
    " && printf '%s' '<title>Next</title><p>Reached inside the container</p>' > next.html"
    " && exec python3 -m http.server 8000 --bind 127.0.0.1"
)
WAIT_FOR_APP = (
    "for i in $(seq 100); do python3 -c \"import urllib.request; urllib.request.urlopen('"
    + APP
    + "/')\" 2>/dev/null && break; sleep 0.1; done; hostname"
)
# Lists the container's browser processes: uid and name (no ps in a minimal image).
BROWSERS = (
    "for p in /proc/[0-9]*; do c=$(cat $p/comm 2>/dev/null) || continue; case $c in chromium*)"
    " echo \"$(awk '/^Uid:/ {print $2}' $p/status) $c ${p#/proc/}\";; esac; done"
)
# The browser's main process: started by an exec, so its parent is outside the container.
MAIN_BROWSER = (
    'for p in /proc/[0-9]*; do [ "$(cat $p/comm 2>/dev/null)" = chromium ]'
    " && grep -q '^PPid:[[:space:]]*0$' $p/status && echo ${p#/proc/}; done"
)


def docker_missing(image: str) -> str | None:
    try:
        import docker

        import trajkit_docker  # noqa: F401

        client = docker.from_env(timeout=30)
        try:
            client.images.get(image)
        finally:
            client.close()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc} (bash scripts/engines/docker.sh start && ... images)"
    return None


@contextlib.asynccontextmanager
async def session_in(
    backend: SandboxBackend, image: str | None, allow: str | None = None, **settings: Any
) -> AsyncIterator[tuple[ToolContext, Sandbox]]:
    """A browser tool context for one session in a fresh sandbox of ``backend``."""
    host = load_plugins(entry_points=False)
    options: dict[str, Any] = {"browser": settings}
    if allow:
        options["web"] = {"allow_hosts": [allow]}
    run = await open_toolsets([host.toolsets["browser"]], resolve(host, {"toolset_options": options}), host)
    sandbox = await backend.create(
        SandboxSpec(run_id=f"browse-{uuid.uuid4().hex[:8]}", work_id="w0", image=image)
    )
    session = ToolSession(run)
    try:
        yield ToolContext(sandbox, timeout=30, output_cap=32 * 1024, session=session), sandbox
    finally:
        try:
            await close_session(session, sandbox)
        finally:
            await run.aclose()


@contextlib.asynccontextmanager
async def docker_backend() -> AsyncIterator[SandboxBackend]:
    from trajkit_docker import DockerBackend

    backend = DockerBackend({"pull": "never"})
    try:
        yield backend
    finally:
        await backend.aclose()


def bridges_of(container_id: str) -> list[int]:
    """Processes of the runner's host that bridge a program into the container (its id or the
    id's start)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if b"trajkit_docker.bridge" in argv and any(a.startswith(container_id.encode()) for a in argv):
                found.append(int(entry.name))
    return found


async def test_the_browser_runs_in_the_container_and_browses_its_app_at_localhost() -> None:
    need_engine("chromium", chromium_missing())
    need_engine("docker", docker_missing(CHROMIUM_IMAGE))
    async with (
        docker_backend() as backend,
        session_in(backend, CHROMIUM_IMAGE, where="sandbox") as (ctx, sandbox),
    ):
        await sandbox.start_process(SERVE)
        assert (await sandbox.exec(WAIT_FOR_APP, timeout=30)).exit_code == 0
        opened = await call(ctx, "browser_navigate", url=f"{APP}/")
        assert opened["title"] == "Guest book" and opened["status"] == 200
        page = (await call(ctx, "browser_snapshot", full=True))["snapshot"]
        assert 'heading "Inside"' in page
        await call(ctx, "browser_type", ref=ref_of(page, "textbox", "Your name"), text="trajkit")
        clicked = await call(ctx, "browser_click", ref=ref_of(page, "link", "Next page"))
        assert clicked == {"clicked": clicked["clicked"], "url": f"{APP}/next.html", "title": "Next"}
        assert "Reached inside the container" in (await call(ctx, "browser_snapshot"))["snapshot"]
        lease = ctx.session.state["browser"].lease
        assert lease.gate is None  # not the runner's proxy: the container's own loopback

        # The browser is the image's, run as a user of its own: the commands' user can neither
        # see its pipe to the runner nor signal it.
        running = (await sandbox.exec(BROWSERS, timeout=30)).stdout.split()
        assert running[0::3] and set(running[0::3]) == {"65533"}, running
        main = (await sandbox.exec(MAIN_BROWSER, timeout=30)).stdout.strip()
        assert main in running[2::3], running
        profile = await sandbox.exec(
            f"tr '\\0' '\\n' < /proc/{main}/cmdline | grep user-data-dir", timeout=30
        )
        assert re.fullmatch(
            r"(--user-data-dir=\S+\n)*--user-data-dir=/tmp/trajkit-browser\.\w+/profile\n", profile.stdout
        )
        assert (
            await sandbox.exec("ls -d /tmp/playwright*", timeout=30)
        ).exit_code != 0  # not the runner's path
        probe = await sandbox.exec(
            f"ls /proc/{main}/fd; echo x > /proc/{main}/fd/4; kill -0 {main}", timeout=30
        )
        assert probe.exit_code != 0 and "Permission denied" in probe.stderr, probe
        container = sandbox.container_id  # type: ignore[attr-defined]
        assert bridges_of(container)

        await ctx.session.aclose()  # the session ends: its context and browser close first
        assert (await sandbox.exec(BROWSERS, timeout=30)).stdout.strip() == ""
        for _ in range(50):
            if not bridges_of(container):
                break
            await asyncio.sleep(0.1)
        assert not bridges_of(container)


async def test_auto_browses_from_the_runner_when_the_image_has_no_chromium(sandbox_root: Path) -> None:
    need_engine("chromium", chromium_missing())
    need_engine("docker", docker_missing(BUSYBOX))
    async with site() as url, docker_backend() as backend:
        allow = url.removeprefix("http://")
        async with session_in(backend, BUSYBOX, allow, where="auto") as (ctx, _):
            opened = await call(ctx, "browser_navigate", url=f"{url}/form")
            assert opened["title"] == "Sign the guest book"
            assert ctx.session.state["browser"].lease.gate is not None  # the runner's proxy
        async with session_in(backend, BUSYBOX, allow, where="sandbox") as (ctx, _):
            with pytest.raises(
                ToolError, match=r"image trajkit-test/busybox:latest has no Chromium.*--browser.where auto"
            ):
                await call(ctx, "browser_navigate", url=f"{url}/form")
        local = LocalBackend({"root": str(sandbox_root)})
        try:
            async with session_in(local, None, allow, where="sandbox") as (ctx, sandbox):
                opened = await call(ctx, "browser_navigate", url=f"{url}/form")
                assert opened["title"] == "Sign the guest book"
                assert ctx.session.state["browser"].lease.gate is not None
            # a row with an image on a backend that has no bridge: the runner's browser under auto
            async with session_in(local, None, allow, where="auto") as (ctx, sandbox):
                sandbox.info = SandboxInfo("local", image="example/app")
                assert (await call(ctx, "browser_navigate", url=f"{url}/form"))["status"] == 200
            async with session_in(local, None, allow, where="sandbox") as (ctx, sandbox):
                sandbox.info = SandboxInfo("local", image="example/app")
                with pytest.raises(ToolError, match="the local sandbox cannot run a browser inside it"):
                    await call(ctx, "browser_navigate", url=f"{url}/form")
        finally:
            await local.aclose()


URL = re.compile(r"https?://[^\s]+")
REF = re.compile(r'- (textbox|link) "[^"\n]*"[^\n]*\[ref=(e\d+)\]')


def container_app_policy(body: dict[str, Any]) -> dict[str, Any]:
    """A model that serves the app in its container with the terminal when the task asks, then
    opens the task's page, reads it, fills its field and follows its link."""
    messages = body["messages"]
    task = next(m["content"] for m in messages if m["role"] == "user")
    results = [m["content"] for m in messages if m["role"] == "tool"]
    steps: list[tuple[str, dict[str, Any]]] = []
    if task.startswith("Serve"):
        steps += [
            ("terminal", {"command": SERVE, "background": True}),
            ("terminal", {"command": WAIT_FOR_APP}),
        ]
    steps += [("browser_navigate", {"url": URL.findall(task)[0]}), ("browser_snapshot", {"full": True})]
    if len(results) >= len(steps):
        refs = dict(REF.findall(json.loads(results[len(steps) - 1]).get("snapshot", "")))
        steps += [("browser_type", {"ref": refs["textbox"], "text": "trajkit"})] if "textbox" in refs else []
        steps += [("browser_click", {"ref": refs["link"]})] if "link" in refs else []
    if len(results) >= len(steps):
        return {"content": "Done.", "reasoning": "Every step is done."}
    name, arguments = steps[len(results)]
    call = {
        "id": f"call_{len(results)}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }
    return {"content": None, "reasoning": f"Next: {name}.", "tool_calls": [call]}


async def test_a_run_browses_a_container_app_and_an_image_less_row_from_the_runner(tmp_path: Path) -> None:
    need_engine("chromium", chromium_missing())
    need_engine("docker", docker_missing(CHROMIUM_IMAGE))
    server = OpenAITestServer(container_app_policy, models={"test-model"}).start()
    run_name = f"inside-{uuid.uuid4().hex[:8]}"
    try:
        async with site() as url:
            dataset = write_jsonl(
                tmp_path / "prompts.jsonl",
                [
                    {"prompt": f"Serve the guest book and sign it at {APP}/", "image": CHROMIUM_IMAGE},
                    {"prompt": f"Sign the guest book at {url}/form"},
                ],
            )
            code, stderr = await run_trajkit(
                "run", "--dataset_file", str(dataset), "--run_name", run_name, "--output_dir", str(tmp_path),
                "--model", "test-model", "--base_url", server.base_url, "--toolsets", "terminal,browser",
                "--num_workers", "2", "--max_turns", "12", "--quiet", "--sandbox_option", "docker.pull=never",
                "--web.allow_hosts", url.removeprefix("http://"), "--browser.where", "auto",
            )  # fmt: skip
    finally:
        server.stop()
    assert code == 0, stderr
    inside, outside = sorted(
        read_jsonl(tmp_path / run_name / "trajectories.jsonl"), key=lambda r: r["prompt_index"]
    )
    for record in (inside, outside):
        for tool in ("browser_navigate", "browser_snapshot", "browser_type", "browser_click"):
            assert record["tool_stats"][tool] == {"count": 1, "success": 1, "failure": 0}, (tool, record)
    inside_results = results_of(inside)
    assert inside_results["browser_navigate"]["title"] == "Guest book"
    assert 'textbox "Your name"' in inside_results["browser_snapshot"]["snapshot"]
    assert inside_results["browser_click"]["url"] == f"{APP}/next.html"
    assert inside_results["browser_click"]["title"] == "Next"
    container = inside_results["terminal"]["output"].split()[-1]  # the last terminal call's hostname
    outside_results = results_of(outside)
    assert outside_results["browser_navigate"]["title"] == "Sign the guest book"
    assert outside_results["browser_click"]["url"] == f"{url}/links"
    # the container went with its session, and its browser and bridge with it
    import docker

    client = docker.from_env(timeout=30)
    try:
        left = client.api.containers(all=True, filters={"label": "trajkit=1"})
        assert not [
            c for c in left if (c.get("Labels") or {}).get("trajkit.run", "").startswith(f"{run_name}-")
        ]
    finally:
        client.close()
    assert len(container) == 12 and not bridges_of(container)


def results_of(record: dict[str, Any]) -> dict[str, Any]:
    """Each tool's last result in a trajectory."""
    return {t["name"]: json.loads(t["value"]) for t in record["conversations"] if t["from"] == "tool"}


async def test_the_docker_bridge_carries_a_program_s_standard_streams_and_nothing_else() -> None:
    import sys

    need_engine("docker", docker_missing(BUSYBOX))
    async with docker_backend() as backend:
        sandbox = await backend.create(
            SandboxSpec(run_id=f"bridge-{uuid.uuid4().hex[:8]}", work_id="w0", image=BUSYBOX)
        )
        try:
            bridge = sandbox.bridge(["/bin/sh", "-c", "id -u >&2; env | wc -l >&2; cat; exit 3"])
            assert bridge is not None and bridge.argv[:3] == (sys.executable, "-m", "trajkit_docker.bridge")
            process = await asyncio.create_subprocess_exec(
                *bridge.argv,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                env={**__import__("os").environ, "TRAJKIT_SECRET_PROBE": "s3cret"},
            )  # fmt: skip
            message = b'{"id":1,"method":"Browser.getVersion"}\0' * 1000
            out, err = await asyncio.wait_for(process.communicate(message), 60)
            assert out == message and process.returncode == 3  # end of input reached the program
            assert err.split()[0] == b"65533"  # a user of its own
            assert b"TRAJKIT_SECRET_PROBE" not in err  # none of the host's variables
        finally:
            await sandbox.close()
