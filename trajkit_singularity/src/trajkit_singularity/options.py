"""The ``--sandbox_option singularity.KEY=VALUE`` settings, parsed and checked once per run.

Options arrive as strings from the command line. A typo or a bad value must stop the run before any
model call rather than surface as an engine error in the middle of it, so every key is known and every
value is validated here.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from trajkit.sandbox import SandboxError, positive_option

KNOWN = (
    "binary",
    "cache_dir",
    "tmp_dir",
    "scratch_dir",
    "network",
    "writable",
    "build_timeout",
    "start_timeout",
    "memory",
    "pids_limit",
)
WRITABLE = ("overlay", "tmpfs")
_NETWORK = re.compile(r"^[A-Za-z0-9_.-]+$")
_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([bkmg]?)b?\s*$", re.IGNORECASE)
_MEMORY_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
DEFAULT_MEMORY = 4 * 1024**3
DEFAULT_PIDS_LIMIT = 1024
OFF = "none"
# Apptainer's --bind splits on ',' and ':'; a path holding either cannot be bound safely.
_BIND_UNSAFE = re.compile(r"[,:]")


@dataclass(frozen=True)
class SingularityOptions:
    binary: str | None = None
    """Apptainer or Singularity executable (name or path); found on PATH when None."""
    cache_dir: Path = Path("~/.cache/trajkit/sif")
    """SIFs built from remote references, their locks and digests, Apptainer's layer cache."""
    tmp_dir: Path = Path("~/.cache/trajkit/sif/tmp")
    """Build scratch (APPTAINER_TMPDIR); under cache_dir by default so /tmp does not fill up."""
    scratch_dir: Path = Path("~/.cache/trajkit/sif/sandboxes")
    """One directory per sandbox (its working directory and state); under cache_dir by default."""
    network: str = "none"
    """``none`` (loopback only), ``host`` (share the host's), or a CNI network name."""
    writable: str = "overlay"
    """Where writes outside the working directory go: ``overlay``, a directory beside the sandbox's
    working directory on the host's disk; ``tmpfs``, memory (``--writable-tmpfs``)."""
    build_timeout: float = 1800.0
    """Seconds one conversion of a remote reference to a SIF may take."""
    start_timeout: float = 120.0
    """Seconds one ``instance start`` may take."""
    memory: int | None = DEFAULT_MEMORY
    """Bytes an instance may use (its cgroup's limit); None for no limit."""
    pids_limit: int | None = DEFAULT_PIDS_LIMIT
    """Processes an instance may hold at once; None for no limit."""
    limits_required: bool = False
    """True when the user set ``memory`` or ``pids_limit``: then an engine that cannot enforce them
    (no usable cgroups) fails the sandbox instead of running it without them."""

    @classmethod
    def parse(
        cls, options: Mapping[str, object], environ: Mapping[str, str] | None = None
    ) -> SingularityOptions:
        """Build options from ``KEY -> VALUE`` strings; raise ValueError naming the bad one."""
        environ = os.environ if environ is None else environ
        unknown = sorted(set(options) - set(KNOWN))
        if unknown:
            raise ValueError(f"unknown singularity option(s) {unknown}; known: {sorted(KNOWN)}")
        values = {key: str(value).strip() for key, value in options.items()}
        cache_dir = _path(values.get("cache_dir") or environ.get("TRAJKIT_SIF_CACHE") or str(cls.cache_dir))
        network = values.get("network", cls.network)
        if not _NETWORK.match(network):
            raise ValueError(f"singularity.network={network!r}: expected none, host or a CNI network name")
        writable = values.get("writable", cls.writable)
        if writable not in WRITABLE:
            raise ValueError(f"singularity.writable={writable!r}: expected one of {', '.join(WRITABLE)}")
        return cls(
            binary=values.get("binary") or None,
            cache_dir=cache_dir,
            tmp_dir=_path(values.get("tmp_dir") or str(cache_dir / "tmp")),
            scratch_dir=_path(values.get("scratch_dir") or str(cache_dir / "sandboxes")),
            network=network,
            writable=writable,
            build_timeout=positive_option(values, "singularity.build_timeout", float) or cls.build_timeout,
            start_timeout=positive_option(values, "singularity.start_timeout", float) or cls.start_timeout,
            memory=_memory(values.get("memory", str(DEFAULT_MEMORY))),
            pids_limit=_pids_limit(values),
            limits_required="memory" in values or "pids_limit" in values,
        )

    def resolve_binary(self) -> str:
        """Absolute path of the engine's executable; SandboxError says how to get one when missing."""
        candidates = [self.binary] if self.binary else ["apptainer", "singularity"]
        for candidate in candidates:
            found = shutil.which(candidate)
            if found:
                return found
        raise SandboxError(
            f"no Apptainer/Singularity executable found (looked for {', '.join(candidates)} on PATH); "
            "install Apptainer (on Debian 12: scripts/engines/apptainer.sh start) or set "
            "--sandbox_option singularity.binary=PATH"
        )


def _memory(value: str) -> int | None:
    if value.lower() == OFF:
        return None
    match = _MEMORY.match(value)
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"singularity.memory={value!r}: expected a size such as 512m or 2g, or none")
    return int(float(match.group(1)) * _MEMORY_UNITS[match.group(2).lower()])


def _pids_limit(values: Mapping[str, str]) -> int | None:
    if values.get("pids_limit", "").lower() == OFF:
        return None
    return positive_option(values, "singularity.pids_limit", int) or DEFAULT_PIDS_LIMIT


def _path(value: str) -> Path:
    path = Path(value).expanduser().absolute()
    if _BIND_UNSAFE.search(str(path)):
        raise ValueError(f"{path}: Apptainer cannot bind a path containing ',' or ':'")
    return path
