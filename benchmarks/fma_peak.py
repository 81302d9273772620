"""The FMA peak of one core, measured: a C loop of independent vector FMAs (as many chains as
the FMA latency times the FMA units needs, all in registers), compiled for this machine with
the vector width kiln's target uses, timed by thread CPU time. The peak a kernel's GFLOP/s is
held against (issue 13: 1x1 convs at 75% of it), measured rather than derived from a clock
that a VM does not report truly.

    python benchmarks/fma_peak.py           # prints GFLOP/s of one thread (float32)
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SOURCE = r"""
#include <stdint.h>
typedef float V __attribute__((vector_size(LANES * 4)));
float fma_loop(int64_t iters, float a) {
  V acc[CHAINS];
  for (int i = 0; i < CHAINS; ++i) acc[i] = (V){0} + (float)i;
  const V m = (V){0} + a, c = (V){0} + 1e-7f;
  for (int64_t k = 0; k < iters; ++k) {
    #pragma GCC unroll 32
    for (int i = 0; i < CHAINS; ++i) acc[i] = acc[i] * m + c;
  }
  V s = (V){0};
  for (int i = 0; i < CHAINS; ++i) s += acc[i];
  float t = 0;
  for (int i = 0; i < LANES; ++i) t += s[i];
  return t;
}
"""
CHAINS = 16         # independent accumulators: covers 2 FMA units x 4-5 cycles of latency


def peak_gflops(lanes: int | None = None, seconds: float = 0.3) -> float:
    """float32 GFLOP/s of one thread running FMAs of `lanes` lanes (default: kiln's target's)."""
    if lanes is None:
        from kiln.targets.target import Target  # noqa: PLC0415
        lanes = Target.host().vector_lanes(4)
    with tempfile.TemporaryDirectory() as d:
        src, lib = os.path.join(d, "fma.c"), os.path.join(d, "fma.so")
        with open(src, "w") as f:
            f.write(SOURCE)
        subprocess.run(["cc", "-O2", "-march=native", "-shared", "-fPIC", f"-DLANES={lanes}", f"-DCHAINS={CHAINS}",
                        src, "-o", lib], check=True)
        fn = ctypes.CDLL(lib).fma_loop
        fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_int64, ctypes.c_float]
        iters, best = 1 << 16, 0.0
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            t = time.thread_time()
            fn(iters, 0.999)
            dt = time.thread_time() - t
            if dt > 1e-3:
                best = max(best, 2 * lanes * CHAINS * iters / dt / 1e9)
            else:
                iters *= 2
        return best


if __name__ == "__main__":
    print(f"{peak_gflops():.1f} GFLOP/s float32, one thread (measured)")
