"""How kiln's OpenMP threads wait between parallel kernels: set before libgomp starts.

One inference runs its kernels back to back, some parallel, some serial; between two
parallel ones the team's threads wait, and how they wait decides what a fork costs.
Measured with an empty 2-thread `omp parallel for` in a loop on the 2-vCPU AMD EPYC VM
shared with other sessions (load average ~12), median / p90 per fork and join:

- sleeping at once (OMP_WAIT_POLICY=PASSIVE, kiln's default): 8-11 us / 13-15 us;
- a short spin first (GOMP_SPINCOUNT=3000): 1-3 us when the machine lets both threads run,
  but 90-160 us / 2 ms in the same minutes, and GOMP_SPINCOUNT=10000 or 30000: 0.5-7 ms
  median: a spinning thread burns the time slice the thread it waits for needs. Spinning
  forever (ACTIVE) made resnet18 11x slower under load (909 ms vs 82 ms).

On the quiet machine spinning pays at batch 1 (GOMP_SPINCOUNT=20000, `python -m
benchmarks.corpus run --only mobilenet_v2,transformer_layer`, load ~1.3: mobilenet_v2 batch 1
7.89 -> 4.03 ms, transformer_layer batch 1 seq 64 1.165 -> 0.616 ms), but it was not kept as
the default (2026-11-26): unbound, the scheduler at times put the two spinning threads on one
core, and then each fork waited out the partner's spin (the corpus harness, quiet: mlp_tabular
batch 64 2 ms median against 0.02, tiny_cnn 1.05 ms against 0.05, p90/p10 up to 100, in some
processes and not others; GOMP_SPINCOUNT=2000 the same); bound (OMP_PROC_BIND=spread,
OMP_PLACES=cores) libgomp pins the calling thread, and every thread it creates later inherits
that one core (ONNX Runtime's pools made after kiln's first kernel ran 2.6x slower).

So kiln's OpenMP threads sleep between kernels unless the user says otherwise (either
variable set: kiln sets neither), and the compiler counts the wake-up: the Target records the
settings in force (`wait_settings`) and when forking pays follows from `fork_us`
(kiln.lower.nnutil.parallel_worth).

kiln's own pool (KILN_THREADS_IMPL=pool; kiln/codegen/c_src/kiln_pool.h, the loops outlined by
kiln.codegen.outline) gets the spinning figures without their costs: its workers spin only
while the model's entry runs (and at most KILN_POOL_SPIN_US, 100 us, without work), sleep on a
futex between inferences, change no thread's affinity, and a parallel loop's chunks are
claimed by the calling thread too, so the caller never waits for a worker to wake or be
scheduled: on a loaded machine it does the work alone instead of waiting. A worker that finds
itself descheduled while it spins (the machine is busy, or it shares the caller's core) stops
spinning for 10 ms, doubled up to 1 s while that recurs: on a loaded machine any spinning
costs several times its spin (mobilenet_v2 batch 1 at load 15: 40-55 ms with 5 ms pauses of
spinning, 7.3-8.0 ms with the doubling or no spin at all, OpenMP's sleeping team 7.6-13.9);
the caller waits at a join by a pause loop of at most 100 us, then sleeps.
Workers: the OpenMP thread count minus one. `python benchmarks/fork_cost.py` (an empty 2-chunk
loop; us per fork and join, median / p90 / p99, with 0, 50 and 500 us of serial work between):

- quiet (load 1.5): pool 0.6 / 0.6 / 1.0, 2.0 / 8.6 / 12, 11.7 / 13 / 20 (asleep after 100 us);
  PASSIVE OpenMP 31 / 33 / 59, 39 / 48 / 69, 56 / 83 / 127 (the VM wakes an idle vCPU slowly);
- loaded (load 14): pool 0.6 / 0.6 / 0.7, 5.7 / 5.9 / 7.4, 6.7 / 2500 / 18600; PASSIVE 8.1 /
  9.7 / 73, 9.6 / 10 / 80, 10.8 / 2300 / 14400.

It is not the default (IMPL_DEFAULT): in the corpus harness (benchmarks/corpus/README.md,
2026-11-26) it won at batch 1 on the quiet machine (mobilenet_v2 7.75 -> 4.38 ms) but lost
tiny_cnn (0.038 -> 0.067 ms), and at load 9-16 mobilenet_v2 batch 1 took 24-41 ms against the
sleeping team's 7.7 (whose threads the scheduler wakes with credit; the pool's caller never
sleeps when it does the work itself).

Hand-written kernels (Winograd, flash attention, the recurrent ones) still fork libgomp's
sleeping team under either setting.
"""

