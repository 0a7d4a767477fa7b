"""Toolset sampling: exact conditional distribution given at least one toolset, seeded per work item."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest

from trajkit.tools.distributions import Distribution, rng_for


def exact_conditional(probabilities: dict[str, float]) -> dict[tuple[str, ...], float]:
    names = sorted(probabilities)
    table = {}
    for flips in itertools.product([0, 1], repeat=len(names)):
        p = 1.0
        for name, flip in zip(names, flips, strict=True):
            p *= probabilities[name] if flip else 1 - probabilities[name]
        table[tuple(n for n, f in zip(names, flips, strict=True) if f)] = p
    empty = table.pop(())
    return {combo: p / (1 - empty) for combo, p in table.items()}


@pytest.mark.parametrize(
    "probabilities",
    [
        {"a": 0.1, "b": 0.05, "c": 0.2},
        {"a": 0.8, "b": 0.8, "c": 0.3, "d": 0.1},
        {"a": 0.5},
        {"a": 0.0, "b": 0.01},
    ],
)
def test_draws_follow_the_exact_conditional_distribution(probabilities: dict[str, float]) -> None:
    distribution = Distribution("t", "", probabilities)
    rng = random.Random(7)
    draws = 40_000
    seen = Counter(tuple(distribution.sample(rng)) for _ in range(draws))
    assert () not in seen
    for combo, p in exact_conditional(probabilities).items():
        assert abs(seen[combo] / draws - p) < 0.012, (combo, seen[combo] / draws, p)


def test_a_draw_depends_on_seed_and_work_item_only() -> None:
    distribution = Distribution("t", "", {"a": 0.5, "b": 0.5, "c": 0.5})
    first = [distribution.sample(rng_for(3, f"w{i}.0")) for i in range(50)]
    again = [distribution.sample(rng_for(3, f"w{i}.0")) for i in reversed(range(50))][::-1]
    other_seed = [distribution.sample(rng_for(4, f"w{i}.0")) for i in range(50)]
    assert first == again
    assert first != other_seed


def test_invalid_distributions_are_refused() -> None:
    with pytest.raises(ValueError, match="not in"):
        Distribution("bad", "", {"a": 1.5})
    with pytest.raises(ValueError, match="probability 0"):
        Distribution("zero", "", {"a": 0.0})


def test_a_restricted_draw_is_exact_over_what_is_left() -> None:
    """Toolsets a run cannot offer are taken out before the draw: the draw is then the exact
    conditional distribution over the rest, not the full draw with those toolsets dropped (which
    would leave some prompts with nothing)."""
    full = Distribution("t", "", {"web": 0.9, "browser": 0.7, "vision": 0.5, "terminal": 0.1, "file": 0.3})
    left = full.restricted(["terminal", "file"])
    assert dict(left.probabilities) == {"terminal": 0.1, "file": 0.3}
    rng = random.Random(11)
    draws = 40_000
    seen = Counter(tuple(left.sample(rng)) for _ in range(draws))
    for combo, p in exact_conditional({"terminal": 0.1, "file": 0.3}).items():
        assert abs(seen[combo] / draws - p) < 0.012, (combo, seen[combo] / draws, p)
    shares = left.marginals()
    assert shares["file"] == pytest.approx(0.3 / (1 - 0.9 * 0.7))
    assert abs(sum("file" in combo for combo in seen.elements()) / draws - shares["file"]) < 0.012
    assert full.restricted(["terminal"]).marginals() == {"terminal": 1.0}
