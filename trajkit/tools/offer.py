"""Which toolsets a run offers: a distribution drawn over the toolsets it can offer here, or the
fixed set ``--toolsets`` names.

A toolset a distribution names may be one this run cannot offer:

- no installed plugin registers it (another package's, such as ``browser``): left out of the draw;
- it is ``optional`` and its :meth:`~trajkit.tools.Toolset.problem` gives a reason (an endpoint
  not configured): left out of the draw;
- it is not optional and has a problem (``web`` without a search provider): the run stops before
  it writes anything, saying what to set;
- ``--disabled_toolsets`` names it: left out.

The draw is then exact over what is left (the conditional "at least one" distribution), and a
distribution left with nothing is refused. ``--toolsets`` offers exactly the toolsets it names to
every prompt; each must be installed and able to run.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trajkit.tools.distributions import Distribution

if TYPE_CHECKING:
    from trajkit.config.run_config import RunConfig
    from trajkit.manager import PluginHost

FROM_CONFIG = "from the configuration file"


class OfferError(ValueError):
    """The run cannot offer what it is asked to; the message says what to set, install or choose."""


@dataclass(frozen=True)
class Missing:
    """Why a toolset cannot be offered in this run."""

    reason: str
    stops: bool = False
    """Not optional: a run that may draw it cannot start until this is set."""


DISABLED = Missing("named by --disabled_toolsets")


@dataclass(frozen=True)
class Offer:
    """What a run offers its prompts."""

    distribution: Distribution
    """What each prompt's toolsets are drawn from: over the toolsets the run can offer (every one
    at probability 1 for ``--toolsets``)."""
    requested: Distribution
    """The distribution as named (or the ``--toolsets`` given), before anything was left out."""
    left_out: dict[str, Missing] = field(default_factory=dict)
    """Toolsets of the requested distribution that are not drawn, and why."""
    fixed: bool = False
    """``--toolsets``: no draw, every prompt gets them all."""

    def notice(self) -> str | None:
        """What a run says once about the toolsets it leaves out, or None."""
        if not self.left_out:
            return None
        reasons = "; ".join(f"{name} ({missing.reason})" for name, missing in sorted(self.left_out.items()))
        shares = ", ".join(f"{name} {p:.0%}" for name, p in self.distribution.marginals().items())
        return f"distribution {self.requested.name!r}: leaving out {reasons}; offering {shares} of prompts"

    def record(self) -> dict[str, Any]:
        """The offer as a run directory keeps it."""
        return {
            "distribution": None if self.fixed else self.requested.name,
            "probabilities": dict(self.distribution.probabilities),
            "left_out": {name: missing.reason for name, missing in sorted(self.left_out.items())},
        }


def distributions(config: RunConfig, host: PluginHost) -> dict[str, Distribution]:
    """Every distribution a run may name: the plugins' and those of the configuration file."""
    found = dict(host.distributions)
    for name, probabilities in config.distributions.items():
        if name in found:
            raise OfferError(
                f"distribution {name!r} of the configuration file is also registered by a plugin"
            )
        unknown = sorted(set(probabilities) - set(host.toolsets))
        if unknown:
            raise OfferError(
                f"distribution {name!r} of the configuration file: "
                + "; ".join(_unknown_toolset(toolset, host) for toolset in unknown)
            )
        try:
            found[name] = Distribution(name, FROM_CONFIG, probabilities)
        except ValueError as exc:
            raise OfferError(f"{exc} (in the configuration file)") from None
    return found


def default_name(found: dict[str, Distribution]) -> str:
    """The distribution a run draws when none is named: the one a plugin marks as default."""
    marked = sorted(name for name, distribution in found.items() if distribution.default)
    if len(marked) == 1:
        return marked[0]
    if not marked:
        raise OfferError("no installed plugin marks a distribution as the default: pass --distribution NAME")
    raise OfferError(
        f"distributions {', '.join(marked)} are each marked as the default: pass --distribution NAME"
    )


def missing(names: Iterable[str], config: RunConfig, host: PluginHost) -> dict[str, Missing]:
    """Why each of ``names`` that cannot be offered with ``config`` cannot (the others are absent)."""
    registered = host.toolsets
    found: dict[str, Missing] = {}
    for name in names:
        toolset = registered.get(name)
        if toolset is None:
            hint = host.package_hints.get(name)
            found[name] = Missing(
                f"not installed (pip install {hint})" if hint else "no installed plugin provides it"
            )
            continue
        problem = toolset.problem(config.settings_of(toolset))
        if problem:
            found[name] = Missing(problem, stops=not toolset.optional)
    return found