from __future__ import annotations

import os
from typing import Mapping

SPINCOUNT = ""   # GOMP_SPINCOUNT kiln sets ("": none; the threads sleep at once under PASSIVE)
# What a fork and join of two threads costs (us), spinning or sleeping between kernels. In a
# model a sleeping team costs more than the empty loop's 8-11 us: kws_dscnn's depthwise convs
# (batch 8) took 33 us forked against 19 us serial (load 12), so 20.
FORK_US_SPINNING = 2.0
FORK_US_SLEEPING = 20.0


IMPLS = ("omp", "pool")
IMPL_DEFAULT = "omp"
# What a fork and join costs with kiln's pool inside an inference (the caller never waits for a
# worker to start: 0.6-1 us median in fork_cost.py, quiet or loaded), with a margin
FORK_US_POOL = 2.0


def impl(env: Mapping[str, str] | None = None) -> str:
    """Which threads run the generated code's parallel loops: "omp" (OpenMP's team, libgomp)
    or "pool" (kiln's pool, kiln/codegen/c_src/kiln_pool.h): $KILN_THREADS_IMPL, else IMPL_DEFAULT."""
    env = os.environ if env is None else env
    value = env.get("KILN_THREADS_IMPL", "").strip().lower() or IMPL_DEFAULT
    if value not in IMPLS:
        from kiln.errors import KilnError
        raise KilnError(f"KILN_THREADS_IMPL={value!r}: choose one of {', '.join(IMPLS)}")
    return value


def wait_settings(env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(OMP_WAIT_POLICY, GOMP_SPINCOUNT) that native code loaded under `env` (default: this
    process's environment) runs with, kiln's defaults applied where the user set neither."""
    env = os.environ if env is None else env
    if "OMP_WAIT_POLICY" not in env and "GOMP_SPINCOUNT" not in env:
        return "PASSIVE", SPINCOUNT
    return env.get("OMP_WAIT_POLICY", "").upper(), env.get("GOMP_SPINCOUNT", "")


def with_defaults(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of `env` with kiln's wait settings added where the user set neither (for a
    child process that runs kernels: the tuner's measuring worker)."""
    out = dict(env)
    if "OMP_WAIT_POLICY" not in out and "GOMP_SPINCOUNT" not in out:
        policy, spin = wait_settings(out)
        out["OMP_WAIT_POLICY"] = policy
        if spin:
            out["GOMP_SPINCOUNT"] = spin
    return out


def apply_defaults() -> None:
    """Put kiln's wait settings in the environment unless the user chose theirs; must run
    before the first kernel library loads libgomp (which reads them once)."""
    os.environ.update(with_defaults(os.environ))


def spins(policy: str, spincount: str) -> bool:
    """Whether threads under these settings spin before sleeping (a fork inside an
    inference costs ~FORK_US_SPINNING, not a wake-up)."""
    if spincount:
        try:
            return int(spincount) > 0
        except ValueError:
            return True   # libgomp accepts "infinity" and suffixes (k, M, ...)
    return policy != "PASSIVE"


def fork_us(policy: str, spincount: str, threads_impl: str = "omp") -> float:
    """The cost of a fork and join under these settings, in microseconds."""
    if threads_impl == "pool":
        return FORK_US_POOL
    return FORK_US_SPINNING if spins(policy, spincount) else FORK_US_SLEEPING
