"""``trajkit compare`` on real runs: three models of known skill on one suite, compared.

The runs drive the real CLI against the project's HTTP test server with :class:`GradedPolicy`,
whose models pass a known number of each task's samples, so every figure is computed here by hand
from the skill tables (Wilson's formula written out, pass@k and pass^k by enumerating subsets of
samples, the paired bootstrap's exact distribution by enumerating every resample), never by the
code under test. The page is opened in headless Chromium, and a run still going (then killed with
SIGKILL) is compared with what its ledger holds.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import read_jsonl, trajkit, write_jsonl
from tests.test_report import DevTools, check_not_blank, decode_png, report_browser
from trajkit.testing.openai_server import Body, Fault, OpenAITestServer
from trajkit.testing.policies import GradedPolicy, Skill

SAMPLES = 4
SHELL = "shell <b>&</b> </script>"
"""The shell tasks' source: markup in a row's field must show as text on the page."""
ROWS = [
    {"prompt": "What is 6 x 7? [task:a1] [answer:42]", "answer": "42", "source": "arith"},
    {"prompt": "What is 2 + 2? [task:a2] [answer:4]", "answer": "4", "source": "arith"},
    {"prompt": "What is 3 x 3? [task:a3] [answer:9]", "answer": "9", "source": "arith"},
    {"prompt": "Create done1.txt [task:s1] [touch:done1.txt]", "check": "test -f done1.txt", "source": SHELL},
    {"prompt": "Create done2.txt [task:s2] [touch:done2.txt]", "check": "test -f done2.txt", "source": SHELL},
    {"prompt": "Say hello [task:c1]", "source": "chat"},
]
SOURCE = {"a1": "arith", "a2": "arith", "a3": "arith", "s1": SHELL, "s2": SHELL, "c1": "chat"}
SCORED = ["a1", "a2", "a3", "s1", "s2"]
SKILLS = {
    "alpha": Skill({"a1": 4, "a2": 3, "a3": 1, "s1": 4, "s2": 2}),
    "beta": Skill(
        {"a1": 4, "a2": 4, "a3": 3, "s1": 2, "s2": 0},
        bad_call=True,
        usage={"prompt_tokens": 150, "completion_tokens": 30, "cost": 0.002},
    ),
    # no tools: it cannot create a file, so it passes no shell task; and every request of s2 fails
    "gamma": Skill({"a1": 2, "a2": 1}, tools=False, usage={"prompt_tokens": 80, "completion_tokens": 10, "cost": 0.0005}),
}  # fmt: skip
CALLS = {"alpha": 2, "beta": 3, "gamma": 1}
"""Model calls per session: a tool call (beta: a broken one first) and the answer; gamma answers."""
EXTRA = {
    "alpha": ["--distribution", "terminal_only"],
    "beta": ["--distribution", "terminal_only", "--temperature", "0.7"],
    "gamma": ["--max_turns", "4", "--max_attempts", "1", "--max_retries", "0"],
}
Z = 1.959963984540054
"""The standard normal's 97.5 % quantile."""


def gamma_fails_s2(_number: int, body: Body) -> Fault | None:
    if body["model"] == "gamma" and "[task:s2]" in json.dumps(body["messages"]):
        return Fault(status=500, message="upstream exploded")
    return None


