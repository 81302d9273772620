"""How fast one core reads data streamed from beyond its caches on this machine: measured once,
cached.

Weights a kernel reads once per inference (a model's do not stay in L2 between runs) arrive at
the rate one core can pull them from L3 or memory, whatever its FMAs could do: the squeeze-excite
block's 1x1 conv on one pixel (kiln.lower.nnutil.parallel_worth's `streamed`) and Winograd's
transformed weights, four times the direct conv's (kiln.lower.conv_algo.winograd_streams), are
bound by it. That rate is the machine's and its hypervisor's, not the CPU name's: the table's
7e3 floats per us (`Target.stream_rate`'s default) was read off an AVX-512 EPYC, where this
Sapphire Rapids VM streams 2.9e3-3.0e3 from a buffer past its L3 share and 5.6e3-6.0e3 from one
within it (4-64 MB), one thread, thread CPU time. So the compiler measures it here, on the host:
a loop of vector loads summing a buffer of `buffer_bytes` (twice L3, at least 8 x L2, at most
BUFFER_CAP: ResNet-50's 144 MB of packed weights do not stay in this VM's L3 either), built with
kiln's C compiler for the target's -march and run in a child process; the median floats per us
of PASSES passes, timed by the thread's CPU clock (a busy machine's waits for the CPU do not
count). The result is kept per machine (kiln.codegen.measured.store_dir: ~/.cache/kiln/stream-rate/<key>.json;
delete it to measure again), so each machine measures once. KILN_STREAM_RATE overrides: floats
per us, or "table" for the table's figure (the test suite pins it so: generated code must not
depend on the machine's memory at the time).

A parallel kernel's cores stream their shares at once, and cores that share one stream read
together less than each alone: the same loop runs on every core at once (ALL_LOOP), each over
its own share of the buffer, and the sum of their rates is `Target.stream_rate_all`
(stored as all-<key>.json beside; KILN_STREAM_RATE_ALL overrides, and where only KILN_STREAM_RATE
is set each core streams that rate). Measured on this Sapphire Rapids VM, 2 cores, load 2-3:
2.3e3-2.9e3 floats per us each with both at once against 2.5e3-2.9e3 alone (5.0e3-5.3e3
together), so its cores do not share one stream past L3 (within it, 4 MB each: 5.4e3-6.4e3 each
against 6.4e3 alone).
"""

from __future__ import annotations

import dataclasses
import hashlib
import subprocess
import tempfile
from pathlib import Path

from kiln.codegen.measured import build_loop, busy, env_override, measure_and_store, store_dir, stored
from kiln.targets.target import Target

PASSES = 9                    # passes over the buffer timed (the median taken)
BUFFER_CAP = 128 << 20        # the buffer's bytes at most (measured: 96-192 MB all read ~3e3 here)