def resolve(config: RunConfig, host: PluginHost) -> Offer:
    """What the run with ``config`` offers; :class:`OfferError` when it cannot offer anything, or
    when a toolset it may draw cannot run until something is set."""
    found = distributions(config, host)
    _check_disabled(config, host, found)
    if config.toolsets:
        if config.distribution is not None:
            raise OfferError(
                f"--toolsets offers {', '.join(config.toolsets)} to every prompt and --distribution "
                f"{config.distribution} draws toolsets per prompt: pass one of them"
            )
        return _fixed(config, host)
    name = config.distribution or default_name(found)
    if name not in found:
        close = difflib.get_close_matches(name, found, n=1)
        raise OfferError(
            f"unknown distribution {name!r}" + (f" (did you mean {close[0]}?)" if close else "")
            + f"; available: {', '.join(sorted(found))} (trajkit distributions lists them)"
        )  # fmt: skip
    requested = found[name]
    drawn = requested.drawn()
    left_out = {t: DISABLED for t in drawn if t in config.disabled_toolsets}
    left_out.update(missing((t for t in drawn if t not in left_out), config, host))
    stopping = sorted(t for t, m in left_out.items() if m.stops)
    if stopping:
        raise OfferError(
            "; ".join(
                f"distribution {name!r} draws {t} for {requested.probabilities[t]:.0%} of prompts, and "
                f"{t} cannot run: {left_out[t].reason}"
                for t in stopping
            )
            + f" (or leave it out with --disabled_toolsets {','.join(stopping)}, or choose another "
            "distribution: trajkit distributions)"
        )
    kept = [t for t in drawn if t not in left_out]
    if not kept:
        reasons = "; ".join(f"{t}: {m.reason}" for t, m in sorted(left_out.items()))
        raise OfferError(f"distribution {name!r} can offer none of its toolsets here ({reasons})")
    return Offer(requested.restricted(kept), requested, left_out)


def _fixed(config: RunConfig, host: PluginHost) -> Offer:
    names = list(dict.fromkeys(config.toolsets))
    problems = [
        _unknown_toolset(name, host)
        if name not in host.toolsets
        else f"toolset {name!r} cannot run: {m.reason}"
        for name, m in missing(names, config, host).items()
    ]
    if problems:
        raise OfferError("cannot offer the toolsets asked for: " + "; ".join(problems))
    kept = [name for name in names if name not in config.disabled_toolsets]
    if not kept:
        raise OfferError("--disabled_toolsets leaves none of --toolsets")
    given = Distribution("toolsets", "the toolsets given", dict.fromkeys(names, 1.0))
    left_out = {name: DISABLED for name in names if name not in kept}
    return Offer(given.restricted(kept), given, left_out, fixed=True)


def _check_disabled(config: RunConfig, host: PluginHost, found: dict[str, Distribution]) -> None:
    """A name in ``--disabled_toolsets`` that no plugin and no distribution knows is a typo."""
    known = set(host.toolsets) | {t for d in found.values() for t in d.probabilities}
    unknown = [name for name in config.disabled_toolsets if name not in known]
    if unknown:
        raise OfferError(
            "--disabled_toolsets: " + ", ".join(_unknown_toolset(name, host) for name in unknown)
        )


def _unknown_toolset(name: str, host: PluginHost) -> str:
    installed = sorted(host.toolsets)
    close = difflib.get_close_matches(name, installed, n=1)
    hint = host.package_hints.get(name)
    return f"no installed plugin provides toolset {name!r}" + (
        f" (pip install {hint})"
        if hint
        else f" (did you mean {close[0]}?)"
        if close
        else f" (installed: {', '.join(installed)})"
    )


def listing(config: RunConfig, host: PluginHost) -> list[dict[str, Any]]:
    """Every distribution a run may name, with its toolsets and what is missing here and why."""
    found = distributions(config, host)
    try:
        default: str | None = default_name(found)
    except OfferError:
        default = None
    everything = {t for d in found.values() for t in d.drawn()}
    absent = missing(sorted(everything), config, host)
    entries = []
    for name, distribution in sorted(found.items()):
        gone = {t: absent[t] for t in distribution.drawn() if t in absent}
        entries.append(
            {
                "name": name,
                "description": distribution.description,
                "default": name == default,
                "probabilities": dict(distribution.probabilities),
                "missing": {t: m.reason for t, m in gone.items()},
                "stops": sorted(t for t, m in gone.items() if m.stops),
                "offered_here": _offered_here(distribution, gone),
            }
        )
    return entries


def _offered_here(distribution: Distribution, gone: dict[str, Missing]) -> dict[str, float]:
    """Toolset -> the share of prompts offered it here, once ``gone`` is left out."""
    kept = [t for t in distribution.drawn() if t not in gone]
    return (
        distribution.restricted(kept).marginals() if kept and not any(m.stops for m in gone.values()) else {}
    )


def markdown_table(host: PluginHost) -> str:
    """The installed plugins' distributions as a Markdown table (the README's is made so)."""
    from trajkit.config.run_config import RunConfig

    lines = ["| distribution | toolsets (% of prompts offered each) | |", "|---|---|---|"]
    for entry in listing(RunConfig(), host):
        name = f"`{entry['name']}`" + (" (default)" if entry["default"] else "")
        shares = ", ".join(f"{t} {p:.0%}" for t, p in entry["probabilities"].items())
        lines.append(f"| {name} | {shares} | {entry['description']} |")
    return "\n".join(lines) + "\n"
