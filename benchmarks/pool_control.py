"""A control for kiln's pool: trivially parallel C loops on the pool (kiln_pool.h), at 1 and 2
threads in one process, each chunk timed by its thread's CPU clock (KILN_POOL_TIMES=2), so a
thread's work at 2 threads can be set against the same work at 1:

- fma: a chunk is register-only FMAs (16 accumulators): the cores' clock, nothing shared;
- l2: a chunk sums its own 512 KiB buffer, that its thread wrote in the loop before (local);
- remote: the same, but the buffer the other thread wrote (its lines in the other core's L2);
- dram: a chunk sums its slice of a 256 MiB buffer (the memory stream);
- evicted (_remote): the buffer written, then 8 MiB more by each thread (it left the writer's L2);
- demoted (_remote): the buffer written with CLDEMOTE after each line (pushed towards L3).

    python benchmarks/pool_control.py [--reps 200]

Per kind, the median CPU time of a chunk (us), by thread count; at 2 threads, by the thread that
ran it (a chunk counted only where each thread ran one of the loop's two).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HARNESS = r"""
typedef float ctl_v __attribute__((vector_size(64)));
typedef struct { float* buf; int64_t per; int32_t kind, swap; double sink; int64_t ns[2]; int32_t who[2]; } ctl_t;
static void ctl_chunk(void* c_, int64_t lo, int64_t hi) {
  ctl_t* c = (ctl_t*)c_;
  for (int64_t i = lo; i < hi; ++i) {
    const int64_t t0 = kiln_pool_cpu_now();
    if (c->kind == 0) {   /* fma */
      ctl_v a[16], x = {0}; for (int k = 0; k < 16; ++k) a[k] = x + (float)k * 1e-7f;
      const ctl_v m = x + 0.999999f, b = x + 1e-7f;
      for (int64_t r = 0; r < c->per; ++r) {
        for (int k = 0; k < 16; ++k) a[k] = a[k] * m + b;
        __asm__ volatile("" : "+v"(a[0]), "+v"(a[1]), "+v"(a[2]), "+v"(a[3]));
      }
      float s = 0; for (int k = 0; k < 16; ++k) s += a[k][0];
      c->sink += s;
    } else if (c->kind == 1 || c->kind == 6) {   /* write buffer i (6: and demote its lines to L3) */
      float* p = c->buf + i * c->per;
      for (int64_t j = 0; j < c->per; j += 16) {
        *(ctl_v*)(p + j) = (ctl_v){0} + (float)(i + j);
#if defined(__CLDEMOTE__)
        if (c->kind == 6) __builtin_ia32_cldemote(p + j);
#endif
      }
    } else if (c->kind == 5) {   /* write 8 MiB of its own far away: buffer i leaves this core's L2 */
      float* p = c->buf + (16 + 2 * i) * (1 << 20);
      for (int64_t j = 0; j < (2 << 20); j += 16) *(ctl_v*)(p + j) = (ctl_v){0} + (float)j;
    } else {   /* sum buffer i (or i ^ 1) */
      const float* p = c->buf + (i ^ c->swap) * c->per;
      ctl_v s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
      for (int64_t j = 0; j < c->per; j += 64) {
        s0 += *(const ctl_v*)(p + j); s1 += *(const ctl_v*)(p + j + 16);
        s2 += *(const ctl_v*)(p + j + 32); s3 += *(const ctl_v*)(p + j + 48);
      }
      s0 += s1 + s2 + s3; c->sink += s0[0];
    }
    c->ns[i] = kiln_pool_cpu_now() - t0; c->who[i] = kiln_pool_me;
  }
}
/* `reps` times: a loop of 2 chunks of `kind` (2: after a loop that writes the two buffers; 3:
   sums with no write before); each chunk's CPU ns and thread (0 caller, 1 worker; -1 where the
   buffers were not written chunk 0 by the caller and 1 by the worker) into ns[2 reps], who[2 reps] */
