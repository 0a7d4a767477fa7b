"""``trajkit compare``'s statistics and its reading of unusual run directories, in isolation.

Every expected value is worked out here by hand (closed forms written out, or enumeration)."""

from __future__ import annotations

import itertools
import json
import math
import statistics
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import trajkit
from tests.test_ledger import ledger_record
from trajkit.plugins.compare import stats as compare_stats
from trajkit.plugins.compare.stats import at_k, paired, pass_at_k, pass_hat_k, wilson


def test_wilson_matches_published_intervals() -> None:
    # Newcombe (1998), table I, the score method: 81/263 -> 0.2553-0.3662; 15/148 -> 0.0624-0.1605;
    # 0/20 -> 0-0.1611; 1/29 -> 0.0061-0.1718
    assert wilson(81, 263) == pytest.approx((0.2553, 0.3662), abs=5e-5)
    assert wilson(15, 148) == pytest.approx((0.0624, 0.1605), abs=5e-5)
    assert wilson(0, 20) == pytest.approx((0.0, 0.1611), abs=5e-5)
    assert wilson(1, 29) == pytest.approx((0.0061, 0.1718), abs=5e-5)
    assert wilson(0, 0) is None


@pytest.mark.parametrize(("n", "c"), [(n, c) for n in range(1, 7) for c in range(n + 1)])
def test_pass_at_k_and_pass_hat_k_are_what_subsets_of_samples_say(n: int, c: int) -> None:
    samples = [True] * c + [False] * (n - c)
    for k in range(1, n + 1):
        subsets = list(itertools.combinations(samples, k))
        assert pass_at_k(n, c, k) == pytest.approx(sum(map(any, subsets)) / len(subsets))
        assert pass_hat_k(n, c, k) == pytest.approx(sum(map(all, subsets)) / len(subsets))


def test_at_k_averages_each_k_over_the_prompts_that_have_k_samples() -> None:
    found = at_k([(4, 1), (2, 2), (1, 0)])
    assert [(a.k, a.prompts) for a in found] == [(1, 3), (2, 2), (3, 1), (4, 1)]
    assert found[0].pass_at_k == pytest.approx((1 / 4 + 1 + 0) / 3)
    assert found[1].pass_at_k == pytest.approx((1 - 3 / 6 + 1) / 2)
    assert found[1].pass_hat_k == pytest.approx((0 + 1) / 2)
    assert (found[3].pass_at_k, found[3].pass_hat_k) == (1.0, 0.0)


def test_paired_difference_of_identical_runs_is_exactly_zero() -> None:
    found = paired([0.0] * 7)
    assert found is not None
    assert (found.difference, found.interval, found.better, found.worse, found.same) == (
        0.0,
        (0.0, 0.0),
        0,
        0,
        7,
    )
    assert paired([]) is None


def test_many_prompts_use_the_normal_approximation_and_say_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compare_stats, "BOOTSTRAP_PROMPTS", 10)
    differences = [1.0, 0.5, 0.0, 0.0, -0.25, 0.75, 1.0, 0.0, 0.0, 0.5, 0.25]
    found = paired(differences)
    assert found is not None
    mean = sum(differences) / 11
    spread = math.sqrt(sum((d - mean) ** 2 for d in differences) / 11)  # the bootstrap's: divided by m
    half = 1.959963984540054 * spread / math.sqrt(11)
    assert found.interval == pytest.approx((mean - half, mean + half))
    assert found.method == "normal approximation to the paired bootstrap over 11 prompts"
    assert paired(differences[:10]) is not None
    assert paired(differences[:10]).method.startswith("paired bootstrap over 10 prompts, 2000 resamples")  # type: ignore[union-attr]


# -- run directories of unusual shape ------------------------------------------------------------


def write_run(run_dir: Path, records: list[dict[str, Any]], manifest: dict[str, Any] | str | None) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "batch_0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if isinstance(manifest, str):
        (run_dir / "run.json").write_text(manifest)
    elif manifest is not None:
        (run_dir / "run.json").write_text(json.dumps(manifest))
    return run_dir


def record(prompt: str, duration: float, **fields: Any) -> dict[str, Any]:
    return ledger_record(f"{prompt}.0", duration_s=duration, **fields)


