"""The statistics of ``trajkit compare``, computed exactly with the standard library.

- A pass rate's 95 % interval is Wilson's score interval (closed form; the normal quantile from
  :class:`statistics.NormalDist`).
- pass@k and pass^k are the unbiased estimators over a prompt's n samples of which c passed:
  pass@k = 1 - C(n-c, k) / C(n, k) (at least one of k samples passes, Chen et al. 2021) and
  pass^k = C(c, k) / C(n, k) (all k pass, Yao et al. 2024), averaged over prompts, with exact
  integer binomials.
- The paired difference of two runs is the mean, over the prompts both scored, of the difference of
  the prompt's pass fractions; its 95 % interval is a paired bootstrap over prompts (percentile,
  :data:`RESAMPLES` resamples, a fixed seed so the same runs give the same interval). Past
  :data:`BOOTSTRAP_PROMPTS` prompts the bootstrap is replaced by its normal approximation (mean
  +- z * the bootstrap standard error): from there on the two differ by less than the bootstrap's
  own resampling noise (about 0.002 at 1,000 prompts), and the bootstrap's cost grows with the
  prompts (resamples x prompts draws).

None of this needs SciPy: every figure is a closed form or a short resampling loop, so the
dependency would add a large install for no figure it computes better.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

CONFIDENCE = 0.95
Z = statistics.NormalDist().inv_cdf(0.5 + CONFIDENCE / 2)
RESAMPLES = 2000
BOOTSTRAP_PROMPTS = 1000
"""Above this many paired prompts, the normal approximation stands in for the bootstrap."""
SEED = 0


def wilson(passed: int, total: int, z: float = Z) -> tuple[float, float] | None:
    """Wilson's score interval for ``passed`` of ``total``; None when nothing was scored."""
    if total <= 0:
        return None
    p = passed / total
    denominator = 1 + z * z / total
    centre = (p + z * z / (2 * total)) / denominator
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def pass_at_k(samples: int, passed: int, k: int) -> float:
    """The probability that at least one of ``k`` samples drawn without replacement passes."""
    return 1.0 - math.comb(samples - passed, k) / math.comb(samples, k)


def pass_hat_k(samples: int, passed: int, k: int) -> float:
    """The probability that all ``k`` samples drawn without replacement pass."""
    return math.comb(passed, k) / math.comb(samples, k)


@dataclass(frozen=True)
class AtK:
    k: int
    pass_at_k: float
    pass_hat_k: float
    prompts: int
    """Prompts with at least ``k`` scored samples: the ones the figures average over."""


def at_k(groups: Sequence[tuple[int, int]]) -> list[AtK]:
    """pass@k and pass^k for k = 1 .. the most samples any prompt has, from ``(samples, passed)``
    per prompt; each k averages over the prompts that have at least k samples."""
    most = max((n for n, _ in groups), default=0)
    found = []
    for k in range(1, most + 1):
        counted = [(n, c) for n, c in groups if n >= k]
        found.append(
            AtK(
                k,
                statistics.fmean(pass_at_k(n, c, k) for n, c in counted),
                statistics.fmean(pass_hat_k(n, c, k) for n, c in counted),
                len(counted),
            )
        )
    return found


@dataclass(frozen=True)
class Paired:
    prompts: int
    difference: float
    """Mean over the prompts of (the run's pass fraction - the baseline's)."""
    interval: tuple[float, float]
    method: str
    better: int
    """Prompts where the run's pass fraction is higher than the baseline's."""
    worse: int
    same: int


def paired(differences: Sequence[float], seed: int = SEED) -> Paired | None:
    """The mean paired difference with its 95 % interval (see the module's docstring)."""
    m = len(differences)
    if not m:
        return None
    mean = math.fsum(differences) / m
    if m > BOOTSTRAP_PROMPTS:
        half = Z * statistics.pstdev(differences) / math.sqrt(m)
        interval = (mean - half, mean + half)
        method = f"normal approximation to the paired bootstrap over {m} prompts"
    else:
        interval = bootstrap_interval(differences, RESAMPLES, seed)
        method = f"paired bootstrap over {m} prompts, {RESAMPLES} resamples, percentile interval"
    return Paired(
        prompts=m,
        difference=mean,
        interval=interval,
        method=method,
        better=sum(d > 0 for d in differences),
        worse=sum(d < 0 for d in differences),
        same=sum(d == 0 for d in differences),
    )


def bootstrap_interval(values: Sequence[float], resamples: int, seed: int) -> tuple[float, float]:
    """The percentile interval of the mean of ``values`` resampled with replacement."""
    rng = random.Random(seed)
    m = len(values)
    population = list(values)
    means = sorted(math.fsum(rng.choices(population, k=m)) / m for _ in range(resamples))
    tail = (1 - CONFIDENCE) / 2
    return _quantile(means, tail), _quantile(means, 1 - tail)


def _quantile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile of sorted values, interpolated linearly between order statistics."""
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0-1) of unsorted values, None for no values."""
    return _quantile(sorted(values), q) if values else None
