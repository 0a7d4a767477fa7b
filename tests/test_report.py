"""``trajkit stats`` and ``trajkit report`` on real runs, and the report page in a real headless Chromium.

The browser is driven over the Chrome DevTools Protocol (aiohttp's websocket client, already
installed with the core): the page must load with no console error and no network request, draw
its charts, list every trajectory, narrow the list as a person types and filters, render a
conversation (a prompt containing ``</script><b>x</b>`` shows as text), and a screenshot of it
must show more than a blank page.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import shutil
import struct
import subprocess
import time
import urllib.request
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.helpers import read_jsonl, trajkit, write_jsonl
from trajkit.testing.engines import need_engine
from trajkit.testing.openai_server import Body, Fault, OpenAITestServer
from trajkit.testing.policies import dialect_policy

EVIL = "Evil </script><b>x</b> prompt <!-- and & more"
CHARTS = ("tools", "turns", "tokens", "failures", "rejections", "backends")
DIALECTS = ["reasoning", "reasoning_content", "details", "think", "scratchpad"]
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--remote-debugging-port=0",
]


# -- runs -----------------------------------------------------------------------------------------


def doomed(_number: int, body: Body) -> Fault | None:
    """Every request of the ``[doomed]`` prompt fails, so the run has a row still failing."""
    if "[doomed]" in json.dumps(body["messages"]):
        return Fault(status=500, message="upstream exploded")
    return None


@pytest.fixture(scope="module")
def dialect_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """16 rows against the test server: 12 kept, 3 rejected by filters, 1 failing (api_error)."""
    tmp = tmp_path_factory.mktemp("dialects")
    rows: list[dict[str, Any] | str] = [
        {"prompt": f"Task {i}: tidy the notes [dialect:{DIALECTS[i % 5]}]", "topic": f"t{i % 3}"}
        for i in range(10)
    ]
    rows += [
        {"prompt": "Look something up [hallucinate]"},
        {"prompt": "Search the web again [hallucinate]"},
        {"prompt": "Answer without thinking [dialect:none]"},
        {"prompt": "Run a command [badargs]"},
        {"prompt": EVIL},
        {"prompt": "This one never works [doomed]"},
    ]
    dataset = write_jsonl(tmp / "prompts.jsonl", rows)
    with OpenAITestServer(dialect_policy, faults=doomed, models={"test-model"}) as server:
        result = trajkit(
            "run", "--dataset_file", str(dataset), "--run_name", "dialects", "--output_dir", str(tmp / "data"),
            "--model", "test-model", "--base_url", server.base_url, "--api_key", "k",
            "--max_retries", "0", "--max_attempts", "1", "--quiet",
        )  # fmt: skip
    assert result.returncode == 1, result.stderr  # one row still failing
    assert "15/16 rows done, 12 kept, 3 rejected, 1 pending" in result.stderr
    return tmp / "data" / "dialects"


@pytest.fixture(scope="module")
def scripted_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("scripted")
    dataset = write_jsonl(tmp / "prompts.jsonl", [{"prompt": f"Scripted task {i}"} for i in range(30)])
    result = trajkit(
        "run", "--dataset_file", str(dataset), "--run_name", "scripted", "--output_dir", str(tmp / "data"),
        "--model", "scripted", "--quiet",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return tmp / "data" / "scripted"


def statistics(run_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run_dir / "statistics.json").read_text())
    return data


def all_records(run_dir: Path) -> list[dict[str, Any]]:
    rejected = [line["record"] for line in read_jsonl(run_dir / "rejected.jsonl")]
    return read_jsonl(run_dir / "trajectories.jsonl") + rejected


def table_rows(text: str) -> dict[str, list[str]]:
    """``| label | a | b |`` lines of the plain-text tables, by label."""
    rows = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 2:
            rows[cells[0]] = cells[1:]
    return rows


# -- trajkit stats --------------------------------------------------------------------------------


def test_stats_shows_the_key_numbers(dialect_run: Path) -> None:
    result = trajkit("stats", str(dialect_run))
    assert result.returncode == 0, result.stderr
    assert "\x1b[" not in result.stdout, "no terminal: no colour codes"
    rows = table_rows(result.stdout)
    stats = statistics(dialect_run)
    expected = {
        "dataset rows": "16",
        "done": "15",
        "kept": "12",
        "rejected": "3",
        "rejected by hallucinated_tool": "2",
        "rejected by no_reasoning": "1",
        "pending": "1",
        "failing": "1",
        "failing: api_error": "1",
        "failed attempts": "1",
        "invocations": "1",
        "api calls": f"{stats['api_calls']:,}",
        "tokens total": f"{stats['tokens']['total']:,}",
        "model": "test-model",
        "cost": "$0.0000",
    }
    assert {label: rows[label][0] for label in expected} == expected
    assert rows["api_error"] == ["1", "1", "0"]  # failures table: attempts, still failing, for good
    for tool, stat in stats["tools"].items():
        rate = "-" if stat["success_rate"] is None else f"{stat['success_rate']:.1%}"
        assert rows[tool] == [str(stat["count"]), str(stat["success"]), str(stat["failure"]), rate], tool
    assert rows["local"] == ["15", "100.0%"]
    assert rows["requests"] == [str(stats["model_client"]["requests"])]
    assert "wall time" in rows and "tokens prompt" in rows


def test_stats_of_an_offline_run(scripted_run: Path) -> None:
    result = trajkit("stats", str(scripted_run))
    assert result.returncode == 0, result.stderr
    rows = table_rows(result.stdout)
    assert rows["model"] == ["scripted"]
    assert (rows["done"], rows["kept"], rows["rejected"], rows["failing"]) == (["30"], ["30"], ["0"], ["0"])
    assert rows["(none recorded)"] == [""]  # the scripted model keeps no client counters
    assert "failures by error class" not in result.stdout


def test_stats_and_report_need_a_run_directory(tmp_path: Path) -> None:
    for command in ("stats", "report"):
        result = trajkit(command, str(tmp_path))
        assert result.returncode == 1
        assert f"{tmp_path} is not a trajkit run directory (no run.json, no ledger)" in result.stderr
    assert not (tmp_path / "report.html").exists()


# -- trajkit report: the file ---------------------------------------------------------------------


def embedded_data(page: str) -> dict[str, Any]:
    match = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.S)
    assert match, "the data element is missing or was cut short"
    data: dict[str, Any] = json.loads(match.group(1))
    return data


def test_report_is_self_contained_and_escapes_its_data(dialect_run: Path) -> None:
    result = trajkit("report", str(dialect_run))
    assert result.returncode == 0, result.stderr
    path = dialect_run / "report.html"
    assert f"wrote {path} (15 trajectories, 15 embedded" in result.stdout
    page = path.read_text()
    assert page.count("</script>") == 2 and page.count("<script") == 2
    assert "<b>x</b>" not in page and "<!-- and" not in page
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page), "no external resource"
    assert "default-src 'none'" in page  # the browser refuses any fetch the page might attempt

    data = embedded_data(page)
    items = data["browse"]["items"]
    assert (data["browse"]["total"], data["browse"]["embedded"]) == (15, 15)
    assert [i["index"] for i in items] == sorted(i["index"] for i in items)
    assert sum(i["status"] == "rejected" for i in items) == 3
    evil = next(i for i in items if i["index"] == 14)
    assert evil["turns"][1]["value"] == EVIL, "escaping must round-trip exactly"
    stats = statistics(dialect_run)
    assert data["statistics"] == stats
    assert sum(b["count"] for b in data["charts"]["api_calls"]) == 15
    assert sum(b["count"] for b in data["charts"]["tokens"]) == 15
    assert {r["name"]: r["count"] for r in data["charts"]["rejections"]} == {
        "hallucinated_tool: called tools not offered: web_search": 2,
        "no_reasoning: none of 4 assistant turns carries reasoning": 1,
    }
    assert data["charts"]["failures"] == [{"name": "api_error", "attempts": 1, "failing": 1}]


def test_report_caps_embedded_conversations_but_charts_cover_all(scripted_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "nested" / "capped.html"
    result = trajkit("report", str(scripted_run), "--out", str(out), "--max-conversations", "10")
    assert result.returncode == 0, result.stderr
    data = embedded_data(out.read_text())
    assert (data["browse"]["total"], data["browse"]["embedded"]) == (30, 10)
    assert [i["index"] for i in data["browse"]["items"]] == list(range(10))
    assert sum(b["count"] for b in data["charts"]["api_calls"]) == 30
    assert not (scripted_run / "report.html").exists()


def test_report_says_when_kept_conversations_cannot_be_shown(dialect_run: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "copy"
    shutil.copytree(dialect_run, run_dir)
    (run_dir / "trajectories.jsonl").unlink()  # e.g. a run with --writer hermes only
    result = trajkit("report", str(run_dir))
    assert result.returncode == 0, result.stderr
    assert "wrote no trajectories.jsonl" in result.stderr
    data = embedded_data((run_dir / "report.html").read_text())
    assert [i["status"] for i in data["browse"]["items"]] == ["rejected"] * 3
    assert "wrote no trajectories.jsonl" in data["browse"]["note"]
    assert data["statistics"]["kept"] == 12


# -- trajkit report: in a real browser ------------------------------------------------------------


class DevTools:
    """One page of a headless Chromium, driven over the DevTools protocol.

    Calls are synchronous for the test; an ``asyncio.Runner`` keeps the websocket and a reader task
    alive between them, and every event the page sends is kept in ``events``.
    """

    def __init__(self, websocket_url: str) -> None:
        self.runner = asyncio.Runner()
        self.events: list[dict[str, Any]] = []
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.next_id = 0
        self.runner.run(self._connect(websocket_url))

    async def _connect(self, url: str) -> None:
        self.session = aiohttp.ClientSession()
        self.ws = await self.session.ws_connect(url, max_msg_size=0)
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for message in self.ws:
            data = json.loads(message.data)
            if "id" in data and data["id"] in self.pending:
                self.pending.pop(data["id"]).set_result(data)
            elif "method" in data:
                self.events.append(data)

    async def _call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.next_id += 1
        future = asyncio.get_running_loop().create_future()
        self.pending[self.next_id] = future
        await self.ws.send_json({"id": self.next_id, "method": method, "params": params})
        answer = await asyncio.wait_for(future, 30)
        if "error" in answer:
            raise AssertionError(f"{method}: {answer['error']}")
        result: dict[str, Any] = answer["result"]
        return result

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        return self.runner.run(self._call(method, params))

    def js(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (awaited if it is a promise)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def open(self, url: str) -> None:
        """Navigate and wait until the page's own script says it has rendered everything."""
        self.js("document.body && delete document.body.dataset.ready")  # the old page must not answer
        self.events.clear()
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + 30
        while not self.js("document.readyState === 'complete' && document.body.dataset.ready === '1'"):
            assert time.monotonic() < deadline, f"page never became ready; events: {self.problems()}"
            self.runner.run(asyncio.sleep(0.05))

    def problems(self) -> list[str]:
        """Console errors, uncaught exceptions and error log entries seen since the last ``open``."""
        found = []
        for event in self.events:
            method, params = event["method"], event["params"]
            if method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
                found.append(f"console.{params['type']}: {[a.get('value') for a in params['args']]}")
            elif method == "Runtime.exceptionThrown":
                found.append(f"exception: {params['exceptionDetails']}")
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                found.append(f"log: {params['entry']['text']}")
        return found

    def requests(self) -> list[str]:
        return [
            e["params"]["request"]["url"] for e in self.events if e["method"] == "Network.requestWillBeSent"
        ]

    def type_text(self, selector: str, text: str) -> None:
        """Focus a field, clear it and type into it, as a person's keystrokes would."""
        self.js(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.focus(); e.select(); }})()"
        )
        if text:
            self.call("Input.insertText", text=text)
        else:
            for kind in ("keyDown", "keyUp"):
                self.call(
                    "Input.dispatchKeyEvent",
                    type=kind,
                    key="Backspace",
                    code="Backspace",
                    windowsVirtualKeyCode=8,
                )

    def choose(self, selector: str, value: str) -> None:
        self.js(
            f"(() => {{ const s = document.querySelector({json.dumps(selector)}); s.value = {json.dumps(value)};"
            " s.dispatchEvent(new Event('change', {bubbles: true})); })()"
        )

    def click(self, selector: str) -> None:
        """A real mouse click in the middle of the element."""
        box = self.js(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.scrollIntoView({{block: 'center'}});"
            " const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)

    def count(self, selector: str) -> int:
        return int(self.js(f"document.querySelectorAll({json.dumps(selector)}).length"))

    def text(self, selector: str) -> str:
        return str(self.js(f"document.querySelector({json.dumps(selector)}).textContent"))

    def size(self, selector: str) -> tuple[float, float]:
        """Width and height as laid out on the page."""
        width, height = self.js(
            f"(() => {{ const r = document.querySelector({json.dumps(selector)}).getBoundingClientRect();"
            " return [r.width, r.height]; })()"
        )
        return width, height

    def close(self) -> None:
        async def shutdown() -> None:
            await self.ws.close()
            await self.session.close()
            await self.reader

        self.runner.run(shutdown())
        self.runner.close()


def chromium_missing() -> str | None:
    if shutil.which("chromium") is None:
        return "no chromium on PATH (bash scripts/install-chromium.sh installs it)"
    return None


@contextlib.contextmanager
def headless_chromium(profile: Path) -> Iterator[DevTools]:
    """A headless Chromium on a fresh profile, driven over DevTools; stopped however the block ends."""
    log = (profile.parent / "chromium.log").open("w")
    process = subprocess.Popen(
        ["chromium", *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        port = wait_for_devtools_port(profile / "DevToolsActivePort", process)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as answer:
            targets = json.load(answer)
        page = next(t for t in targets if t["type"] == "page")
        tools = DevTools(page["webSocketDebuggerUrl"])
        for domain in ("Page", "Runtime", "Log", "Network"):
            tools.call(f"{domain}.enable")
        yield tools
        tools.close()
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def report_browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevTools]:
    """A headless Chromium sized for the report page (the ``browser`` fixture of the modules that
    open reports)."""
    need_engine("chromium", chromium_missing())
    with headless_chromium(tmp_path_factory.mktemp("chromium-profile")) as tools:
        tools.call(
            "Emulation.setDeviceMetricsOverride", width=1400, height=950, deviceScaleFactor=1, mobile=False
        )
        yield tools


browser = pytest.fixture(scope="module", name="browser")(report_browser)


def wait_for_devtools_port(path: Path, process: subprocess.Popen[bytes]) -> int:
    """Chromium picks a free port for ``--remote-debugging-port=0`` and writes it to its profile."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, f"chromium exited with {process.returncode}"
        if path.exists() and path.read_text().strip():
            return int(path.read_text().split()[0])
        time.sleep(0.1)
    raise AssertionError("chromium did not open its DevTools port within 60s")


@pytest.fixture(scope="module")
def dialect_page(dialect_run: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("page") / "report.html"
    result = trajkit("report", str(dialect_run), "--out", str(path))
    assert result.returncode == 0, result.stderr
    return path.as_uri()


def test_page_loads_cleanly_offline_and_draws_its_charts(
    browser: DevTools, dialect_page: str, dialect_run: Path
) -> None:
    browser.open(dialect_page)
    assert browser.js("document.title") == "trajkit report: dialects"
    assert browser.text(".card[data-key=kept] .value") == "12"
    assert browser.text(".card[data-key=failing] .value") == "1"
    bars = {name: browser.count(f"#chart-{name} svg rect.bar") for name in CHARTS}
    assert all(bars.values()), bars
    assert (bars["rejections"], bars["backends"], bars["failures"]) == (2, 1, 1)
    tools = statistics(dialect_run)["tools"].values()
    assert browser.count("#chart-tools rect.bar.ok") == sum(bool(t["success"]) for t in tools)
    assert browser.count("#chart-tools rect.bar.bad") == sum(bool(t["failure"]) for t in tools) > 0
    for name in CHARTS:
        width, height = browser.size(f"#chart-{name} svg")
        assert width > 200 and height > 20, name

    assert browser.problems() == []
    assert [url for url in browser.requests() if not url.startswith(("file:", "data:"))] == []
    browser.js("console.error('probe')")  # the collector does see an error when there is one
    assert browser.problems() == ["console.error: ['probe']"]


def test_search_and_filters_narrow_the_list(browser: DevTools, dialect_page: str, dialect_run: Path) -> None:
    browser.open(dialect_page)
    assert browser.count("#traj-list li") == 15
    assert browser.text("#shown-count") == "15 of 15 shown"
    assert browser.js("document.getElementById('cap-note').hidden") is True

    browser.type_text("#search", "hallucinate")
    assert browser.count("#traj-list li") == 2
    browser.type_text("#search", "")
    assert browser.count("#traj-list li") == 15
    browser.choose("#status-filter", "rejected")
    assert browser.count("#traj-list li") == browser.count("#traj-list li[data-status=rejected]") == 3
    browser.type_text("#search", "WEB_SEARCH")  # any case; rejection reasons and tool calls are searched
    assert browser.count("#traj-list li") == 2
    assert browser.text("#shown-count") == "2 of 15 shown"
    browser.type_text("#search", "")
    browser.choose("#status-filter", "kept")
    assert browser.count("#traj-list li") == 12
    browser.choose("#status-filter", "")

    records = all_records(dialect_run)
    calls = {
        tool: sum(bool(r["tool_stats"][tool]["count"]) for r in records) for tool in records[0]["tool_stats"]
    }
    rare = min((tool for tool, n in calls.items() if n), key=lambda tool: calls[tool])
    browser.choose("#tool-filter", rare)
    assert browser.count("#traj-list li") == calls[rare] < 15
    browser.choose("#tool-filter", "")
    browser.choose("#backend-filter", "local")
    assert browser.count("#traj-list li") == 15
    browser.type_text("#search", "no such text anywhere")
    assert browser.count("#traj-list li") == 0
    assert browser.text("#detail") == "No trajectory matches."
    assert browser.problems() == []


def test_a_conversation_renders_as_text(browser: DevTools, dialect_page: str, dialect_run: Path) -> None:
    browser.open(dialect_page)
    browser.type_text("#search", "</script>")
    assert browser.count("#traj-list li") == 1
    browser.click("#traj-list li")
    evil = next(r for r in all_records(dialect_run) if r["prompt_index"] == 14)["conversations"]
    assert browser.count("#detail .turn") == len(evil)
    assert browser.count("#detail .turn-tool") == sum(t["from"] == "tool" for t in evil)
    assert browser.count("#detail .turn-gpt .reasoning") == sum(bool(t["reasoning"]) for t in evil)
    assert browser.count("#detail .call") == sum(len(t["tool_calls"]) for t in evil)
    assert EVIL in browser.text("#detail .turn-human")
    assert browser.count("b") == 0, "the prompt's markup must stay text"
    assert browser.text("#detail .call pre.args").startswith('{\n  "path": ')  # pretty-printed

    browser.type_text("#search", "[hallucinate]")
    browser.click("#traj-list li:nth-child(2)")
    assert browser.js("document.querySelector('#traj-list li.selected').dataset.index") == "11"
    assert browser.text("#detail .reason").startswith("rejected: hallucinated_tool: called tools not offered")
    browser.type_text("#search", "")
    browser.click("#traj-list li:nth-child(14)")
    assert browser.js("document.querySelector('#traj-list li.selected').dataset.index") == "13"
    assert browser.text("#detail .call .bad-json") == "arguments are not valid JSON:"
    assert browser.problems() == []


def test_screenshot_shows_the_page(browser: DevTools, dialect_page: str, tmp_path: Path) -> None:
    browser.open(dialect_page)
    browser.click("#traj-list li:nth-child(11)")
    height = browser.js("document.documentElement.scrollHeight")
    shot = browser.call(
        "Page.captureScreenshot",
        format="png",
        captureBeyondViewport=True,
        clip={"x": 0, "y": 0, "width": 1400, "height": height, "scale": 1},
    )
    png = base64.b64decode(shot["data"])
    (tmp_path / "report.png").write_bytes(png)
    width, bpp, rows = decode_png(png)
    assert (width, len(rows)) == (1400, height)
    check_not_blank(bpp, rows)
    assert browser.problems() == []


def test_capped_report_says_so_in_the_browser(browser: DevTools, scripted_run: Path, tmp_path: Path) -> None:
    path = tmp_path / "capped.html"
    result = trajkit("report", str(scripted_run), "--out", str(path), "--max-conversations", "10")
    assert result.returncode == 0, result.stderr
    browser.open(path.as_uri())
    assert browser.count("#traj-list li") == 10
    assert browser.js("document.getElementById('cap-note').hidden") is False
    assert "first 10 of 30 trajectories" in browser.text("#cap-note")
    assert browser.text(".card[data-key=kept] .value") == "30"  # the summary covers every trajectory
    assert browser.count("#chart-rejections svg") == 0  # nothing rejected: the chart says so instead
    assert browser.text("#chart-rejections .empty") == "nothing to show"
    assert browser.problems() == []


# -- PNG ------------------------------------------------------------------------------------------


def decode_png(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, bytes per pixel and rows of an 8-bit, non-interlaced RGB(A) PNG, as Chromium writes."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
    width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
    bpp = 4 if color == 6 else 3
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows: list[bytes] = []
    previous = bytes(stride)
    for y in range(height):
        start = y * (stride + 1)
        previous = unfilter(raw[start], raw[start + 1 : start + 1 + stride], previous, bpp)
        rows.append(previous)
    return width, bpp, rows


def unfilter(kind: int, filtered: bytes, prev: bytes, bpp: int) -> bytes:
    """Undo one scanline's PNG filter (None, Sub, Up, Average, Paeth)."""
    if kind == 0:
        return filtered
    if kind == 2:
        return bytes((a + b) & 0xFF for a, b in zip(filtered, prev, strict=True))
    line = bytearray(filtered)
    for i in range(len(line)):
        left = line[i - bpp] if i >= bpp else 0
        if kind == 1:
            line[i] = (line[i] + left) & 0xFF
        elif kind == 3:
            line[i] = (line[i] + (left + prev[i]) // 2) & 0xFF
        else:
            up, corner = prev[i], prev[i - bpp] if i >= bpp else 0
            estimate = left + up - corner
            pa, pb, pc = abs(estimate - left), abs(estimate - up), abs(estimate - corner)
            predictor = left if pa <= pb and pa <= pc else up if pb <= pc else corner
            line[i] = (line[i] + predictor) & 0xFF
    return bytes(line)


def check_not_blank(bpp: int, rows: list[bytes]) -> None:
    """Many colours, much that is not background, and the chart colours (green and red bars) present."""
    colours: set[bytes] = set()
    background = rows[0][:3]
    busy = green = red = sampled = 0
    for row in rows[::3]:
        for x in range(0, len(row), 3 * bpp):
            pixel = row[x : x + 3]
            colours.add(pixel)
            sampled += 1
            busy += pixel != background
            r, g, b = pixel
            green += abs(r - 0x2E) < 12 and abs(g - 0x9D) < 12 and abs(b - 0x57) < 12
            red += abs(r - 0xD2) < 12 and abs(g - 0x45) < 12 and abs(b - 0x45) < 12
    assert len(colours) > 50, f"only {len(colours)} colours"
    assert busy > sampled * 0.2, f"{busy} of {sampled} sampled pixels differ from the background"
    assert green > 20 and red > 5, (green, red)