int32_t ctl_run(float* buf, int64_t per, int32_t kind, int32_t swap, int32_t reps, int64_t* ns, int32_t* who) {
  ctl_t c = { buf, per, kind == 0 ? 0 : 2, swap, 0, {0, 0}, {0, 0} };
  kiln_pool_enter();
  for (int32_t r = 0; r < reps; ++r) {
    int32_t wrote = 1;   /* buffer k written by the thread that reads it in the loop after (swap 0) */
    if (kind == 2 || kind == 5 || kind == 6) {
      ctl_t w = c; w.kind = kind == 6 ? 6 : 1;
      kiln_pool_for(ctl_chunk, &w, 0, 2);
      wrote = w.who[0] == 0 && w.who[1] == 1;
    }
    if (kind == 5) { ctl_t w = c; w.kind = 5; kiln_pool_for(ctl_chunk, &w, 0, 2); }
    kiln_pool_for(ctl_chunk, &c, 0, 2);
    for (int t = 0; t < 2; ++t) { ns[2 * r + t] = c.ns[t]; who[2 * r + t] = wrote ? c.who[t] : -1; }
  }
  kiln_pool_leave();
  return 0;
}
int32_t ctl_threads(int32_t threads) {
  kiln_pool_stop();
#ifdef _OPENMP
  omp_set_num_threads(threads);
#endif
  return 0;
}
"""


# kind: (chunk kind in ctl_run, swap: read the other chunk's buffer, floats a chunk)
KINDS = {"fma": (0, 0, 20000), "l2": (2, 0, 128 << 10), "remote": (2, 1, 128 << 10), "dram": (3, 0, 32 << 20),
         "evicted": (5, 0, 128 << 10), "evicted_remote": (5, 1, 128 << 10), "demoted": (6, 0, 128 << 10),
         "demoted_remote": (6, 1, 128 << 10)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--threads", default="1,2,1,2", help="thread counts in turn")
    ap.add_argument("--kinds", default="fma,l2,remote,evicted,evicted_remote,demoted,demoted_remote")
    args = ap.parse_args(argv)
    saved = os.environ.get("KILN_POOL_CALM_MS")
    os.environ["KILN_POOL_CALM_MS"] = "0"   # (never contended: both threads run their chunk)
    try:
        run(args)
    finally:
        if saved is None:
            del os.environ["KILN_POOL_CALM_MS"]
        else:
            os.environ["KILN_POOL_CALM_MS"] = saved


def run(args) -> None:
    from kiln.codegen.build import compile_c
    from kiln.codegen.c import PRELUDE
    from kiln.codegen.csource import c_source
    from kiln.targets.target import Target
    lib = ctypes.CDLL(str(compile_c(PRELUDE + "\n" + c_source("kiln_pool.h") + HARNESS, Target.host())))
    lib.ctl_run.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
                            ctypes.c_void_p, ctypes.c_void_p]
    kinds = {k: v for k, v in KINDS.items() if k in args.kinds.split(",")}
    floats = 64 << 20 if "dram" in kinds else 24 << 20 if any("evicted" in k for k in kinds) else 2 << 20
    big = np.ones(floats + 16, np.float32)
    big = big[(-big.ctypes.data % 64) // 4:]   # (64-byte aligned: the chunks use aligned vectors)
    print("median CPU us a chunk (1 thread: both chunks on the caller; 2: chunk 0 on the caller, 1 on the worker)")
    for threads in (int(x) for x in args.threads.split(",")):
        lib.ctl_threads(threads)
        line = []
        for name, (kind, swap, per) in kinds.items():
            ns = np.zeros(2 * args.reps, np.int64)
            who = np.zeros(2 * args.reps, np.int32)
            lib.ctl_run(big.ctypes.data, per, kind, swap, args.reps if kind != 3 else 5, ns.ctypes.data,
                        who.ctypes.data)
            ns, who = ns.reshape(-1, 2), who.reshape(-1, 2)
            if threads == 1:
                line.append(f"{name} {np.median(ns) / 1e3:.1f}")
                continue
            apart = (who[:, 0] == 0) & (who[:, 1] == 1)   # chunk 0 on the caller, 1 on the worker
            med = [f"{np.median(ns[apart, t]) / 1e3:.1f}" if apart.any() else "-" for t in (0, 1)]
            line.append(f"{name} caller {med[0]} worker {med[1]} ({apart.sum()} of {len(apart)})")
        print(f"{threads} thr: " + "; ".join(line) + f"; load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
