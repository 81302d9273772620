"""How one corpus model's inference splits its work over threads, counted kernel by kernel:
which kernels fork, which run on the calling thread alone, which loop each parallel one
splits and how evenly, and the serial fraction. Meaningful on a loaded machine: it counts
CPU time per thread, not wall time.

    python -m benchmarks.work_split tiny_cnn batch=8 [--threads 2] [--runs 30]

Per kernel call (in the entry's order): the one-inference CPU time of the calling thread and
of all threads (`time.thread_time` / `time.process_time` around the call, medians over
`--runs`), the caller's share of it (1.00: the kernel ran on the caller alone; 1/threads: an
even split), and, from the module's C source (`kiln.stages`), how the kernel forks: the
parallel loop's iteration count and the balance of its iterations over `--threads` (a static
split of 3 iterations over 2 threads keeps one thread busy 2/3 of the time: balance 0.75),
or a hand-written kernel's own threads. The summary gives the forks per inference, the
kernels below the fork threshold, the serial fraction (CPU time in kernels that ran on one
thread) and the latency that split allows on `--threads` idle cores with free forks
(serial + parallel / threads / balance), the bound that fork cost and load come on top of.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("KILN_TIER", "full")   # time the -O3 build, never a quick tier (kiln.codegen.tiers)


def parallel_loops(source: str) -> dict[str, list[str]]:
    """Per kernel function of the generated C: how it forks, one entry per parallel region:
    "for N" (a loop of N iterations split over the threads: OpenMP's `parallel for` or kiln's
    pool), "own" (a hand-written kernel that forks inside), [] when it never forks."""
    out: dict[str, list[str]] = {}
    for m in re.finditer(r"^int32_t (kiln_k\d+_\w+)\([^)]*\) \{\n(.*?)^\}\n", source, re.S | re.M):
        body, found = m.group(2), []
        for p in re.finditer(r"#pragma omp parallel for[^\n]*\n\s*for \(int64_t \w+ = ([^;]+); \w+ < ([^;]+);"
                             r"|kiln_pool_for\(\w+, &kiln_c, ([^,]+), ([^)]+)\)", body):
            lo, hi = (p.group(1), p.group(2)) if p.group(1) is not None else (p.group(3), p.group(4))
            found.append(f"for {int(hi) - int(lo)}" if lo.strip().lstrip("-").isdigit() and hi.strip().isdigit()
                         else f"for {hi.strip()}")
        if not found and re.search(r"return kiln_\w+\(", body):
            found.append("own")        # a hand-written kernel: its C decides (a `parallel` argument)
        out[m.group(1)] = found
    return out


def balance(extent: int, threads: int) -> float:
    """Busy fraction of `threads` threads splitting `extent` equal iterations as evenly as whole
    iterations allow (the slowest thread takes ceil(extent / threads))."""
    return extent / (threads * math.ceil(extent / threads)) if extent > 0 else 1.0


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("case", help="as `python -m benchmarks.corpus list` prints it: batch=8")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)   # read when kiln's first library loads
    import time

    import numpy as np

    import kiln
    from benchmarks.corpus.build import one_case
    from kiln.runtime.threads import IMPL_DEFAULT
    from kiln.stages import stage_text

    path, case, feeds = one_case(args.model, args.case)
    m = kiln.compile(path)
    m.run(feeds)
    runner = m.program.runner_for([np.asarray(x) for x in m.ordered(feeds)])
    symbols = [symbol for symbol, _ in runner.info["call_args"]]
    values = [np.asarray(x) for x in m.ordered(feeds)]
    clocks = {}
    for name, clock in (("caller", time.thread_time), ("all", time.process_time)):
        saved, time.perf_counter = time.perf_counter, clock   # the profile reads this clock
        try:
            _, t = runner.profile(values, runner.info["call_args"], args.runs)
        finally:
            time.perf_counter = saved
        clocks[name] = [float(np.median(x)) * 1e3 for x in t]
    dims = {k: v for k, v in case.items()}
    loops = parallel_loops(stage_text(path, "c", dims))

    total = sum(clocks["all"])
    forks = serial_n = 0
    serial_ms = ideal = 0.0
    print(f"{args.model} [{args.case}], {args.threads} threads ({os.environ.get('KILN_THREADS_IMPL') or IMPL_DEFAULT}), "
          f"CPU ms per inference, medians of {args.runs}, load {os.getloadavg()[0]:.1f}")
    print(f"  {'kernel':44s} {'caller':>7s} {'all':>7s} share  forks")
    for sym, what, mine, every in zip(symbols, runner.call_nodes, clocks["caller"], clocks["all"]):
        regions = loops.get(sym, [])
        share = mine / every if every > 0 else 1.0
        parallel = bool(regions) and (regions != ["own"] or share < 0.9)   # an own-threads kernel that forked
        bal = min((balance(int(r.split()[1]), args.threads) for r in regions if r.split()[-1].isdigit()),
                  default=1.0)
        if parallel:
            forks += len(regions)
            ideal += every / args.threads / bal
        else:
            serial_n += 1
            serial_ms += every
            ideal += every
        desc = ", ".join(r + (f" (balance {balance(int(r.split()[1]), args.threads):.2f})"
                              if r.split()[-1].isdigit() else "") for r in regions) if parallel else "serial"
        print(f"  {sym[:44]:44s} {mine:7.3f} {every:7.3f} {share:5.2f}  {desc}   [{what[:60]}]")
    print(f"  {len(symbols)} kernel calls: {forks} parallel regions, {serial_n} kernels on one thread; "
          f"CPU {total:.3f} ms, serial fraction {serial_ms / total if total else 0:.2f}; "
          f"best {args.threads}-thread latency this split allows {ideal:.3f} ms "
          f"(speedup {total / ideal if ideal else 1:.2f}), before fork costs")


if __name__ == "__main__":
    main()
