"""What a fork and join of the parallel loops costs on this machine: measured once, cached.

Whether a kernel pays for its threads (kiln.lower.nnutil.parallel_worth) weighs the time its
threads save against `Target.fork_us`. The cost depends on the machine and its hypervisor
more than on anything kiln knows of it: an empty 2-thread region of OpenMP's sleeping team
took 8-11 us on one 2-vCPU EPYC VM under load and 31-39 us on the same VM when quiet (an idle
vCPU wakes slowly); a table measured on one machine misjudges another. So the compiler
measures it here, on the host, for the threads implementation and wait settings the code
will run under: a loop of near-empty two-chunk regions with GAP_US of serial work between
them (the kernels between two parallel ones), built with kiln's C compiler and run in a
child process; the median microseconds per fork and join. The result is kept per machine and
settings (`store_dir("fork-cost")`: ~/.cache/kiln/fork-cost/<key>.json; delete it to measure again), so
each machine measures once.

A machine busier than it has cores does not measure (its threads wait for the CPU, not for
each other): the Target keeps the table's figure (kiln.runtime.threads) and the next compile
tries again. KILN_FORK_US overrides: a number of microseconds, or "table" for the table's
figure (the test suite pins it so: generated code must not depend on the load at the time).
`python benchmarks/fork_cost.py` prints the same loop's percentiles for every setting.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

from kiln.codegen.measured import build_loop, busy, env_override, measure_and_store, store_dir, stored
from kiln.runtime import threads
from kiln.targets.target import Target

GAP_US = 50        # serial work between two regions, as between two parallel kernels of a model
REGIONS = 300      # regions timed per measurement (~25 ms on a quiet machine)

# An `omp parallel for` region of two chunks, `gap` us of spinning between regions; prints the
# p10 / median / p90 / p99 microseconds per region.
OMP_MAIN = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec * 1e-3; }
static int cmp(const void* a, const void* b) { double x = *(const double*)a, y = *(const double*)b; return (x > y) - (x < y); }
static float buf[2][4096];
int main(int argc, char** argv) {
  int gap = atoi(argv[1]), n = atoi(argv[2]);
  double* ts = malloc(sizeof(double) * n);
  for (int r = 0; r < n; ++r) {
    double t0 = now();
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < 2; ++i) for (int j = 0; j < 4096; ++j) buf[i][j] += 1.0f;
    ts[r] = now() - t0;
    double t1 = now();
    while (now() - t1 < gap) {}
  }
  qsort(ts, n, sizeof(double), cmp);
  printf("%.2f %.2f %.2f %.2f\n", ts[n / 10], ts[n / 2], ts[9 * n / 10], ts[99 * n / 100]);
  return buf[0][0] < 0;
}
"""

# the same loop on kiln's pool (kiln/codegen/c_src/kiln_pool.h), all regions inside one inference
POOL_MAIN = r"""
#include <stdio.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec * 1e-3; }
static int cmp(const void* a, const void* b) { double x = *(const double*)a, y = *(const double*)b; return (x > y) - (x < y); }
static float buf[2][4096];
static void body(void* c, int64_t lo, int64_t hi) { for (int64_t i = lo; i < hi; ++i) for (int j = 0; j < 4096; ++j) buf[i][j] += 1.0f; }
int main(int argc, char** argv) {
  int gap = atoi(argv[1]), n = atoi(argv[2]);
  double* ts = malloc(sizeof(double) * n);
  kiln_pool_for(body, 0, 0, 2);   /* workers made */
  kiln_pool_enter();
  for (int r = 0; r < n; ++r) {
    double t0 = now();
    kiln_pool_for(body, 0, 0, 2);
    ts[r] = now() - t0;
    double t1 = now();
    while (now() - t1 < gap) {}
  }
  kiln_pool_leave();
  qsort(ts, n, sizeof(double), cmp);
  printf("%.2f %.2f %.2f %.2f\n", ts[n / 10], ts[n / 2], ts[9 * n / 10], ts[99 * n / 100]);
  return buf[0][0] < 0;
}
"""


