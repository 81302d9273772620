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
"""

from __future__ import annotations

import dataclasses
import hashlib
import subprocess
import tempfile
from pathlib import Path

from kiln.codegen.measured import build_loop, env_override, measure_and_store, store_dir, stored
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


def override() -> float | str | None:
    """KILN_STREAM_RATE: floats per us, "table", or None (unset: measure)."""
    return env_override("KILN_STREAM_RATE", "floats per microsecond one core streams")


def _key(target: Target) -> str:
    """What the measurement depends on: the machine (architecture, features, caches: the buffer's
    size) and the loop's source; not the threads' settings or the C compiler."""
    text = (f"{target.arch};{','.join(sorted(target.features))};{target.l1d_bytes},{target.l2_bytes},"
            f"{target.l3_bytes};{buffer_bytes(target)};{PASSES};{LOOP}")
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _path(target: Target) -> Path:
    return store_dir("stream-rate") / f"{_key(target)}.json"


def cached(target: Target) -> float | None:
    """The stored measurement for `target`'s machine, if there is one."""
    return stored(_path(target), "floats_per_us")


_MEASURED: dict[str, float] = {}   # this process's answers, by _key


def _measured(target: Target) -> float | None:
    key = _key(target)
    if key in _MEASURED:
        return _MEASURED[key]
    rate = cached(target)
    if rate is None:
        rate = measure_and_store(_path(target), "floats_per_us", lambda: measure(target),
                                 {"buffer_bytes": buffer_bytes(target), "passes": PASSES})
        if rate is None:
            return None       # no C compiler, or the loop failed: the table's figure stands
    _MEASURED[key] = rate
    return rate


def calibrated(target: Target) -> Target:
    """`target` with this machine's measured stream rate where it is the host (else as given):
    KILN_STREAM_RATE, else the cached measurement, else measured now and cached."""
    if target.name != "host" or target.stream_rate_measured:
        return target
    o = override()
    if o == "table":
        return target
    rate = o if o is not None else _measured(target)
    return target if rate is None else dataclasses.replace(target, stream_rate_measured=float(f"{rate:.3g}"))
