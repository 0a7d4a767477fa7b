"""Verified trajectories: rows with checks, scored in their sandbox (local and Docker) before it closes.

The runs use the offline scripted model (it writes ``notes.txt`` with the task, runs a command,
reads the notes back and answers "I completed the task ... The notes file records: TASK"), so
which checks pass is known: a check that finds the agent's ``notes.txt`` passes, one that looks
for something else fails.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import read_jsonl, trajkit, write_jsonl
from tests.test_report import DevTools, embedded_data, report_browser
from trajkit.hookspecs import hookimpl
from trajkit.manager import load_plugins
from trajkit.plugins.scorers import AnswerMatch, CommandCheck
from trajkit.record.scorers import Check, ScoreContext, Scorer, score_session
from trajkit.testing.engines import need_engine

ROWS: list[dict[str, Any] | str] = [
    {"prompt": "Write the notes", "check": "test -f notes.txt", "source": "unit"},
    {"prompt": "Write the notes again", "check": "grep -q 'notes again' notes.txt", "source": "unit"},
    {"prompt": "Find the answer", "check": "test -f answer.txt", "source": "unit"},
    {"prompt": "Say 42", "answer": "42", "source": "qa"},
    {"prompt": "Mention the notes", "answer_pattern": r"notes file records: Mention", "source": "qa"},
    {"prompt": "Slow check", "check": "sleep 120", "source": "unit"},
    {"prompt": "No check at all"},
]
PASSING = {0, 1, 4}
FAILING = {2, 3, 5}


def run_args(dataset: Path, out: Path, name: str, *extra: str) -> list[str]:
    return [
        "run", "--dataset_file", str(dataset), "--run_name", name, "--output_dir", str(out),
        "--distribution", "terminal_only", "--check_timeout", "10", "--quiet", *extra,
    ]  # fmt: skip


def by_index(path: Path) -> dict[int, dict[str, Any]]:
    return {r["prompt_index"]: r for r in read_jsonl(path)}


def assert_scored(run_dir: Path) -> None:
    records = by_index(run_dir / "trajectories.jsonl")
    assert set(records) == set(range(len(ROWS)))
    for index, record in records.items():
        score = record["score"]
        if index == 6:
            assert score is None
            continue
        assert score["passed"] is (index in PASSING), (index, score)
        assert score["value"] == (1.0 if index in PASSING else 0.0)
        [check] = score["checks"]
        assert check["scorer"] == ("answer" if index in (3, 4) else "command")
    assert records[0]["score"]["checks"][0]["detail"].startswith("exit 0")
    assert records[2]["score"]["checks"][0]["detail"].startswith("exit 1")
    assert records[3]["score"]["checks"][0]["detail"].startswith("expected '42', got 'I completed")
    assert records[5]["score"]["checks"][0]["detail"].startswith("timed out after 10s")
    scores = json.loads((run_dir / "statistics.json").read_text())["scores"]
    assert (scores["scored"], scores["passed"], scores["failed"], scores["pass_rate"]) == (6, 3, 3, 0.5)
    assert scores["by_source"] == {
        "qa": {"scored": 2, "passed": 1, "pass_rate": 0.5},
        "unit": {"scored": 4, "passed": 2, "pass_rate": 0.5},
    }
    assert scores["by_toolset"] == {
        "file": {"scored": 6, "passed": 3, "pass_rate": 0.5},
        "terminal": {"scored": 6, "passed": 3, "pass_rate": 0.5},
    }


def assert_filter_passed_keeps_the_passing(dataset: Path, out: Path, name: str) -> None:
    """A merge again with ``--filter passed``: only the passing rows are kept, the rest say why."""
    allow = ["--allow_change", "filters", "--allow_change", "passed.keep_unscored"]
    merged = trajkit(*run_args(dataset, out, name, "--resume", "--filter", "passed", *allow))
    assert merged.returncode == 0, merged.stderr
    run_dir = out / name
    assert set(by_index(run_dir / "trajectories.jsonl")) == PASSING
    reasons = {r["prompt_index"]: r["reason"] for r in read_jsonl(run_dir / "rejected.jsonl")}
    assert set(reasons) == FAILING | {6}
    assert reasons[6] == "passed: not scored: the row has no check"
    assert reasons[2].startswith("passed: failed its check (command: exit 1")
    assert reasons[5].startswith("passed: failed its check (command: timed out")
    kept_too = trajkit(
        *run_args(dataset, out, name, "--resume", "--filter", "passed", "--passed.keep_unscored", *allow)
    )
    assert kept_too.returncode == 0, kept_too.stderr
    assert set(by_index(run_dir / "trajectories.jsonl")) == PASSING | {6}


@pytest.fixture(scope="module")
def local_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("scored")
    dataset = write_jsonl(tmp / "checks.jsonl", ROWS)
    result = trajkit(*run_args(dataset, tmp / "out", "local"))
    assert result.returncode == 0, result.stderr
    return dataset, tmp / "out"


def test_checks_are_scored_in_the_local_sandbox(local_run: tuple[Path, Path]) -> None:
    dataset, out = local_run
    assert_scored(out / "local")
    assert_filter_passed_keeps_the_passing(dataset, out, "local")


def test_stats_and_report_show_the_pass_rates(local_run: tuple[Path, Path], tmp_path: Path) -> None:
    _, out = local_run
    run_dir = out / "local"
    stats = trajkit("stats", str(run_dir))
    assert stats.returncode == 0, stats.stderr
    assert "pass rate" in stats.stdout and "50.0%" in stats.stdout
    assert "source qa" in stats.stdout and "toolset terminal" in stats.stdout
    page = tmp_path / "report.html"
    report = trajkit("report", str(run_dir), "--out", str(page))
    assert report.returncode == 0, report.stderr
    data = embedded_data(page.read_text())
    assert data["statistics"]["scores"]["pass_rate"] == 0.5
    assert {(r["group"], r["name"], r["scored"], r["passed"]) for r in data["charts"]["pass_rates"]} == {
        ("toolset", "file", 6, 3), ("toolset", "terminal", 6, 3), ("source", "qa", 2, 1), ("source", "unit", 4, 2),
    }  # fmt: skip
    scored = [item for item in data["browse"]["items"] if item["score"]]
    assert len(scored) == 6


browser = pytest.fixture(scope="module", name="browser")(report_browser)


def test_the_report_page_shows_the_pass_rate(
    local_run: tuple[Path, Path], browser: DevTools, tmp_path: Path
) -> None:
    _, out = local_run
    page = tmp_path / "report.html"
    assert trajkit("report", str(out / "local"), "--out", str(page)).returncode == 0
    browser.open(page.as_uri())
    assert browser.text(".card[data-key='pass rate'] .value") == "50.0%"
    assert browser.text(".card[data-key='passed / scored'] .value") == "3 / 6"
    assert browser.count("#chart-pass-rates svg rect.bar.ok") == 4
    assert browser.count("#chart-pass-rates svg rect.bar.bad") == 4
    metas = "[...document.querySelectorAll('#traj-list .meta')].map(e => e.textContent)"
    assert sum("check passed" in m for m in browser.js(metas)) == 3
    assert sum("check failed" in m for m in browser.js(metas)) == 3
    assert browser.problems() == []


def test_a_check_a_scorer_cannot_use_is_a_bad_row_naming_file_and_line(tmp_path: Path) -> None:
    rows: list[dict[str, Any] | str] = [
        {"prompt": "fine", "answer": "x"},
        {"prompt": "bad pattern", "answer_pattern": "(unclosed"},
        {"prompt": "bad check", "check": ["pytest"]},
    ]
    dataset = write_jsonl(tmp_path / "bad.jsonl", rows)
    result = trajkit(*run_args(dataset, tmp_path / "out", "bad"))
    assert result.returncode == 1
    assert f"{dataset}:2: answer: 'answer_pattern' is not a valid regular expression" in result.stderr
    assert f"{dataset}:3: command: 'check' must be a non-empty command string" in result.stderr
    assert len(read_jsonl(tmp_path / "out" / "bad" / "trajectories.jsonl")) == 1


# -- Docker ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def docker_client() -> Any:
    from tests.test_docker_run import _docker_client, _why_unavailable

    need_engine("docker", _why_unavailable())
    return _docker_client()


def test_checks_are_scored_in_the_docker_sandbox_which_then_closes(
    tmp_path: Path, docker_client: Any
) -> None:
    from tests.test_docker_run import BUSYBOX, containers_of

    name = f"scored-{uuid.uuid4().hex[:8]}"
    rows = [{**row, "image": BUSYBOX, "cwd": "/srv/app"} if isinstance(row, dict) else row for row in ROWS]
    dataset = write_jsonl(tmp_path / "checks.jsonl", rows)
    out = tmp_path / "out"
    result = trajkit(*run_args(dataset, out, name, "--sandbox_option", "docker.pull=never"), timeout=300)
    assert result.returncode == 0, result.stderr
    assert_scored(out / name)
    assert {r["sandbox"]["backend"] for r in read_jsonl(out / name / "trajectories.jsonl")} == {"docker"}
    assert containers_of(docker_client, name) == [], "a sandbox outlived its scoring"
    assert_filter_passed_keeps_the_passing(dataset, out, name)


# -- the hook and the scorers themselves -----------------------------------------------------------


class Length(Scorer):
    """A third-party scorer: partial credit for an answer near a target length."""

    name = "length"
    fields = ("target_length",)

    async def score(self, context: ScoreContext) -> Check:
        target = int(context.row["target_length"])
        given = len(context.final_response or "")
        return Check(given >= target, min(1.0, given / target), f"{given} of {target} characters")


class LengthPlugin:
    @hookimpl
    def trajkit_scorers(self) -> list[type[Scorer]]:
        return [Length]


def test_a_plugin_s_scorer_is_registered_and_combined_with_the_built_ins() -> None:
    host = load_plugins(entry_points=False, extra=[("length", LengthPlugin())])
    assert {"answer", "command", "length"} <= set(host.scorers)
    scorers = [cls() for _, cls in sorted(host.scorers.items())]
    row = {"prompt": "p", "answer": "hello world", "target_length": 22}
    context = ScoreContext(row, "hello world", [], sandbox=None, timeout=1.0)  # type: ignore[arg-type]
    score = asyncio.run(score_session(scorers, context))
    assert score == {
        "passed": False,
        "value": 0.75,
        "checks": [
            {
                "scorer": "answer",
                "passed": True,
                "value": 1.0,
                "detail": "answer 'hello world' given exactly",
            },
            {"scorer": "length", "passed": False, "value": 0.5, "detail": "11 of 22 characters"},
        ],
    }
    assert asyncio.run(score_session(scorers, ScoreContext({"prompt": "p"}, "x", [], None, 1.0))) is None  # type: ignore[arg-type]


class Broken(Scorer):
    name = "broken"
    fields = ("broken",)

    async def score(self, context: ScoreContext) -> Check:
        raise KeyError("oops")


def test_a_broken_scorer_fails_its_check_not_the_session() -> None:
    context = ScoreContext({"prompt": "p", "broken": 1}, "x", [], None, 1.0)  # type: ignore[arg-type]
    score = asyncio.run(score_session([Broken()], context))
    assert score is not None and score["passed"] is False
    assert score["checks"][0]["detail"] == "the scorer failed: KeyError: 'oops'"


@pytest.mark.parametrize(
    ("row", "answer", "passed"),
    [
        ({"answer": "42"}, "  42\n", True),
        ({"answer": 42}, "42", True),
        ({"answer": "42"}, "The answer is 42.", False),
        ({"answer_pattern": r"\b42\b"}, "The answer is 42.", True),
        ({"answer": "41", "answer_pattern": r"\b42\b"}, "The answer is 42.", True),
        ({"answer_pattern": r"^42$"}, "The answer is 42.", False),
        ({"answer": "42"}, None, False),
    ],
)
def test_answer_match(row: dict[str, Any], answer: str | None, passed: bool) -> None:
    context = ScoreContext(row, answer, [], None, 1.0)  # type: ignore[arg-type]
    assert asyncio.run(AnswerMatch().score(context)).passed is passed


def test_row_problems() -> None:
    assert CommandCheck().row_problem({"check": ""}) is not None
    assert CommandCheck().row_problem({"check": "true"}) is None
    assert AnswerMatch().row_problem({"answer": {"a": 1}}) is not None
    assert AnswerMatch().row_problem({"answer_pattern": "[a-"}) is not None
