"""Each kernel's speedup from one thread to several: a corpus model's kernels called one by one
(`CompiledModel.profile`, wall clock), in a child process per thread count (a library's pool
takes its threads when it loads), the counts alternating over --rounds children each; per
kernel the fastest of all its runs. Listed by the time a kernel loses against an even split
(t_N - t_1 / N), kernels under --below times faster marked, with the calling thread's CPU
time over the wall time at N threads beside ("caller": 1.0 where it worked or spun throughout;
less where it slept at a join, waiting for a thread more than the pool's spin, or was
descheduled).

    python benchmarks/thread_scaling.py resnet50 --dims batch=1 [--threads 2] [--runs 10] [--rounds 2]

Wall-clock speedups mean something on a quiet machine only: on a loaded one the other
thread waits for a core, and every kernel looks as if it scaled badly.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def child(model: str, dims: dict, runs: int, out: str) -> None:
    """One process's per-kernel minimum seconds, wall and calling-thread CPU, into `out` (JSON)."""
    import time

    import numpy as np

    import kiln
    from benchmarks.kernel_profile import corpus_path, feeds_for
    path = corpus_path(model)
    feeds = feeds_for(path, dims)
    m = kiln.compile(path)
    m.run(feeds)
    got = {}
    for name, clock in (("wall", time.perf_counter), ("cpu", time.thread_time)):
        saved, time.perf_counter = time.perf_counter, clock   # the profile reads this clock
        try:
            values = [np.asarray(x) for x in m.ordered(feeds)]
            runner = m.program.runner_for(values)
            _, t = runner.profile(values, runner.info["call_args"], runs)
        finally:
            time.perf_counter = saved
        got[name] = [float(np.min(x)) for x in t]
    got["what"] = list(runner.call_nodes)
    with open(out, "w") as f:
        json.dump(got, f)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--dims", default="batch=1", help="symbolic dims: name=size,...")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2, help="child processes per thread count")
    ap.add_argument("--below", type=float, default=1.8, help="mark kernels scaling less than this")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--child", nargs=2, metavar=("THREADS", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    dims = dict(kv.split("=") for kv in args.dims.split(",") if kv)
    if args.child:
        child(args.model, dims, args.runs, args.child[1])
        return
    best: dict[int, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for n in (1, args.threads) if r % 2 == 0 else (args.threads, 1):
                out = os.path.join(tmp, f"{n}-{r}.json")
                env = dict(os.environ, OMP_NUM_THREADS=str(n))
                subprocess.run([sys.executable, os.path.abspath(__file__), args.model, "--dims", args.dims,
                                "--runs", str(args.runs), "--child", str(n), out], env=env, check=True)
                with open(out) as f:
                    got = json.load(f)
                if n not in best:
                    best[n] = got
                else:
                    for key in ("wall", "cpu"):
                        best[n][key] = [min(a, b) for a, b in zip(best[n][key], got[key])]
    one, many, n = best[1], best[args.threads], args.threads
    t1, tn = sum(one["wall"]), sum(many["wall"])
    print(f"{args.model} [{args.dims}]: kernels one by one, fastest of {args.rounds} x {args.runs} runs, "
          f"1 thread {t1 * 1e3:.2f} ms, {n} threads {tn * 1e3:.2f} ms (x{t1 / tn:.2f}; even split "
          f"{t1 / n * 1e3:.2f}), load {os.getloadavg()[0]:.1f}")
    print(f"  {'1 thr ms':>8s} {f'{n} thr ms':>8s} {'speedup':>7s} {'lost ms':>7s} {'caller':>6s}  kernel")
    rows = sorted(range(len(one["wall"])), key=lambda k: -(many["wall"][k] - one["wall"][k] / n))
    slow = [k for k in rows if one["wall"][k] / many["wall"][k] < args.below]
    for k in rows[:args.top]:
        a, b = one["wall"][k], many["wall"][k]
        mark = "*" if k in slow else " "
        print(f"  {a * 1e3:8.3f} {b * 1e3:8.3f} {a / b:6.2f}{mark} {(b - a / n) * 1e3:7.3f} "
              f"{many['cpu'][k] / max(b, 1e-12):6.2f}  {one['what'][k][:100]}")
    print(f"  {len(slow)} of {len(rows)} kernels under x{args.below}: {sum(many['wall'][k] for k in slow) * 1e3:.2f} "
          f"of {tn * 1e3:.2f} ms at {n} threads, losing {sum(many['wall'][k] - one['wall'][k] / n for k in slow) * 1e3:.2f}")


if __name__ == "__main__":
    main()
