"""Kernel by kernel, one corpus model built with two sets of decisions (kiln.lower.decisions) in one
process, the kernels called one by one in the model's order (`NativeModule.profile`: weights come
from memory as in a run), the two builds alternating round by round; per kernel whose nodes match
--kernels, the least and the median of all its runs for A and B, and their sums.

    python benchmarks/decision_ab.py resnet50 --dims batch=1 --b '{"nchwc.k_chunk": 0}' [--a '{}']
        [--kernels 'ConvNCHWc'] [--rounds 8] [--runs 5] [--all]

One thread (OMP_NUM_THREADS=1) times the calling thread's CPU time, valid on a loaded machine;
more threads time the wall clock (a quiet machine only). Kernels within 3% (least of runs) are
left out unless --all; the sums cover every matching kernel.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("KILN_TIER", "full")   # time the -O3 build, never a quick tier (kiln.codegen.tiers)

import numpy as np  # noqa: E402

import kiln  # noqa: E402
from benchmarks.kernel_profile import corpus_path, feeds_for  # noqa: E402


def kernel_times(model, feeds: dict, runs: int, clock) -> dict:
    """Per kernel (the nodes it computes), its seconds in each of `runs` runs in the model's order."""
    values = [np.asarray(x) for x in model.ordered(feeds)]
    runner = model.program.runner_for(values)
    saved, time.perf_counter = time.perf_counter, clock     # the profile reads this clock
    try:
        _, times = runner.profile(values, runner.info["call_args"], runs)
    finally:
        time.perf_counter = saved
    return dict(zip(runner.call_nodes, times))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--dims", default="batch=1", help="symbolic dims: name=size,...")
    ap.add_argument("--a", default="{}", help="decisions of A (JSON)")
    ap.add_argument("--b", required=True, help="decisions of B (JSON)")
    ap.add_argument("--kernels", default="", help="regex over a kernel's nodes (default: every kernel)")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--all", action="store_true", help="list every matching kernel")
    args = ap.parse_args(argv)
    dims = dict(kv.split("=") for kv in args.dims.split(",") if kv)
    path = corpus_path(args.model)
    feeds = feeds_for(path, dims)
    decisions = [json.loads(args.a), json.loads(args.b)]
    models = [kiln.compile(path, decisions=d or None) for d in decisions]
    outs = [m.run(feeds) for m in models]
    diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(outs[0].values(), outs[1].values()))
    one = os.environ.get("OMP_NUM_THREADS") == "1"
    clock = time.thread_time if one else time.perf_counter
    pat = re.compile(args.kernels)
    got: list[dict] = [{}, {}]
    for _ in range(args.rounds):
        for i, m in enumerate(models):
            for what, t in kernel_times(m, feeds, args.runs, clock).items():
                if pat.search(what):
                    got[i].setdefault(what, []).extend(t * 1e3)
    print(f"{args.model} [{args.dims}] A {args.a} vs B {args.b}: {'thread CPU time, one thread' if one else 'wall'}, "
          f"{args.rounds} x {args.runs} runs each, max abs diff {diff:.2g}")
    sums = np.zeros(4)
    for what, a in got[0].items():
        a, b = np.asarray(a), np.asarray(got[1].get(what, [np.nan]))
        row = np.array([a.min(), b.min(), np.median(a), np.median(b)])
        sums += row
        if args.all or abs(row[0] - row[1]) > 0.03 * row[1]:
            print(f"  least {row[0]:7.3f} {row[1]:7.3f} ms ({row[0] / row[1]:.2f})  median {row[2]:7.3f} "
                  f"{row[3]:7.3f}  {what[:90]}")
    if not got[0]:
        print(f"no kernel's nodes match {args.kernels!r}")
        return
    print(f"{len(got[0])} kernels: least summed A {sums[0]:.2f} B {sums[1]:.2f} ms ({sums[0] / sums[1]:.3f}), "
          f"median summed A {sums[2]:.2f} B {sums[3]:.2f} ({sums[2] / sums[3]:.3f}); load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