def run_args(dataset: Path, out: Path, model: str, base_url: str) -> list[str]:
    # Figures must be exact, so no sandbox isolation: bubblewrap's bind mount of /var can fail
    # while a shared machine's Docker mounts change under it, and a failed `touch` flips a score.
    return [
        "run", "--dataset_file", str(dataset), "--run_name", model, "--output_dir", str(out),
        "--model", model, "--base_url", base_url, "--samples_per_prompt", str(SAMPLES), "--quiet",
        "--local.isolation", "none", "--sandbox_option", f"local.root={out / 'sandboxes'}",
        *EXTRA.get(model, ["--distribution", "terminal_only"]),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three runs of the suite, one per model; returns the output directory holding them."""
    out = tmp_path_factory.mktemp("compare")
    dataset = write_jsonl(out / "suite.jsonl", list(ROWS))
    (out / "sandboxes").mkdir()
    latency = lambda body: 0.02 if body["model"] == "gamma" else 0.0  # noqa: E731
    with OpenAITestServer(GradedPolicy(SKILLS), faults=gamma_fails_s2, latency=latency) as server:
        for model in SKILLS:
            result = trajkit(*run_args(dataset, out, model, server.base_url))
            assert result.returncode == (1 if model == "gamma" else 0), result.stderr
    return out


def compare_json(*run_dirs: Path) -> dict[str, Any]:
    result = trajkit("compare", *map(str, run_dirs), "--json")
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


# -- the hand computation --------------------------------------------------------------------------


def wilson(passed: int, total: int) -> tuple[float, float]:
    p = passed / total
    centre = (p + Z * Z / (2 * total)) / (1 + Z * Z / total)
    half = Z / (1 + Z * Z / total) * math.sqrt(p * (1 - p) / total + Z * Z / (4 * total * total))
    return centre - half, centre + half


def outcomes(model: str, task: str, samples: int = SAMPLES) -> list[bool]:
    """Each sample of a task passed or not, as the skill table says."""
    solved = 0 if (task.startswith("s") and not SKILLS[model].tools) else SKILLS[model].solves.get(task, 0)
    return [i < solved for i in range(samples)]


def pass_at(groups: list[list[bool]], k: int, every: bool) -> tuple[float, int]:
    """pass@k (any) or pass^k (every) by enumerating each prompt's k-subsets of samples; the mean
    over the prompts that have k samples, and how many those are."""
    counted = [g for g in groups if len(g) >= k]
    rates = []
    for group in counted:
        subsets = list(itertools.combinations(group, k))
        rates.append(sum((all if every else any)(s) for s in subsets) / len(subsets))
    return sum(rates) / len(rates), len(counted)


def exact_bootstrap_cdf(differences: list[float]) -> list[tuple[float, float]]:
    """The exact distribution of the resampled mean: every one of m^m resamples, equally likely;
    (value, P(mean <= value)) for each value it takes."""
    m = len(differences)
    counts: dict[float, int] = {}
    for resample in itertools.product(differences, repeat=m):
        mean = round(sum(resample) / m, 9)
        counts[mean] = counts.get(mean, 0) + 1
    total, running, cdf = m**m, 0, []
    for value in sorted(counts):
        running += counts[value]
        cdf.append((value, running / total))
    return cdf


def check_interval(interval: list[float], differences: list[float]) -> None:
    """The bootstrap's 2.5 % and 97.5 % points lie where the exact distribution puts them (up to the
    sampling error of 2000 resamples: 1.5 % of probability either way)."""
    cdf = exact_bootstrap_cdf(differences)

    def below(x: float) -> float:  # P(mean < x)
        return max((p for v, p in cdf if v < x - 1e-9), default=0.0)

    def at_most(x: float) -> float:  # P(mean <= x)
        return max((p for v, p in cdf if v <= x + 1e-9), default=0.0)

    low, high = interval
    assert below(low) <= 0.025 + 0.015 and at_most(low) >= 0.025 - 0.015, (low, cdf)
    assert below(high) <= 0.975 + 0.015 and at_most(high) >= 0.975 - 0.015, (high, cdf)


@dataclass
class Expected:
    scored: int
    passed: int
    tasks: list[str]
    model: str


def expected_figures(model: str, tasks: list[str]) -> Expected:
    scored = [t for t in tasks if t in SCORED]
    return Expected(
        scored=len(scored) * SAMPLES,
        passed=sum(sum(outcomes(model, t)) for t in scored),
        tasks=tasks,
        model=model,
    )


def ledger(run_dir: Path) -> list[dict[str, Any]]:
    return [r for path in sorted(run_dir.glob("batch_*.jsonl")) for r in read_jsonl(path)]


def task_of(record: dict[str, Any]) -> str:
    return record["conversations"][1]["value"].split("[task:")[1].split("]")[0]


# -- the three runs compared -----------------------------------------------------------------------

SHARED = ["a1", "a2", "a3", "s1", "c1"]
"""gamma has no trajectory of s2 (every request failed): the other tasks are every run's."""


