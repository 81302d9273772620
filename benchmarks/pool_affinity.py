"""Where kiln's pool runs a model's loops with the calling thread on each CPU in turn.

    python -m benchmarks.pool_affinity tiny_cnn batch=8 [--runs 1500] [--rounds 2]

kiln's pool (kiln/codegen/c_src/kiln_pool.h) pins its workers and never the caller, so the
scheduler may put the caller on a worker's CPU. Each round pins the calling thread to each CPU
of its mask in turn (os.sched_setaffinity) and runs the model --runs times: per CPU, the median
and p90 microseconds, the share of the parallel loops run alone while contended and of the
forked loops whose chunks the caller ran all (no worker came: "solo"), the contention signs by
kind, and the workers moved off the caller's CPU (kiln.runtime.threads.pool_counts). The counts
are meaningful at any load; the times on a quiet machine only. Before the pool moved a worker
off the caller's CPU, the caller on the worker's CPU ran 99% of tiny_cnn batch 8's loops alone.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("KILN_TIER", "full")   # time the -O3 build, never a quick tier (kiln.codegen.tiers)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("case", help="as `python -m benchmarks.corpus list` prints it: batch=8")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=1500)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))   # read when kiln's first library loads

    import kiln
    from benchmarks.corpus.build import one_case
    from kiln.runtime.threads import pool_counts

    path, _, feeds = one_case(args.model, args.case)
    m = kiln.compile(path)
    m.run(feeds)
    lib = m.program.runner_for([np.asarray(x) for x in m.ordered(feeds)]).lib
    if pool_counts(lib) is None:
        raise SystemExit("this kiln module has no pool of its own (KILN_THREADS_IMPL=omp?)")
    full = os.sched_getaffinity(0)
    print(f"{args.model} [{args.case}], {args.threads} threads, {args.runs} runs per CPU and round")
    print(f"  {'caller on':<9} {'median':>7} {'p90':>7} {'alone':>6} {'solo':>6}  spin/wake/join/stall  moved  load")
    try:
        for _ in range(args.rounds):
            for cpu in sorted(full):
                os.sched_setaffinity(0, {cpu})
                time.sleep(0.05)
                c0, ts = pool_counts(lib), []
                for _ in range(args.runs):
                    t = time.perf_counter()
                    m.run(feeds)
                    ts.append(time.perf_counter() - t)
                c1 = pool_counts(lib)
                d = {k: c1[k] - c0[k] for k in c1}
                loops = d["forks"] + d["alone"]
                signs = "/".join(str(d[k]) for k in ("by_spin", "by_wake", "by_join", "by_stall"))
                print(f"  CPU {cpu:<5} {np.median(ts) * 1e6:7.0f} {np.percentile(ts, 90) * 1e6:7.0f} "
                      f"{d['alone'] / max(loops, 1):6.2f} {d['solo'] / max(d['forks'], 1):6.2f}  {signs:>19}  "
                      f"{d['moved']:5d}  {os.getloadavg()[0]:4.1f}", flush=True)
    finally:
        os.sched_setaffinity(0, full)


if __name__ == "__main__":
    main()
