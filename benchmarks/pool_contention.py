"""Does kiln's multi-thread latency depend on what ran before it in the process? kiln's pool
(kiln/codegen/c_src/kiln_pool.h) runs its loops on the calling thread alone while it finds the
cores contended, and another runtime's threads that spin after their last call (ONNX Runtime's
intra-op pool spins 2^20 pauses, tens of ms, after each run) are such contention.

    python -m benchmarks.pool_contention mobilenet_v2 batch=1,height=224,width=224 [--rounds 12]

Rounds of one model's case, the scenarios interleaved round by round (so the machine's spells
hit all alike); a round is: the scenario's predecessor, a pause, one untimed run, then --runs
timed runs of the engine timed (kiln; --engine ov: OpenVINO, which the corpus harness times
right after ONNX Runtime), as the corpus harness's round (kiln.bench.time_interleaved):
  idle     nothing before, a 300 ms pause;
  ort+50   ONNX Runtime's round (--runs runs) just before, the harness's 50 ms pause;
  ort+300  the same with a 300 ms pause (ORT's spin long over);
  ov+50    OpenVINO's round, 50 ms (the harness's order: kiln follows OpenVINO);
  kiln2+0  another kiln module (the same model, loaded again: a pool of its own) just before, no pause.
Per scenario: the median and p90 ms, the share of kiln's parallel loops its pool ran alone
(kiln.runtime.threads.pool_counts), the contention events by kind, and the CPU ms the other
engines' threads took during the timed runs (their spin). Figures are 2-thread wall times:
meaningful on a quiet machine only; the counts are meaningful at any time.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("KILN_TIER", "full")   # time the -O3 build, never a quick tier (kiln.codegen.tiers)

SCENARIOS = ("idle", "ort+50", "ort+300", "ov+50", "kiln2+0")
PAUSE = {"idle": 0.3, "ort+50": 0.05, "ort+300": 0.3, "ov+50": 0.05, "kiln2+0": 0.0}
WHO = {"idle": None, "ort+50": "ort", "ort+300": "ort", "ov+50": "ov", "kiln2+0": "kiln2"}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("case", help="as `python -m benchmarks.corpus list` prints it: batch=1,height=224,width=224")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--runs", type=int, default=5, help="timed runs per round (and the predecessor's runs)")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--engine", default="kiln", choices=("kiln", "ort", "ov"),
                    help="the engine timed (kiln's pool counts are kept for kiln only)")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))   # read when kiln's first library loads

    import kiln
    from benchmarks.corpus.build import one_case
    from benchmarks.corpus.run import openvino_available, openvino_runner
    from benchmarks.spread import second_copy
    from kiln.bench import ort_session, thread_cpu_ns
    from kiln.runtime.threads import pool_counts

    path, _, feeds = one_case(args.model, args.case)
    scenarios = args.scenarios.split(",")
    fns, threads_of = {}, {}

    def add(name, make):   # an engine, and the threads it made (its first run's included)
        seen = set(thread_cpu_ns())
        fns[name] = make()
        fns[name]()
        threads_of[name] = set(thread_cpu_ns()) - seen

    def ort():
        sess = ort_session(path, args.threads)
        return lambda: sess.run(None, feeds)

    def ov():
        run, _ = openvino_runner(path, feeds, args.threads)
        return lambda: run(feeds)

    def kiln2():   # the same model's library loaded again: a pool of its own
        m2 = second_copy(path, feeds, {})
        return lambda: m2.run(feeds)

    m = kiln.compile(path)
    add("kiln", lambda: lambda: m.run(feeds))
    lib = m.program.runner_for([np.asarray(x) for x in m.ordered(feeds)]).lib
    if pool_counts(lib) is None:
        raise SystemExit("this kiln module has no pool of its own (KILN_THREADS_IMPL=omp?)")
    add("ort", ort)
    if openvino_available():
        add("ov", ov)
    add("kiln2", kiln2)
    timed = fns[args.engine]
    scenarios = [s for s in scenarios if WHO[s] in (None, *fns)]
    mine = {threading.get_native_id(), *threads_of[args.engine]}
    others = lambda cpu: sum(v for t, v in cpu.items() if t not in mine)
    res = {s: {"ms": [], "forks": 0, "alone": 0, "events": np.zeros(4, int), "other_ms": 0.0} for s in scenarios}
    for _ in range(args.rounds):
        for s in scenarios:
            if WHO[s]:
                for _ in range(args.runs):
                    fns[WHO[s]]()
            time.sleep(PAUSE[s])
            timed()
            c0, o0 = pool_counts(lib), others(thread_cpu_ns())
            for _ in range(args.runs):
                t = time.perf_counter()
                timed()
                res[s]["ms"].append((time.perf_counter() - t) * 1e3)
            c1, o1 = pool_counts(lib), others(thread_cpu_ns())
            r = res[s]
            r["forks"] += c1["forks"] - c0["forks"]
            r["alone"] += c1["alone"] - c0["alone"]
            r["events"] += [c1[k] - c0[k] for k in ("by_spin", "by_wake", "by_join", "by_stall")]
            r["other_ms"] += (o1 - o0) / 1e6
    print(f"{args.model} [{args.case}], {args.engine} timed, {args.threads} threads, {args.rounds} rounds x "
          f"{args.runs} runs, load {os.getloadavg()[0]:.1f}")
    print(f"  {'before':<10} {'median':>8} {'p90':>8}  {'loops alone':>11}  contended by spin/wake/join/stall  "
          f"others' CPU ms per run")
    for s, r in res.items():
        loops = r["forks"] + r["alone"]
        counted = args.engine == "kiln"
        print(f"  {s:<10} {np.median(r['ms']):8.3f} {np.percentile(r['ms'], 90):8.3f}  "
              f"{fmt(r['alone'] / loops if loops and counted else None):>11}  "
              f"{'/'.join(map(str, r['events'])) if counted else '-':>33}  {r['other_ms'] / len(r['ms']):8.2f}")


def fmt(x) -> str:
    return "-" if x is None else f"{x:.2f}"


if __name__ == "__main__":
    main()