def test_three_models_compare_as_a_hand_computation_says(suite: Path) -> None:
    data = compare_json(suite / "alpha", suite / "beta", suite / "gamma")
    assert data["baseline"] == "alpha" and [r["label"] for r in data["runs"]] == list(SKILLS)
    assert data["rows"] == {
        "shared": 5,
        "in_any_run": 6,
        "sources": sorted({"arith", SHELL, "chat"}),
        "scored_sources": sorted({"arith", SHELL}),
    }
    for run in data["runs"]:
        model = run["label"]
        assert (run["model"], run["running"], run["trajectories_in_ledger"]) == (
            model,
            None,
            24 - 4 * (model == "gamma"),
        )
        check_figures(run["figures"], model, SHARED, suite / model)
        for source in ("arith", SHELL):
            tasks = [t for t in SHARED if SOURCE[t] == source]
            check_pass_rates(run["by_source"][source], expected_figures(model, tasks))
        chat = run["by_source"]["chat"]
        assert (chat["trajectories"], chat["scored"], chat["pass_rate"], chat["pass_rate_interval"]) == (
            4,
            0,
            None,
            None,
        )

    alpha, beta, gamma = data["runs"]
    # counted apart: s2, which gamma lacks (its only failing prompt)
    assert alpha["apart"] == {"prompts": 1, "trajectories": 4, "scored": 4, "passed": 2, "pass_rate": 0.5,
                              "missing_prompts": 0, "missing_prompts_failing": 0}  # fmt: skip
    assert beta["apart"] == {"prompts": 1, "trajectories": 4, "scored": 4, "passed": 0, "pass_rate": 0.0,
                             "missing_prompts": 0, "missing_prompts_failing": 0}  # fmt: skip
    assert gamma["apart"] == {"prompts": 0, "trajectories": 0, "scored": 0, "passed": 0, "pass_rate": None,
                              "missing_prompts": 1, "missing_prompts_failing": 1}  # fmt: skip
    failures = [e for e in read_jsonl(suite / "gamma" / "failures.jsonl")]
    classes = {e["error_class"] for e in failures}
    assert len(failures) == SAMPLES and len(classes) == 1
    assert gamma["failures"]["failed_attempts_by_class"] == {classes.pop(): SAMPLES}
    assert gamma["failures"]["failing"] == SAMPLES and alpha["failures"]["failed_attempts"] == 0

    assert alpha["paired"] is None
    check_paired(beta["paired"], "beta", SCORED)  # both have s2
    check_paired(gamma["paired"], "gamma", ["a1", "a2", "a3", "s1"])


def check_pass_rates(figures: dict[str, Any], expected: Expected) -> None:
    assert (figures["scored"], figures["passed"]) == (expected.scored, expected.passed)
    assert figures["pass_rate"] == pytest.approx(expected.passed / expected.scored, abs=1e-6)
    assert figures["pass_rate_interval"] == pytest.approx(wilson(expected.passed, expected.scored), abs=1e-6)
    groups = [outcomes(expected.model, t) for t in expected.tasks if t in SCORED]
    assert [a["k"] for a in figures["at_k"]] == [1, 2, 3, 4]
    for found in figures["at_k"]:
        any_k, counted = pass_at(groups, found["k"], every=False)
        every_k, _ = pass_at(groups, found["k"], every=True)
        assert (found["pass_at_k"], found["pass_hat_k"]) == pytest.approx((any_k, every_k), abs=1e-6)
        assert found["prompts"] == counted == len(groups)