# Sums `floats` floats (a multiple of 64) in 4 vector accumulators; prints the p10 / median / p90
# floats per us of `passes` passes, by the thread's CPU clock
LOOP = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
typedef float V __attribute__((vector_size(64)));
static double now(void) { struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec * 1e6 + t.tv_nsec * 1e-3; }
static int cmp(const void* a, const void* b) { double x = *(const double*)a, y = *(const double*)b; return (x > y) - (x < y); }
int main(int argc, char** argv) {
  long n = atol(argv[1]); int passes = atoi(argv[2]);
  float* a = aligned_alloc(64, (size_t)n * sizeof(float));
  double* rate = malloc(sizeof(double) * passes);
  if (!a || !rate || n % 64 || passes < 1) return 2;
  for (long i = 0; i < n; ++i) a[i] = (float)(i & 7);
  V s = {0};
  for (int p = 0; p < passes; ++p) {
    V a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, x0, x1, x2, x3;
    double t0 = now();
    for (long i = 0; i < n; i += 64) {
      memcpy(&x0, a + i, 64); memcpy(&x1, a + i + 16, 64); memcpy(&x2, a + i + 32, 64); memcpy(&x3, a + i + 48, 64);
      a0 += x0; a1 += x1; a2 += x2; a3 += x3;
    }
    double t = now() - t0;
    rate[p] = n / (t > 1e-3 ? t : 1e-3);
    s += a0 + a1 + a2 + a3;
  }
  qsort(rate, passes, sizeof(double), cmp);
  printf("%.1f %.1f %.1f\n", rate[passes / 10], rate[passes / 2], rate[9 * passes / 10]);
  return s[0] < 0;
}
"""


# The same sum on `threads` threads at once, each over a buffer of its own, the passes started
# together (a barrier): per pass the threads' floats per us summed (each by its CPU clock), kept
# where every thread ran throughout the pass (wall within CONCURRENT of its CPU time: a thread
# the scheduler kept off its core did not stream beside the others); prints the median summed
# rate of the passes kept (of all passes where none was) and how many were kept
CONCURRENT = 1.15
ALL_LOOP = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
typedef float V __attribute__((vector_size(64)));
static double clk(clockid_t c) { struct timespec t; clock_gettime(c, &t); return t.tv_sec * 1e6 + t.tv_nsec * 1e-3; }
static int cmp(const void* a, const void* b) { double x = *(const double*)a, y = *(const double*)b; return (x > y) - (x < y); }
static long n; static int passes, threads; static double *rate, *ratio; static pthread_barrier_t bar;
static void* run(void* arg) {
  long t = (long)arg;
  float* a = aligned_alloc(64, (size_t)n * sizeof(float));
  if (a) for (long i = 0; i < n; ++i) a[i] = (float)(i & 7);
  V s = {0};
  for (int p = 0; p < passes; ++p) {
    V a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, x0, x1, x2, x3;
    pthread_barrier_wait(&bar);
    double c0 = clk(CLOCK_THREAD_CPUTIME_ID), w0 = clk(CLOCK_MONOTONIC);
    for (long i = 0; a && i < n; i += 64) {
      memcpy(&x0, a + i, 64); memcpy(&x1, a + i + 16, 64); memcpy(&x2, a + i + 32, 64); memcpy(&x3, a + i + 48, 64);
      a0 += x0; a1 += x1; a2 += x2; a3 += x3;
    }
    double c = clk(CLOCK_THREAD_CPUTIME_ID) - c0, w = clk(CLOCK_MONOTONIC) - w0;
    rate[p * threads + t] = a ? n / (c > 1e-3 ? c : 1e-3) : -1.0;
    ratio[p * threads + t] = w / (c > 1e-3 ? c : 1e-3);
    s += a0 + a1 + a2 + a3;
  }
  free(a);
  return s[0] < 0 ? arg : NULL;
}
int main(int argc, char** argv) {
  n = atol(argv[1]); passes = atoi(argv[2]); threads = atoi(argv[3]);
  double limit = atof(argv[4]);
  if (n % 64 || passes < 1 || threads < 1) return 2;
  rate = malloc(sizeof(double) * passes * threads); ratio = malloc(sizeof(double) * passes * threads);
  double* sum = malloc(sizeof(double) * passes);
  pthread_t* th = malloc(sizeof(pthread_t) * threads);
  if (!rate || !ratio || !sum || !th || pthread_barrier_init(&bar, NULL, threads)) return 2;
  for (long t = 1; t < threads; ++t) if (pthread_create(&th[t], NULL, run, (void*)t)) return 2;
  run((void*)0);
  for (long t = 1; t < threads; ++t) pthread_join(th[t], NULL);
  int kept = 0, all = 0;
  for (int p = 0; p < passes; ++p) {
    double r = 0; int ok = 1;
    for (int t = 0; t < threads; ++t) { if (rate[p * threads + t] <= 0) return 2; r += rate[p * threads + t]; ok &= ratio[p * threads + t] <= limit; }
    if (ok) sum[kept++] = r;
    else sum[passes - 1 - all++] = r;
  }
  if (kept) qsort(sum, kept, sizeof(double), cmp); else qsort(sum, passes, sizeof(double), cmp);
  printf("%.1f %d\n", kept ? sum[kept / 2] : sum[passes / 2], kept);
  return 0;
}
"""


def buffer_bytes(target: Target) -> int:
    """The buffer the loop streams: twice L3 (past what the caches keep), at least 8 x L2, at
    most BUFFER_CAP, whole 256-byte steps of the loop."""
    b = min(max(2 * target.l3_bytes, 8 * target.l2_bytes), BUFFER_CAP)
    return b // 256 * 256


def build(directory: str, target: Target, cc: list[str] | None = None) -> str:
    """Compile the timing loop for `target` into `directory`; returns the executable's path."""
    return build_loop(directory, "stream", LOOP, target.arch_flags(), "stream-rate", cc)


def run(exe: str, floats: int, passes: int) -> list[float]:
    """p10, median, p90 floats per us of the built loop over `floats` floats."""
    out = subprocess.run([exe, str(floats), str(passes)], capture_output=True, text=True, check=True,
                         timeout=120).stdout.split()
    return [float(v) for v in out]