def test_runs_of_one_sample_without_checks_or_settings_compare_by_name_or_path(tmp_path: Path) -> None:
    config = {"run_name": "r", "model": "m", "max_turns": 3}
    first = write_run(
        tmp_path / "one" / "r", [record("p1", 1.0), record("p2", 3.0)], {"run_name": "r", "config": config}
    )
    second = write_run(tmp_path / "two" / "r", [record("p2", 2.0), record("p3", 5.0)], "{ damaged")
    result = trajkit("compare", str(first), str(second), "--json")
    assert result.returncode == 0, result.stderr
    assert "run.json is damaged" in result.stderr
    data = json.loads(result.stdout)
    # same name twice: the directories as given tell them apart; a run without settings differs in none
    assert [r["label"] for r in data["runs"]] == [str(first), str(second)]
    assert data["differences"] == []
    assert data["rows"]["shared"] == 1 and data["rows"]["in_any_run"] == 3
    one, two = (r["figures"] for r in data["runs"])
    assert (one["trajectories"], one["scored"], one["pass_rate"], one["at_k"]) == (1, 0, None, [])
    assert (one["latency_s"]["mean"], two["latency_s"]["mean"]) == (3.0, 2.0)
    assert one["cost"] is None and one["cost_per_trajectory"] is None
    assert data["runs"][1]["paired"] == {"prompts": 0, "difference": None, "by_source": {"(no source)": None}}
    table = trajkit("compare", str(first), str(second))
    assert table.returncode == 0, table.stderr
    assert "1 prompts finished by every run are compared" in " ".join(table.stdout.split())
    assert "These runs differ" not in table.stdout


def test_latency_percentiles_and_costs_of_a_handmade_ledger(tmp_path: Path) -> None:
    durations = [0.5, 4.0, 1.0, 2.5, 9.0]
    costs = [0.01, None, 0.03, 0.02, 0.04]
    records = [
        record(
            f"p{i}",
            d,
            usage={"prompt_tokens": 10 * i, "completion_tokens": i, "total_tokens": 11 * i, "cost": c},
            score={"passed": i % 2 == 0, "value": float(i % 2 == 0), "checks": []},
        )
        for i, (d, c) in enumerate(zip(durations, costs, strict=True))
    ]
    first = write_run(tmp_path / "a", records, None)
    second = write_run(tmp_path / "b", records[:3], None)
    data = json.loads(trajkit("compare", str(first), str(second), "--json").stdout)
    apart = data["runs"][0]["apart"]
    assert (apart["prompts"], apart["passed"], apart["scored"]) == (2, 1, 2)  # p3 failed, p4 passed
    figures = data["runs"][0]["figures"]  # p0, p1, p2
    assert figures["latency_s"] == {
        "mean": pytest.approx(statistics.fmean(durations[:3])),
        "median": 1.0,
        "p90": pytest.approx(statistics.quantiles(durations[:3], n=10, method="inclusive")[-1]),
        "max": 4.0,
    }
    assert figures["cost"] == pytest.approx(0.04)  # p1 reported none
    assert figures["cost_per_trajectory"] == pytest.approx(0.04 / 3)
    assert figures["cost_per_passed"] == pytest.approx(0.04 / 2)  # p0 and p2 passed
    assert figures["tokens"]["prompt"] == pytest.approx((0 + 10 + 20) / 3)


def test_every_template_and_static_file_is_package_data() -> None:
    """A page file or script the wheel leaves out would break ``trajkit report``, ``compare`` or a
    sandbox once installed: every file beside the code is matched by its package's package-data."""
    import fnmatch
    import tomllib

    root = Path(__file__).resolve().parent.parent
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    missing, seen = [], set()
    for path in sorted((root / "trajkit").rglob("*")):
        if not path.is_file() or path.suffix in (".py", ".pyc") or "__pycache__" in path.parts:
            continue
        package = path.parent
        while not (package / "__init__.py").exists():
            package = package.parent
        name = ".".join(package.relative_to(root).parts)
        relative = path.relative_to(package).as_posix()
        seen.add(f"{name}:{relative}")
        if not any(fnmatch.fnmatch(relative, p) for p in patterns.get(name, [])):
            missing.append(f"{name}:{relative}")
    assert {"trajkit.plugins.report:templates/page.html", "trajkit.plugins.compare:static/compare.js"} <= seen
    assert missing == []