def program_source(threads_impl: str) -> str:
    """The C text of the timing loop for "omp" or kiln's "pool"."""
    if threads_impl == "pool":
        from kiln.codegen.c import PRELUDE  # noqa: PLC0415
        from kiln.codegen.csource import c_source  # noqa: PLC0415
        return PRELUDE + c_source("kiln_pool.h") + POOL_MAIN
    return OMP_MAIN


def build(threads_impl: str, directory: str, cc: list[str] | None = None) -> str:
    """Compile the timing loop into `directory`; returns the executable's path."""
    return build_loop(directory, f"fork_{threads_impl}", program_source(threads_impl),
                      ["-fopenmp", "-pthread", "-lm"], f"fork-cost ({threads_impl})", cc)


def run(exe: str, gap_us: int, regions: int, env: dict) -> list[float]:
    """p10, median, p90, p99 microseconds per fork and join of the built loop run under `env`."""
    out = subprocess.run([exe, str(gap_us), str(regions)], capture_output=True, text=True, check=True,
                         env=env, timeout=60).stdout.split()
    return [float(v) for v in out]


def settings_env(target: Target) -> dict:
    """The environment the target's code runs under: its thread count, and the wait settings
    this process's libraries load with (the host target's, kiln.runtime.threads)."""
    env = threads.with_defaults(os.environ)
    env["OMP_NUM_THREADS"] = str(target.cores)
    return env


def measure(target: Target, regions: int = REGIONS, gap_us: int = GAP_US) -> float:
    """Median microseconds per fork and join on this machine under `target`'s settings."""
    with tempfile.TemporaryDirectory(prefix="kiln-fork-") as tmp:
        return run(build(target.threads_impl, tmp), gap_us, regions, settings_env(target))[1]


def _key(target: Target) -> str:
    """What the measurement depends on: the machine, the threads' settings (the target's key
    without a measured cost) and the timed loop's source (kiln's pool header with it: a changed
    pool is measured again); not the C compiler (a warm compile runs none)."""
    text = f"{target.key()};gap={GAP_US};{program_source(target.threads_impl)}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _path(target: Target) -> Path:
    return store_dir("fork-cost") / f"{_key(target)}.json"


def cached(target: Target) -> float | None:
    """The stored measurement for `target`'s machine and settings, if there is one."""
    return stored(_path(target), "fork_us")


def override() -> float | str | None:
    """KILN_FORK_US: microseconds, "table", or None (unset: measure)."""
    return env_override("KILN_FORK_US", "microseconds per fork and join")


def host_fork_us(target: Target) -> float | None:
    """This machine's fork cost under `target`'s settings (KILN_FORK_US, else the cached
    measurement, else measured now and cached); None where the table's figure stands: a CPU
    other than the host or other wait settings than this process's, KILN_FORK_US=table, a busy
    machine, or a loop that did not build."""
    if target.name != "host" or (target.omp_wait_policy, target.omp_spincount) != threads.wait_settings():
        return None   # another CPU, or settings this process's threads do not run under
    o = override()
    if o is not None:
        return None if o == "table" else o
    return _measured(dataclasses.replace(target, fork_us_measured=0.0))


_MEASURED: dict[Target, float] = {}   # this process's answers (a busy machine's None is asked again)


def _measured(target: Target) -> float | None:
    if target in _MEASURED:
        return _MEASURED[target]
    us = cached(target)
    if us is None and busy(target.cores):
        return None
    if us is not None:
        _MEASURED[target] = us
        return us
    us = measure_and_store(_path(target), "fork_us", lambda: measure(target), {
        "threads": target.threads_impl, "wait": [target.omp_wait_policy, target.omp_spincount],
        "cores": target.cores, "gap_us": GAP_US, "regions": REGIONS})
    if us is None:
        return None       # no C compiler or pool to time: the table's figure stands
    _MEASURED[target] = us
    return us


def calibrated(target: Target) -> Target:
    """`target` with this machine's measured fork cost, and its stream rate
    (kiln.codegen.stream_cost), where it is the host (else as given)."""
    from kiln.codegen import stream_cost  # noqa: PLC0415
    if target.name != "host" or target.fork_us_measured:
        return stream_cost.calibrated(target)
    us = host_fork_us(target)
    return stream_cost.calibrated(target if us is None else dataclasses.replace(target, fork_us_measured=round(us, 1)))