def measure(target: Target, passes: int = PASSES, nbytes: int | None = None) -> float:
    """Median floats per us one core of this machine reads streaming `nbytes` (buffer_bytes)."""
    with tempfile.TemporaryDirectory(prefix="kiln-stream-") as tmp:
        return run(build(tmp, target), (nbytes or buffer_bytes(target)) // 4, passes)[1]


def thread_bytes(target: Target) -> int:
    """Each thread's buffer in the all-cores measurement: its share of buffer_bytes (together
    past what the caches keep), at least 4 x L2, whole 256-byte steps."""
    return max(buffer_bytes(target) // max(1, target.cores), 4 * target.l2_bytes) // 256 * 256


def measure_all(target: Target, passes: int = PASSES, nbytes: int | None = None) -> tuple[float, int]:
    """(floats per us the target's cores read together, each streaming `nbytes` (thread_bytes)
    of its own at once: the median of the passes where all ran throughout, passes kept)."""
    threads = max(1, target.cores)
    with tempfile.TemporaryDirectory(prefix="kiln-stream-") as tmp:
        exe = build_loop(tmp, "stream_all", ALL_LOOP, [*target.arch_flags(), "-pthread"], "all-cores stream-rate")
        out = subprocess.run([exe, str((nbytes or thread_bytes(target)) // 4), str(passes), str(threads),
                              str(CONCURRENT)], capture_output=True, text=True, check=True, timeout=120).stdout.split()
    return float(out[0]), int(out[1])


def override(all_cores: bool = False) -> float | str | None:
    """KILN_STREAM_RATE (KILN_STREAM_RATE_ALL: `all_cores`): floats per us, "table", or None
    (unset: measure)."""
    if all_cores:
        return env_override("KILN_STREAM_RATE_ALL", "floats per microsecond all the cores stream together")
    return env_override("KILN_STREAM_RATE", "floats per microsecond one core streams")


def _key(target: Target, all_cores: bool = False) -> str:
    """What the measurement depends on: the machine (architecture, features, caches: the buffer's
    size; the cores, measured together) and the loop's source; not the threads' settings or the C
    compiler."""
    text = (f"{target.arch};{','.join(sorted(target.features))};{target.l1d_bytes},{target.l2_bytes},"
            f"{target.l3_bytes};{buffer_bytes(target)};{PASSES};"
            + (f"{target.cores};{thread_bytes(target)};{CONCURRENT};{ALL_LOOP}" if all_cores else LOOP))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _path(target: Target, all_cores: bool = False) -> Path:
    return store_dir("stream-rate") / f"{'all-' if all_cores else ''}{_key(target, all_cores)}.json"


FIELDS = ("floats_per_us", "all_cores_floats_per_us")    # the stored number: one core's, all the cores'


def cached(target: Target, all_cores: bool = False) -> float | None:
    """The stored measurement for `target`'s machine, if there is one."""
    return stored(_path(target, all_cores), FIELDS[all_cores])


_MEASURED: dict[str, float | None] = {}   # this process's answers, by _key (None: not measured)


def _measure_all(target: Target, record: dict) -> float:
    """measure_all's rate, recorded with how it was taken; a ValueError (nothing stored: this
    process keeps each core at its own rate, the next measures again) where no pass ran on all
    the cores at once (the sum of rates taken one after another). Not tried at all on a machine
    busier than it has cores (kiln.codegen.measured.busy), as the fork cost is not."""
    rate, kept = measure_all(target)
    if not kept:
        raise ValueError("no pass of the all-cores stream loop ran on every core at once")
    record.update(threads=max(1, target.cores), thread_bytes=thread_bytes(target), concurrent_passes=kept)
    return rate


def _measured(target: Target, all_cores: bool = False) -> float | None:
    key = _key(target, all_cores)
    if key in _MEASURED:
        return _MEASURED[key]
    rate = cached(target, all_cores)
    if rate is None and all_cores and busy(target.cores):
        return None           # the cores would not run at once: asked again at the next compile
    if rate is None:
        record = {"buffer_bytes": buffer_bytes(target), "passes": PASSES}
        how = (lambda: _measure_all(target, record)) if all_cores else (lambda: measure(target))
        rate = measure_and_store(_path(target, all_cores), FIELDS[all_cores], how, record)
        # None: no C compiler, the loop failed, or a busy machine: the table's figure (each core
        # at its own rate) stands, in this process
    _MEASURED[key] = rate
    return rate


def _rate(all_cores: bool, target: Target) -> float | None:
    """The override, else the cached or new measurement (None: the table's figure)."""
    o = override(all_cores)
    if o == "table":
        return None
    return o if o is not None else _measured(target, all_cores)


def calibrated(target: Target) -> Target:
    """`target` with this machine's measured stream rates where it is the host (else as given):
    one core's (KILN_STREAM_RATE, else the cached measurement, else measured now and cached) and
    all the cores' at once (KILN_STREAM_RATE_ALL, else likewise; none where only KILN_STREAM_RATE
    is set: each core then streams that, `Target.stream_rate_all`)."""
    if target.name != "host" or target.stream_rate_measured:
        return target
    one = _rate(False, target)
    every = _rate(True, target) if override(True) is not None or override() is None else None
    if one is None and every is None:
        return target
    return dataclasses.replace(target, stream_rate_measured=float(f"{one:.3g}") if one else 0.0,
                               stream_rate_all_measured=float(f"{every:.3g}") if every else 0.0)
