"""Toolset distributions: an independent inclusion probability per toolset.

A draw flips one coin per toolset and is conditioned on "at least one toolset": it is sampled
*exactly* from that conditional distribution (not by falling back to the most likely toolset),
and seeded by the run's seed and the work item's identity, so it does not depend on the order in
which prompts run. A run draws over the toolsets it can offer (:mod:`trajkit.tools.offer`): a
distribution naming others is :meth:`Distribution.restricted` to those first, and the draw is
then exact over what is left.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Distribution:
    name: str
    description: str
    probabilities: Mapping[str, float]
    """Toolset name -> probability in [0, 1] that the toolset is offered to a prompt."""
    default: bool = False
    """The distribution a run draws when none is named (one plugin's, at most)."""

    def __post_init__(self) -> None:
        for toolset, p in self.probabilities.items():
            if not 0.0 <= p <= 1.0:
                raise ValueError(
                    f"distribution {self.name!r}: probability of {toolset!r} is {p}, not in [0, 1]"
                )
        if not any(p > 0 for p in self.probabilities.values()):
            raise ValueError(f"distribution {self.name!r} gives every toolset probability 0")

    def drawn(self) -> list[str]:
        """The toolsets a draw can include (probability above 0), sorted."""
        return sorted(name for name, p in self.probabilities.items() if p > 0)

    def marginals(self) -> dict[str, float]:
        """Toolset -> the share of prompts that get it, given that every prompt gets at least one
        (each weight divided by the chance that a draw is not empty)."""
        none = 1.0
        for p in self.probabilities.values():
            none *= 1.0 - p
        return {name: round(p / (1.0 - none), 12) for name, p in self.probabilities.items() if p > 0}

    def restricted(self, toolsets: Iterable[str]) -> Distribution:
        """The distribution over ``toolsets`` alone (the others never drawn)."""
        kept = set(toolsets)
        probabilities = {name: p for name, p in self.probabilities.items() if name in kept}
        return Distribution(self.name, self.description, probabilities, self.default)

    def sample(self, rng: random.Random) -> list[str]:
        """Draw a non-empty set of toolsets, exactly from the conditional distribution.

        Coins are flipped in order. While none has come up yet, toolset i is taken with
        P(x_i | no earlier one, at least one from i on) = p_i / (1 - prod_{j>=i} (1 - p_j)),
        which makes the joint draw exact with one pass and no rejection loop.
        """
        names = sorted(self.probabilities)
        probs = [self.probabilities[n] for n in names]
        none_from = [1.0] * (len(probs) + 1)  # none_from[i] = P(no toolset among i..n-1)
        for i in range(len(probs) - 1, -1, -1):
            none_from[i] = none_from[i + 1] * (1.0 - probs[i])
        chosen: list[str] = []
        for i, (name, p) in enumerate(zip(names, probs, strict=True)):
            if not chosen:
                p = p / (1.0 - none_from[i])
            if rng.random() < p:
                chosen.append(name)
        return chosen


def rng_for(seed: int, work_id: str) -> random.Random:
    """A generator that depends only on the run's seed and the work item, not on run order."""
    return random.Random(f"{seed}:{work_id}")
