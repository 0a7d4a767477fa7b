"""The garbage collector's CPU in every Python process started with this directory on PYTHONPATH.

    TRAJKIT_BENCH_GC_DIR=/tmp/gc PYTHONPATH=$PWD/bench/gc_time python -m bench.scaling --inflight 1000 --modes file

The path must be absolute: the benchmark starts its children in the temporary directory. Each
process (the benchmark, the load server, the runner, its workers) writes one line to a file of its
own in TRAJKIT_BENCH_GC_DIR when it exits: its command, the CPU seconds its collections took by
generation, how many there were, and its CPU in all.
"""

import atexit
import gc
import os
import sys
import time

_OUT = os.environ.get("TRAJKIT_BENCH_GC_DIR")
_started = [0.0]
_seconds = [0.0, 0.0, 0.0]
_counts = [0, 0, 0]


def _timed(phase: str, info: dict) -> None:
    if phase == "start":
        _started[0] = time.process_time()
        return
    generation = info["generation"]
    _seconds[generation] += time.process_time() - _started[0]
    _counts[generation] += 1


def _report() -> None:
    assert _OUT is not None
    command = " ".join(sys.argv)[-100:]
    with open(os.path.join(_OUT, str(os.getpid())), "w") as handle:
        handle.write(
            f"{command}: collector {sum(_seconds):.3f} s of {time.process_time():.2f} s CPU; "
            f"by generation {[round(s, 3) for s in _seconds]} s in {_counts} collections\n"
        )


if _OUT:
    os.makedirs(_OUT, exist_ok=True)
    gc.callbacks.append(_timed)
    atexit.register(_report)
