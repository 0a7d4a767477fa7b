"""One backoff policy for the project, on tenacity.

A model request retried by the client, a failed session retried by the runner and the probes of
an endpoint that cannot be reached all wait the same way: exponential from a base delay (doubling
with each attempt, capped), with "equal jitter" (between half and all of the step), so a crowd of
sessions that failed together does not come back together, yet none comes back at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import tenacity

REQUEST_BACKOFF = (0.5, 30.0)
"""Base and cap, in seconds, between the retries of one model request."""
SESSION_BACKOFF_CAP = 300.0
"""Cap between the attempts of one session (its base is ``--retry_backoff``)."""


def backoff(base: float, cap: float) -> tenacity.wait.wait_base:
    """The policy as a tenacity wait strategy: attempt 1 waits ``base/2 .. base``, then doubles."""
    import tenacity  # at the first wait: a run whose requests succeed never needs it

    half, half_cap = base / 2, cap / 2
    fixed = tenacity.wait_exponential(multiplier=half, max=half_cap)
    jitter = tenacity.wait_random_exponential(multiplier=half, max=half_cap)
    return cast(tenacity.wait.wait_base, fixed + jitter)


def backoff_delay(attempt: int, base: float, cap: float = SESSION_BACKOFF_CAP) -> float:
    """Seconds to wait after the ``attempt``-th failure (counting from 1), outside a tenacity loop."""
    import tenacity

    state = tenacity.RetryCallState(cast(Any, None), None, (), {})
    state.attempt_number = attempt
    return float(backoff(base, cap)(state))