def check_figures(figures: dict[str, Any], model: str, tasks: list[str], run_dir: Path) -> None:
    expected = expected_figures(model, tasks)
    check_pass_rates(figures, expected)
    n = len(tasks) * SAMPLES
    usage, calls = SKILLS[model].usage, CALLS[model]
    assert (figures["prompts"], figures["trajectories"]) == (len(tasks), n)
    assert figures["samples_per_prompt"] == {"min": SAMPLES, "max": SAMPLES}
    assert figures["turns"] == calls and figures["completed"] == 1.0
    assert figures["tokens"] == {
        "prompt": calls * usage["prompt_tokens"],
        "completion": calls * usage["completion_tokens"],
        "total": calls * (usage["prompt_tokens"] + usage["completion_tokens"]),
    }
    assert figures["cost"] == pytest.approx(n * calls * usage["cost"], abs=1e-6)
    assert figures["cost_per_trajectory"] == pytest.approx(calls * usage["cost"], abs=1e-6)
    assert figures["cost_per_passed"] == pytest.approx(n * calls * usage["cost"] / expected.passed, abs=1e-6)
    durations = [r["duration_s"] for r in ledger(run_dir) if task_of(r) in tasks]
    assert len(durations) == n
    assert figures["latency_s"]["mean"] == pytest.approx(statistics.fmean(durations), abs=1e-6)
    assert figures["latency_s"]["median"] == pytest.approx(statistics.median(durations), abs=1e-6)
    assert figures["latency_s"]["p90"] == pytest.approx(
        statistics.quantiles(durations, n=10, method="inclusive")[-1], abs=1e-6
    )
    assert figures["latency_s"]["max"] == pytest.approx(max(durations), abs=1e-6)
    if SKILLS[model].tools:
        per = 2 if SKILLS[model].bad_call else 1
        errors = 1 if SKILLS[model].bad_call else 0
        assert figures["tools"] == {
            "terminal": {
                "calls": per * n,
                "errors": errors * n,
                "calls_per_trajectory": per,
                "error_rate": errors / per,
            }
        }
        assert (figures["tool_calls"], figures["tool_error_rate"]) == (per, errors / per)
        assert figures["toolsets_offered"] == {"file": 1.0, "terminal": 1.0}
    else:
        assert (figures["tools"], figures["tool_calls"], figures["tool_error_rate"]) == ({}, 0, None)
        assert figures["toolsets_offered"] == {"code": 1.0, "file": 1.0, "terminal": 1.0}
    assert figures["invalid_tool_calls"] == 0


def check_paired(paired: dict[str, Any], model: str, tasks: list[str]) -> None:
    def fraction(m: str, task: str) -> float:
        return sum(outcomes(m, task)) / SAMPLES

    differences = [fraction(model, t) - fraction("alpha", t) for t in tasks]
    assert paired["prompts"] == len(tasks)
    assert paired["difference"] == pytest.approx(sum(differences) / len(tasks), abs=1e-6)
    better, worse = sum(d > 0 for d in differences), sum(d < 0 for d in differences)
    assert (paired["better"], paired["worse"], paired["same"]) == (better, worse, len(tasks) - better - worse)
    assert paired["method"].startswith(f"paired bootstrap over {len(tasks)} prompts")
    check_interval(paired["interval"], differences)
    for source, found in paired["by_source"].items():
        mine = [t for t in tasks if SOURCE[t] == source]
        if not mine:
            assert found is None
            continue
        part = [fraction(model, t) - fraction("alpha", t) for t in mine]
        assert found["difference"] == pytest.approx(sum(part) / len(part), abs=1e-6)
        check_interval(found["interval"], part)


