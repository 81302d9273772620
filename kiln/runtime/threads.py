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

kiln's own pool (KILN_THREADS_IMPL=pool; kiln/codegen/c_src/kiln_pool.h, the generated loops
outlined by kiln.codegen.outline, the hand-written kernels' loops run by kiln_par_for,
kiln/codegen/c_src/kiln_par.h) gets the spinning figures without their costs:
- a parallel loop's chunks are claimed by the calling thread too, so the caller never waits for
  a worker to wake or be scheduled;
- an idle worker spins at most KILN_POOL_SPIN_US (100 us) after its last chunk, inside an
  inference or between two, then sleeps on a futex (the model's entry wakes it); workers: the
  OpenMP thread count minus one, pinned where they fill the mask, never to the CPU the caller
  runs on: the caller looks at its CPU at each entry and fork and moves a worker it finds there
  to the CPU it left (with the caller on the worker's CPU, the worker had read its turns as
  contention and 88% of tiny_cnn batch 8's loops ran on the caller alone);
- contended (a spinning worker found itself descheduled for 200 us, a woken one ran 1 ms after
  its wake-up, or the caller's wait at a join was descheduled: a busy machine, or another
  runtime's spinning threads on the cores), the calling thread runs every loop alone for 10 ms
  and the workers sleep; a worker that saw such a sign claims no chunk of the loop open then.
  On a busy machine a worker the scheduler keeps waiting holds the chunks it claimed, and each
  such wait costs the caller a time slice at the join: that was the 3-5x loss in the corpus
  harness at load 9-16 (mobilenet_v2 batch 1 24-41 ms against the sleeping team's 7.7, when the
  contended pool still handed chunks to workers it woke at each loop). That, a stall (a worker
  off its core 1 ms while it held chunks), doubles the calm up to 1 s while it recurs; the other
  signs give 10 ms each, so a peer's spin (ONNX Runtime's threads spin 2^20 pauses, 30-50 ms of
  CPU on the Sapphire Rapids VM, after each run) costs the pool its worker for as long, not for
  the second the doubling on every sign reached. kiln.runtime.threads.pool_counts reads a
  library's counts, benchmarks/pool_contention.py times kiln by what ran before it;
- the caller waits at a join by a pause loop of at most 100 us (10 us contended), then sleeps;
- the few hand-written kernels that still fork OpenMP's team themselves (CumSum/CumProd, the
  ONNX RNN/LSTM/GRU kernel, linear attention, the tree ensembles, linear and SVM classifiers;
  TopK, DFT and Resize run on kiln_par_for since 2026-11-26) park the pool around their call (kiln_pool_park: its workers sleep meanwhile), so two teams
  never spin for the cores; KILN_POOL_STATS=1 prints at unload the forks, the contentions, the
  workers' naps inside an inference (asleep after a serial stretch over the spin) and the loops
  whose chunks the caller ran all; KILN_POOL_TIMES=1|2 counts each thread's time in chunks (wall
  or its CPU clock) and the caller's at joins (kiln_pool_times, `benchmarks/pool_probe.py`), and
  KILN_POOL_SERIAL=1 runs every chunk on the caller in turn (what cutting a loop costs alone);
- a kernel that plans its split by the threads (kiln_par_threads: the recurrent kernel's batch
  rows) is told 1 while the pool is contended, where its loops run on the caller alone.

Where two threads lose (2026-11-27, Sapphire Rapids VM, quiet, `python benchmarks/pool_probe.py
resnet50 batch=1 [--kernels N | --handoff N]`, `benchmarks/pool_control.py`): ResNet-50 batch 1's
chunks took 60.6 ms of the threads' CPU at 2 threads against 50.6 at one, the threads' own work
and not waits. Not page faults (none a run), TLB shootdowns (under one a run, machine-wide), the
workers' naps (4 a run; none with KILN_POOL_SPIN_US=1000, no faster), cutting the loops
(KILN_POOL_SERIAL=1: 49.1-52.9 ms against 50.0-50.3), nor the FMA clock (60 us a chunk at 1 and
2 threads): the data the kernel before wrote on the other core. A 512 KiB buffer the other core
wrote reads in 27-32 us, against 5.1 from one's own L2 and 23.5 from L3 or memory; the kernels
called in turn from two threads pinned to the two CPUs, one thread each, took 64.5 ms against
51.2 on one. Chunks claimed by their place in an image's rows (each thread the same rows in every
loop) changed nothing measurable (28-38 ms both ways, the spread between processes): most of the
time is in convs cut by channel groups, where each thread reads all of the input anyway.
`python benchmarks/fork_cost.py` (an empty 2-chunk loop; us per fork and join, median / p90 /
p99, with 0, 50 and 500 us of serial work between):

- quiet (load 1.5): pool 0.6 / 0.6 / 1.0, 2.0 / 8.6 / 12, 11.7 / 13 / 20 (asleep after 100 us);
  PASSIVE OpenMP 31 / 33 / 59, 39 / 48 / 69, 56 / 83 / 127 (the VM wakes an idle vCPU slowly);
