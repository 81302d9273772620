"""Microbenchmark: kiln's GEMM (kiln/lower/gemm.py) vs numpy (OpenBLAS) sgemm.

    python benchmarks/gemm.py [--runs 30] [--shapes 1024x1024x1024,64x784x2048] [--layout nn,nt]
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python benchmarks/gemm.py --clock thread

Shapes are MxKxN; layout "nn" multiplies A[M,K] by B[K,N] (MatMul), "nt" by B
given as [N,K] (Gemm transB=1, how nn.Linear weights arrive). Each round runs
kiln then numpy on the same arrays (interleaved, so load drift hits both alike);
reported: median and best GFLOP/s over the rounds, and the ratio of medians.
Both use every core (OpenMP / OpenBLAS threads). The machine may be shared: look
at the medians of several invocations before believing a number. On a busy
machine, `--clock thread` with one thread each (line above) times the calling
thread's CPU time, which time-slicing by other processes does not inflate.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kiln.codegen import build_c  # noqa: E402
from kiln.dtypes import DType  # noqa: E402
from kiln.loops import LoopModule, Schedule, lower, placeholder  # noqa: E402
from kiln.lower.gemm import gemm  # noqa: E402
from kiln.targets.target import Target  # noqa: E402

SHAPES = "256x256x256,512x512x512,1024x1024x1024,64x784x2048,64x2048x2048,64x2048x10"


def kernel(M: int, K: int, N: int, trans_b: bool):
    a = placeholder((M, K), DType.float32, "a")
    b = placeholder((N, K) if trans_b else (K, N), DType.float32, "b")
    g = gemm(a, b, trans_b=trans_b, target=Target.host())
    sch = Schedule(g.out)
    g.schedule(sch)
    t = time.perf_counter()
    lib = build_c(LoopModule([lower(sch, [a, b, g.out], "gemm")]))
    return lib["gemm"], g, time.perf_counter() - t


def bench(M: int, K: int, N: int, trans_b: bool, runs: int, clock=time.perf_counter) -> str:
    run, g, build_s = kernel(M, K, N, trans_b)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((M, K), dtype=np.float32)
    b = rng.standard_normal((N, K) if trans_b else (K, N), dtype=np.float32)
    bt = b.T if trans_b else b
    c, ref = np.empty((M, N), np.float32), np.empty((M, N), np.float32)
    run(a, b, c)
    np.matmul(a, bt, out=ref)
    err = float(np.abs(c - ref).max() / max(1.0, np.abs(ref).max()))
    tk, tn = [], []
    for _ in range(3):   # warm-up
        run(a, b, c)
        np.matmul(a, bt, out=ref)
    for _ in range(runs):
        t = clock()
        run(a, b, c)
        tk.append(clock() - t)
        t = clock()
        np.matmul(a, bt, out=ref)
        tn.append(clock() - t)
    gf = 2 * M * N * K / 1e9
    mk, mn = float(np.median(tk)), float(np.median(tn))
    knobs = " ".join([f"mr={g.mr} nr={g.nr}"] + [w for w, on in [("swapped", g.swapped), ("panel", g.panel),
                                                                   ("root-packed", g.packed is not None and not g.panel),
                                                                   ("dot", g.dot)] if on])
    return (f"{M}x{K}x{N} {'nt' if trans_b else 'nn'}  kiln {gf / mk:6.1f} (best {gf / min(tk):6.1f})  "
            f"numpy {gf / mn:6.1f} (best {gf / min(tn):6.1f}) GFLOP/s  kiln/numpy time {mk / mn:4.2f}  "
            f"[{mk * 1e3:.3f} ms; {knobs}; build {build_s:.2f} s; err {err:.1e}]")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--shapes", default=SHAPES, help="comma-separated MxKxN")
    p.add_argument("--layout", default="nn,nt", help="nn (B is [K,N]) and/or nt (B is [N,K])")
    p.add_argument("--clock", choices=["wall", "thread"], default="wall",
                   help="thread: CPU time of the calling thread (run single-threaded)")
    args = p.parse_args(argv)
    clock = time.perf_counter if args.clock == "wall" else time.thread_time
    for shape in args.shapes.split(","):
        M, K, N = map(int, shape.lower().split("x"))
        for layout in args.layout.split(","):
            print(bench(M, K, N, layout == "nt", args.runs, clock), flush=True)


if __name__ == "__main__":
    main()
