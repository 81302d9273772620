"""One corpus model at one case, kiln vs ONNX Runtime on one thread each, timed by the calling
thread's CPU time: robust to a loaded machine (caches are still shared), so two kiln checkouts
can be compared by running this under each (PYTHONPATH) at any load.

    python benchmarks/corpus_cpu.py audio_tcn batch=1,samples=16000 [--budget 3] [--profile 20]

Prints kiln's and ORT's median ms, their ratio and the check against ORT; `--profile N` adds
kiln's N heaviest kernels (each called alone, thread CPU time).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ["OMP_NUM_THREADS"] = "1"    # read when kiln's first module loads
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kiln  # noqa: E402
from benchmarks.corpus.build import one_case  # noqa: E402
from kiln.bench import compare, ort_session, stats  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("case", help="as `python -m benchmarks.corpus list` prints it: batch=1,samples=16000")
    ap.add_argument("--budget", type=float, default=3.0, help="seconds of alternating runs (at least 5 each)")
    ap.add_argument("--profile", type=int, default=0, help="list kiln's N heaviest kernels")
    args = ap.parse_args(argv)
    path, _, feeds = one_case(args.model, args.case)
    m = kiln.compile(path)
    sess = ort_session(path, 1)
    check = compare(m.run(feeds), dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds))))
    fns = {"kiln": lambda: m.run(feeds), "ort": lambda: sess.run(None, feeds)}
    times = {k: [] for k in fns}
    end = time.perf_counter() + args.budget
    while time.perf_counter() < end or len(times["kiln"]) < 5:
        for k, fn in fns.items():
            t = time.thread_time()
            fn()
            times[k].append((time.thread_time() - t) * 1e3)
    k, o = stats(times["kiln"])["median_ms"], stats(times["ort"])["median_ms"]
    print(f"{args.model} [{args.case}] kiln {k:.3f} ms, ort {o:.3f} ms, kiln/ort {k / o:.2f} (1 thread, "
          f"thread CPU time, {len(times['kiln'])} runs each, load {os.getloadavg()[0]:.1f}); "
          f"matches ORT: {check['ok']} (max rel {check['max_rel']:.1e}); kiln from {os.path.dirname(kiln.__file__)}")
    if args.profile:
        time.perf_counter = time.thread_time    # the kernels' own CPU time (the profile reads this clock)
        for what, s in sorted(m.profile(feeds, runs=5), key=lambda r: -r[1])[:args.profile]:
            print(f"  {s * 1e3:8.3f} ms  {what}")


if __name__ == "__main__":
    main()