- loaded (load 14): pool 0.6 / 0.6 / 0.7, 5.7 / 5.9 / 7.4, 6.7 / 2500 / 18600; PASSIVE 8.1 /
  9.7 / 73, 9.6 / 10 / 80, 10.8 / 2300 / 14400.

The default (IMPL_DEFAULT) since 2026-11-26: in the corpus harness, quiet (05:55 and 06:35,
load 0.7-5, `python -m benchmarks.corpus run --only tiny_cnn,mobilenet_v2,transformer_layer,
lstm_stacked,kws_dscnn,mobilenet_v3_small,mlp_tabular[,gru_stacked,audio_tcn,distilbert,
efficientnet_b0] --budget 0.5`, pool and omp alternating in separate processes, 7 processes
in all), the geomean of kiln / best peer over those 29 rows was 0.94 with the pool against
1.02 with OpenMP's sleeping team: mobilenet_v2 batch 1 4.6 ms against 7.4, efficientnet_b0
batch 1 7.1 against 9.3, gru_stacked seq 128 batch 1 3.3 against 4.6, audio_tcn batch 1 3.7
against 5.4, transformer_layer 4 x 64 3.8 against 4.4, tiny_cnn batch 1 0.044 against 0.041
(its regression, 0.038 -> 0.067 before, was Winograd forking libgomp's sleeping team by the
pool's 2 us fork cost); worse by more than 10%: lstm_stacked seq 512 batch 1, 14.5 against
12.5 (its recurrent team was still OpenMP's then; now on the pool, kiln.lower.recurrent). kiln's p90/p10 no wider than the wider peer's on
66 of 92 rows against 43 of 63. Loaded (load 13, a plain loop): transformer_layer 1 x 64 1.14
ms median on the pool, 3.6 on the sleeping team.
"""

from __future__ import annotations

import ctypes
import itertools
import os
from collections.abc import Mapping, Sequence

SPINCOUNT = ""   # GOMP_SPINCOUNT kiln sets ("": none; the threads sleep at once under PASSIVE)
# What a fork and join of two threads costs (us), spinning or sleeping between kernels. In a
# model a sleeping team costs more than the empty loop's 8-11 us: kws_dscnn's depthwise convs
# (batch 8) took 33 us forked against 19 us serial (load 12), so 20.
FORK_US_SPINNING = 2.0
FORK_US_SLEEPING = 20.0


IMPLS = ("omp", "pool")
IMPL_DEFAULT = "pool"   # KILN_THREADS_IMPL=omp: OpenMP's sleeping team instead
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


# kiln_pool.h's KILN_POOL_CHUNKS: the chunks per thread a parallel loop is cut into at most
POOL_CHUNKS = 4


def pool_chunks(n: int, threads: int) -> list[tuple[int, int]]:
    """The chunks [lo, hi) kiln's pool cuts a loop of `n` iterations into on `threads` threads
    (kiln_pool_for: POOL_CHUNKS per thread at most; kiln_pool_chunk: the longer ones first)."""
    m = max(1, min(n, POOL_CHUNKS * max(threads, 1)))
    starts = [n // m * k + min(k, n % m) for k in range(m + 1)]
    return list(itertools.pairwise(starts))


def pool_span(costs: Sequence[float], threads: int) -> float:
    """When a loop whose chunks cost `costs` (in the loop's order) ends on `threads` threads
    that start together, each claiming the next chunk as it comes free (kiln_pool_run)."""
    free = [0.0] * max(threads, 1)
    for c in costs:
        k = free.index(min(free))
        free[k] += c
    return max(free)


# kiln_pool_counts's order (kiln_pool.h): loops forked, loops run alone while contended, contended
# by a descheduled spin / a late wake-up / a descheduled join / a stalled join, workers asleep
# inside an inference, loops that woke them, loops whose chunks the caller ran all; 1 while
# contended; workers moved off the caller's CPU, workers' signs dropped as the caller's turn on
# their CPU (kiln_pool_settle)
POOL_COUNTS = ("forks", "alone", "by_spin", "by_wake", "by_join", "by_stall", "naps", "loop_wakes", "solo", "calm",
               "moved", "shared")


def pool_counts(lib) -> dict | None:
    """The counts of a loaded kiln library's thread pool (a ctypes.CDLL: NativeModule.lib), as
    KILN_POOL_STATS=1 prints them at unload; None for a library without kiln's pool (OpenMP's)."""
    fn = getattr(lib, "kiln_pool_counts", None)
    if fn is None:
        return None
    out = (ctypes.c_uint64 * len(POOL_COUNTS))()
    fn.restype = ctypes.c_int32
    fn(out, ctypes.c_int32(len(POOL_COUNTS)))
    return dict(zip(POOL_COUNTS, (int(v) for v in out)))