def test_what_the_runs_offered_differently_is_said_first(suite: Path) -> None:
    data = compare_json(suite / "alpha", suite / "beta", suite / "gamma")
    found = {d["what"]: d["values"] for d in data["differences"]}
    assert set(found) == {"distribution", "max_turns", "temperature", "tools offered", "toolsets drawn"}
    assert found["distribution"] == {"alpha": "terminal_only", "beta": "terminal_only", "gamma": "sandboxed"}
    assert found["max_turns"] == {"alpha": 10, "beta": 10, "gamma": 4}
    assert found["temperature"] == {"alpha": None, "beta": 0.7, "gamma": None}
    assert set(found["tools offered"]["gamma"]) - set(found["tools offered"]["alpha"]) == {"execute_code"}
    assert found["toolsets drawn"] == {
        "alpha": ["file", "terminal"],
        "beta": ["file", "terminal"],
        "gamma": ["code", "file", "terminal"],
    }
    # alpha and beta differ only in temperature; the settings of how a run was carried out
    # (max_attempts, max_retries, the run name, the model) are no difference
    pair = compare_json(suite / "alpha", suite / "beta")
    assert [d["what"] for d in pair["differences"]] == ["temperature"]

    result = trajkit("compare", str(suite / "alpha"), str(suite / "beta"), str(suite / "gamma"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "These runs differ in what they offered (compared all the same):"
    assert lines[1] == "  distribution: alpha terminal_only · beta terminal_only · gamma sandboxed"
    assert "  toolsets drawn (beyond file, terminal): alpha (none) · beta (none) · gamma code" in lines
    low, high = wilson(12, 16)
    assert f"75.0% [{100 * low:.1f}%, {100 * high:.1f}%]" in result.stdout
    assert "gamma lacks 1 that others have, 1 of them failing" in " ".join(result.stdout.split())


# -- the page in a browser ---------------------------------------------------------------------------

browser = pytest.fixture(scope="module", name="browser")(report_browser)


@pytest.fixture(scope="module")
def page(suite: Path) -> Path:
    path = suite / "pages" / "compare.html"
    result = trajkit(
        "compare", str(suite / "alpha"), str(suite / "beta"), str(suite / "gamma"), "--html", str(path)
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == f"wrote {path}"
    return path


def test_the_page_draws_its_charts_offline_and_shows_markup_as_text(browser: DevTools, page: Path) -> None:
    browser.open(page.as_uri())
    assert browser.problems() == []
    assert [url for url in browser.requests() if not url.startswith(("file:", "data:"))] == []
    assert browser.js("document.title") == "trajkit compare: alpha · beta · gamma"
    groups = 3  # all, arith, shell (chat has no check)
    assert browser.count("#chart-pass-rates circle.dot") == 3 * groups
    assert browser.count("#chart-paired circle.dot") == 2 * groups
    assert browser.count("#chart-paired line.zero") == 1
    assert browser.count("#chart-at-k polyline") == 3 * 2  # pass@k and pass^k per run
    assert browser.count("#chart-cost circle.dot") == 3
    # terminal: alpha's calls, beta's good and failed calls; gamma called no tool
    assert browser.count("#chart-tools rect.bar") == 3 and browser.count("#chart-tools rect.bar.bad") == 1
    for chart in ("pass-rates", "paired", "at-k", "cost", "tools", "turns", "tokens", "latency"):
        width, height = browser.size(f"#chart-{chart} svg")
        assert width > 200 and height > 40, chart
    # every dot of the pass-rate chart sits at its rate: 0 % on the left edge of the axis, 100 % on the right
    positions = browser.js(
        "[...document.querySelectorAll('#chart-pass-rates circle.dot')].map(c => Number(c.getAttribute('cx')))"
    )
    left, right = browser.js(
        "(() => { const xs = [...document.querySelectorAll('#chart-pass-rates line.axis')]"
        ".map(l => Number(l.getAttribute('x1'))); return [Math.min(...xs), Math.max(...xs)]; })()"
    )
    rates = [12 / 16, 13 / 16, 3 / 16, 8 / 12, 11 / 12, 3 / 12, 4 / 4, 2 / 4, 0 / 4]
    assert positions == pytest.approx([left + (right - left) * r for r in rates], abs=0.01)

    # what the runs differ in heads the page; sources with markup are text, in tables and charts
    assert browser.js("document.querySelector('main').firstElementChild.id") == "differences"
    assert browser.count("#differences tbody tr") == 5
    assert browser.count("b") == 0
    cells = browser.js("[...document.querySelectorAll('#table-sources tbody th')].map(t => t.textContent)")
    assert f"{SHELL}: pass rate [95%]" in cells
    groups_shown = browser.js(
        "[...document.querySelectorAll('#chart-pass-rates text.group')].map(t => t.textContent)"
    )
    assert groups_shown == ["all", "arith", SHELL]
    figures = browser.js(
        "Object.fromEntries([...document.querySelectorAll('#table-figures tbody tr')]"
        ".map(r => [r.cells[0].textContent.trim(), [...r.cells].slice(1).map(c => c.textContent)]))"
    )
    assert figures["passed / scored"] == ["12 / 16", "13 / 16", "3 / 16"]
    assert figures["turns / trajectory"] == ["2", "3", "1"]
    assert figures["cost / trajectory"] == ["$0.0020", "$0.0060", "$0.0005"]

    shot = browser.call("Page.captureScreenshot", format="png")
    import base64

    _, bpp, rows = decode_png(base64.b64decode(shot["data"]))
    check_not_blank(bpp, rows)


# -- a run still going ---------------------------------------------------------------------------------


@pytest.fixture
def held_server() -> Iterator[tuple[OpenAITestServer, GradedPolicy]]:
    """delta: alpha's skill, but only the first 2 sessions of a3 and none of s2 are answered until
    the policy is released."""
    policy = GradedPolicy({"delta": Skill(SKILLS["alpha"].solves, waits={"a3": 2, "s2": 0})})
    with OpenAITestServer(policy) as server:
        try:
            yield server, policy
        finally:
            policy.release()


def test_a_run_still_going_compares_with_what_it_has_then_after_kill_9(
    suite: Path, held_server: tuple[OpenAITestServer, GradedPolicy]
) -> None:
    server, policy = held_server
    dataset = suite / "suite.jsonl"
    out = suite / "going"
    process = subprocess.Popen(
        [sys.executable, "-m", "trajkit", *run_args(dataset, out, "delta", server.base_url)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")},
    )
    run_dir = out / "delta"
    try:
        finished = 4 + 4 + 2 + 4 + 4  # a1, a2, 2 of a3, s1, c1
        deadline = time.monotonic() + 60
        while not (policy.waiting == 6 and len(ledger(run_dir)) == finished):
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            assert time.monotonic() < deadline, (policy.waiting, len(ledger(run_dir)))
            time.sleep(0.05)

        data = compare_json(suite / "alpha", run_dir)
        delta = data["runs"][1]
        assert delta["running"] is not None and f"pid {process.pid}" in delta["running"]
        check_going(data, finished)
        table = trajkit("compare", str(suite / "alpha"), str(run_dir), env={"COLUMNS": "400"})
        assert f"running (pid {process.pid}" in table.stdout
        assert not (run_dir / "statistics.json").exists()  # nothing but the ledger to go on
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    data = compare_json(suite / "alpha", run_dir)
    assert data["runs"][1]["running"] is None
    check_going(data, finished)


def check_going(data: dict[str, Any], finished: int) -> None:
    alpha, delta = data["runs"]
    assert delta["trajectories_in_ledger"] == finished
    assert data["rows"]["shared"] == 5
    assert alpha["apart"]["prompts"] == 1 and delta["apart"]["missing_prompts"] == 1
    assert delta["apart"]["missing_prompts_failing"] == 0  # s2 waits: it has not failed
    figures = delta["figures"]
    assert (figures["trajectories"], figures["samples_per_prompt"]) == (finished, {"min": 2, "max": 4})
    groups = [outcomes("alpha", t, 2 if t == "a3" else SAMPLES) for t in ("a1", "a2", "a3", "s1")]
    passed, scored = sum(map(sum, groups)), sum(map(len, groups))
    assert (figures["scored"], figures["passed"]) == (scored, passed) == (14, 12)
    assert figures["pass_rate_interval"] == pytest.approx(wilson(passed, scored), abs=1e-6)
    for found in figures["at_k"]:
        any_k, counted = pass_at(groups, found["k"], every=False)
        every_k, _ = pass_at(groups, found["k"], every=True)
        assert (found["pass_at_k"], found["pass_hat_k"], found["prompts"]) == (
            pytest.approx(any_k, abs=1e-6),
            pytest.approx(every_k, abs=1e-6),
            counted,
        )
    assert [a["prompts"] for a in figures["at_k"]] == [4, 4, 3, 3]
    # paired on the prompts both scored: a3 counts with the samples delta has so far
    differences = [
        sum(g) / len(g) - sum(outcomes("alpha", t)) / SAMPLES
        for g, t in zip(groups, ["a1", "a2", "a3", "s1"], strict=True)
    ]
    assert delta["paired"]["prompts"] == 4
    assert delta["paired"]["difference"] == pytest.approx(sum(differences) / 4, abs=1e-6)


# -- usage errors ---------------------------------------------------------------------------------------


def test_compare_needs_two_distinct_run_directories(suite: Path, tmp_path: Path) -> None:
    one = trajkit("compare", str(suite / "alpha"))
    assert one.returncode == 2 and "compare needs two or more run directories" in one.stderr
    twice = trajkit("compare", str(suite / "alpha"), str(suite / "alpha"))
    assert twice.returncode == 2 and f"{suite / 'alpha'} is given twice" in twice.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    nothing = trajkit("compare", str(suite / "alpha"), str(empty))
    assert nothing.returncode == 1
    assert (
        f"{empty}: not a trajkit run directory (no batch_*.jsonl ledger and no failures.jsonl)"
        in nothing.stderr
    )
