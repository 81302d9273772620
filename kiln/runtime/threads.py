"""How kiln's OpenMP threads wait between parallel kernels: set before libgomp starts.

One inference runs its kernels back to back, some parallel, some serial; between two
parallel ones the team's threads wait, and how they wait decides what a fork costs.

kiln's default is a bounded spin, then sleep: OMP_WAIT_POLICY=PASSIVE with
GOMP_SPINCOUNT=20000 (libgomp counts ~100000 spins per ms, so ~0.2 ms; libgomp's own default
spins 300000, ONNX Runtime's and OpenVINO's pools spin too). The gaps between the kernels of
one inference are microseconds, so the team is still spinning when the next fork comes:
a fork costs 1-3 us instead of a wake-up. Measured side by side with ONNX Runtime on the
quiet 2-core AMD EPYC (Zen 4) machine, kiln ms with threads sleeping at once (PASSIVE, the
old default) -> spinning 20000 (`python -m benchmarks.corpus run --only mobilenet_v2,
transformer_layer` with GOMP_SPINCOUNT set, load ~1.3): mobilenet_v2 batch 1 7.89 -> 4.03
(ORT 4.96), transformer_layer batch 1 seq 64 1.165 -> 0.616 (ORT 0.706), batch 4 4.82 -> 2.51.

The cost is on an oversubscribed machine: a spinning thread burns the time slice the
thread it waits for needs. At load 12 on the 2 cores (`python benchmarks/symbolic_batch.py
--only transformer_layer,mobilenet_v2`, interleaved runs of both settings): transformer_layer
1.2-3.9 ms sleeping against 41-49 ms spinning, mobilenet_v2 8-48 ms against 160-330 ms;
`python benchmarks/fork_cost.py` at load 12: GOMP_SPINCOUNT 3000 153 us median per fork
against 8 us sleeping at once. So kiln spins only where the machine has room for its threads:
the load average of the last minute under 1.5 per core this process may use, read once when
the first kernel library loads (`spin_has_room`); else it sleeps at once (GOMP_SPINCOUNT=0)
and compiles for sleeping threads (forks less). Spinning threads are bound one per core
(OMP_PROC_BIND=spread, OMP_PLACES=cores, as OpenVINO pins its threads): two spinning threads
the scheduler put on one core cost a scheduler tick per fork. Either wait variable set by
the user: kiln sets none of these. The Target records the settings in force (`wait_settings`) and when forking pays
follows from `fork_us` (kiln.lower.nnutil.parallel_worth).
"""

from __future__ import annotations

import functools
import os
from typing import Mapping

SPINCOUNT = "20000"   # GOMP_SPINCOUNT kiln sets with PASSIVE: spin ~0.2 ms, then sleep (see above)
# What a fork and join of two threads costs (us), spinning or sleeping between kernels. In a
# model a sleeping team costs more than the empty loop's 8-11 us: kws_dscnn's depthwise convs
# (batch 8) took 33 us forked against 19 us serial (load 12), so 20.
FORK_US_SPINNING = 2.0
FORK_US_SLEEPING = 20.0


LOAD_PER_CORE_TO_SPIN = 1.5   # spin below this 1-minute load average per usable core


def spin_has_room(load1: float, cores: int) -> bool:
    """Whether spinning threads would find cores free: the machine's recent load (kiln's own
    process counts in it: ~1-2 while it runs) under LOAD_PER_CORE_TO_SPIN per core."""
    return load1 < LOAD_PER_CORE_TO_SPIN * max(cores, 1)


@functools.lru_cache(maxsize=1)
def _this_machine_has_room() -> bool:
    """spin_has_room for this machine now, asked once per process (libgomp reads its settings
    once too)."""
    try:
        return spin_has_room(os.getloadavg()[0], len(os.sched_getaffinity(0)))
    except (OSError, AttributeError):   # no load average (not Linux): assume the cores are ours
        return True


def wait_settings(env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(OMP_WAIT_POLICY, GOMP_SPINCOUNT) that native code loaded under `env` runs with, kiln's
    defaults applied where the user set neither. `env` None: this process, whose default
    depends on the machine's load (`spin_has_room`); a given `env` (a named Target's, made for
    another machine): the default of a machine with room (SPINCOUNT)."""
    here = env is None
    env = os.environ if env is None else env
    if "OMP_WAIT_POLICY" not in env and "GOMP_SPINCOUNT" not in env:
        return "PASSIVE", SPINCOUNT if not here or _this_machine_has_room() else "0"
    return env.get("OMP_WAIT_POLICY", "").upper(), env.get("GOMP_SPINCOUNT", "")


def apply_defaults() -> None:
    """Put kiln's wait settings in the environment unless the user chose theirs; must run
    before the first kernel library loads libgomp (which reads them once)."""
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        policy, spin = wait_settings()
        os.environ["OMP_WAIT_POLICY"] = policy
        os.environ["GOMP_SPINCOUNT"] = spin
        if spins(policy, spin) and "OMP_PROC_BIND" not in os.environ and "OMP_PLACES" not in os.environ:
            # spinning threads must not share a core: unbound, the scheduler at times woke the
            # worker on the master's core, and each fork then waited out a scheduler tick
            # (mlp_tabular batch 64 in the corpus harness: median 0.02 ms or, in some
            # processes, 2 ms, p90/p10 100x; bound one per core: p90/p10 1.7 in every run)
            os.environ["OMP_PROC_BIND"] = "spread"
            os.environ["OMP_PLACES"] = "cores"


def spins(policy: str, spincount: str) -> bool:
    """Whether threads under these settings spin before sleeping (a fork inside an
    inference costs ~FORK_US_SPINNING, not a wake-up)."""
    if spincount:
        try:
            return int(spincount) > 0
        except ValueError:
            return True   # libgomp accepts "infinity" and suffixes (k, M, ...)
    return policy != "PASSIVE"


def fork_us(policy: str, spincount: str) -> float:
    """The cost of a fork and join under these settings, in microseconds."""
    return FORK_US_SPINNING if spins(policy, spincount) else FORK_US_SLEEPING
