"""Shape-generic modules (issue 15 items 1 and 4): new shapes without a new compile.

    python benchmarks/generic_shapes.py [--pairs 20] [--runs 20] [--processes 5] [--all-pairs] [--tiered]
    python benchmarks/generic_shapes.py --corpus bert_base,distilbert,gpt2,llama_gqa [--tiered]
    python benchmarks/generic_shapes.py --corpus resnet50,mobilenet_v3_small --batch 1,8 --reserve

For a model with symbolic batch and sequence dims (examples/build_transformer.py's encoder,
compiled with shapes="generic"): after the first run, each of `--pairs` new (batch, seq)
pairs is run once (first use) and then `--runs` times; its extra latency on first use is the
first call minus the median of the rest, and its minor page faults (resource.getrusage: the
arena's fresh memory, mapped as the kernels first touch it). The pairs' first uses run in
`--processes` fresh processes, each compiling (from the cache after the first) and running
(1, 8) first, then the pairs in the same order; per pair the median over the processes is
reported, so a one-off (another process's burst on a 2-core machine) shows as the max, not
as the pair's figure. The C compiler's runs are counted over all of it
(kiln.codegen.build's subprocess calls). Then the steady-state latency of the generic module
against the module specialised to each shape (shapes="specialize"), medians of interleaved
rounds of runs (kiln.bench.time_interleaved), at four shapes (`--all-pairs`: and at each new pair);
`--tiered`: and the model compiled shapes="tiered" once its background specialisation of the
shape serves it (issue 15: "or specialisation in the background closes the gap, measured").

`--corpus`: corpus models (~/.cache/kiln-corpus), one thread (OMP_NUM_THREADS=1), timed by
the calling thread's CPU time (robust to a loaded machine): per model its generic compile,
the 20 new (batch, seq) pairs' first-use extra time and compiler runs, and generic vs
specialised medians at the corpus cases. `--tiered`: at each case the model compiled shapes="tiered" runs
the new shape at once on the generic module, the specialised module built in the background
then serves it, timed interleaved with the other two. `--pairs 0`: steady state only. `--reserve`: the generic model
first reserves the pairs' largest sizes (GenericModel.reserve: the arena planned and its memory
mapped), so a pair's first use pays for its plan, not for fresh memory.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

if any(a.startswith("--corpus") for a in sys.argv):
    os.environ["OMP_NUM_THREADS"] = "1"    # read when kiln's first module loads: one thread, timed by its CPU time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "examples")]
os.environ.setdefault("KILN_TIER", "full")   # time the -O3 build, never a quick tier (kiln.codegen.tiers)

import kiln  # noqa: E402
from kiln.codegen import build as c_build  # noqa: E402


class _Counting:
    def __init__(self, real):
        self.real, self.n = real, 0

    def __getattr__(self, name):
        attr = getattr(self.real, name)
        if name in ("run", "Popen", "call", "check_call", "check_output"):
            def counted(*a, **kw):
                self.n += 1
                return attr(*a, **kw)
            return counted
        return attr


def _median_ms(fn, runs: int) -> float:
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts)) * 1e3


def _feeds(inputs, batch, seq, rng):
    out = {}
    for s in inputs:
        shape = tuple(batch if d == "batch" else seq if d == "seq" else d for d in s.shape)
        if s.dtype == "int64":
            hi = 2 if "mask" in s.name else 2 if "type" in s.name else 100
            out[s.name] = rng.integers(0 if "mask" not in s.name else 1, hi, shape).astype(np.int64)
        else:
            out[s.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def first_use(model, pairs, runs: int) -> list[tuple]:
    rng = np.random.default_rng(0)
    counter = _Counting(c_build.subprocess)
    c_build.subprocess = counter
    rows = []
    try:
        for b, s in pairs:
            feeds = _feeds(model.inputs, b, s, rng)
            ins = model.ordered(feeds)
            t0 = time.perf_counter()
            model.module._prepare(ins)       # what a new shape costs: its arena plan
            plan = (time.perf_counter() - t0) * 1e3
            model.module._by_shapes.clear()
            model.module.layouts.clear()
            faults, cpu = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.process_time()
            t0 = time.perf_counter()
            model.run(feeds)
            first = (time.perf_counter() - t0) * 1e3
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
            cpu = (time.process_time() - cpu) * 1e3
            steady = _median_ms(lambda: model.run(feeds), runs)
            steady_cpu = float(np.median([_cpu_ms(lambda: model.run(feeds), time.process_time) for _ in range(3)]))
            rows.append((b, s, plan, first, steady, first - steady, faults, cpu - steady_cpu))
    finally:
        c_build.subprocess = counter.real
    return rows, counter.n


def _encoder():
    import build_transformer
    return build_transformer.build_encoder(hidden=256, heads=4, ffn=1024, layers=2, vocab=1000)


def _pairs(rng, n: int) -> list[tuple]:
    """`n` distinct random (batch, seq) pairs other than (1, 8), the first run's."""
    pairs = []
    while len(pairs) < n:
        p = (int(rng.integers(1, 9)), int(rng.integers(1, 257)))
        if p not in pairs and p != (1, 8):
            pairs.append(p)
    return pairs


def child_first_use(pairs: list, runs: int) -> dict:
    """In a fresh process: the encoder compiled generic, run at (1, 8), then `pairs`' first uses."""
    t0 = time.perf_counter()
    g = kiln.compile(_encoder(), target="cpu", shapes="generic")
    compile_s = time.perf_counter() - t0
    g.run(_feeds(g.inputs, 1, 8, np.random.default_rng(7)))
    rows, compiles = first_use(g, [tuple(p) for p in pairs], runs)
    return {"compile_s": compile_s, "shapes": g.shapes, "rows": rows, "compiles": compiles}


def fresh_first_use(pairs: list, runs: int, processes: int) -> list[dict]:
    """child_first_use in `processes` fresh processes, one after another."""
    out = []
    for _ in range(processes):
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child-first-use", json.dumps(pairs),
                            str(runs)], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(r.stderr[-3000:])
        out.append(json.loads(r.stdout.strip().split("\n")[-1]))
    return out


def print_first_use(pairs: list, results: list[dict]) -> None:
    """Per pair the medians over the processes (and the largest extra any one saw)."""
    print(f"{'batch':>5} {'seq':>4} {'plan ms':>8} {'first ms':>9} {'steady ms':>9} {'extra ms':>8} "
          f"{'max extra':>9} {'faults':>7} {'cpu extra':>9}   (medians of {len(results)} fresh processes; "
          "cpu: the process's CPU ms, all threads)")
    meds = []
    for k, (b, s) in enumerate(pairs):
        cols = list(zip(*[r["rows"][k] for r in results]))
        m = [float(np.median(c)) for c in cols[2:]]
        meds.append((m[3], max(cols[5]), m[4], m[0], m[5]))
        print(f"{b:5d} {s:4d} {m[0]:8.3f} {m[1]:9.2f} {m[2]:9.2f} {m[3]:8.2f} {max(cols[5]):9.2f} {m[4]:7.0f} "
              f"{m[5]:9.2f}")
    extras = [x[0] for x in meds]
    print(f"first-use extra latency (per pair, median of {len(results)} processes): median {np.median(extras):.2f} ms, "
          f"max {max(extras):.2f} ms, pairs over 5 ms: {sum(e > 5 for e in extras)}; largest single reading "
          f"{max(x[1] for x in meds):.2f} ms; minor page faults on first use: median {np.median([x[2] for x in meds]):.0f}, "
          f"max {max(x[2] for x in meds):.0f}; CPU extra median {np.median([x[4] for x in meds]):.2f} ms, max "
          f"{max(x[4] for x in meds):.2f} ms; arena plan median {np.median([x[3] for x in meds]):.3f} ms; "
          f"C compiler runs after the first shape: {sum(r['compiles'] for r in results)}")


def steady(generic, special, shapes, runs: int, tiered=None) -> list[tuple]:
    """Per shape, (feeds' shapes, generic ms, specialised ms, ratio, tiered ms or None): medians
    of rounds of a few runs of each (kiln.bench.time_interleaved: each module has its own thread
    pool, so alternating single runs would time one pool's wake-up while the other's still
    spins). `tiered` (shapes="tiered"): its first run at the shape starts the shape's
    specialisation in the background, which is waited for, then timed beside the other two."""
    from kiln.bench import time_interleaved
    rng = np.random.default_rng(1)
    rows = []
    for b, s in shapes:
        feeds = _feeds(generic.inputs, b, s, rng)
        special.run(feeds)
        generic.run(feeds)
        engines = {"generic": lambda: generic.run(feeds), "special": lambda: special.run(feeds)}
        if tiered is not None:
            tiered.run(feeds)       # (served by the generic module while the shape is specialised)
            tiered.wait(1800)
            assert not tiered.failed, tiered.failed
            engines["tiered"] = lambda: tiered.run(feeds)
        times = time_interleaved(engines, {k: runs for k in engines}, rounds=min(5, runs))
        g, sp = float(np.median(times["generic"])), float(np.median(times["special"]))
        t = float(np.median(times["tiered"])) if tiered is not None else None
        rows.append((" ".join(f"{k}{list(v.shape)}" for k, v in feeds.items()), g, sp, g / sp, t))
    return rows


def _cpu_ms(fn, clock=time.thread_time) -> float:
    t0 = clock()
    fn()
    return (clock() - t0) * 1e3


def corpus_model(name: str, pairs: list, runs: int, tiered: bool, reserve: bool = False,
                 batches: list | None = None) -> None:
    """One corpus model: generic compile, first use of `pairs`, generic vs specialised."""
    import json
    from benchmarks.corpus.build import corpus_dir, random_feeds
    path = os.path.join(corpus_dir(), name + ".onnx")
    with open(os.path.join(corpus_dir(), name + ".json")) as f:
        meta = json.load(f)
    t0 = time.perf_counter()
    g = kiln.compile(path, shapes="generic")
    compile_s = time.perf_counter() - t0
    print(f"{name}: shapes={g.shapes} ({g.shapes_reason})", flush=True)
    if g.shapes != "generic":
        return
    if pairs:
        sym = [d for i in meta["inputs"] for d in i["shape"] if isinstance(d, str)]
        feeds = lambda b, s, seed: random_feeds(meta["inputs"], {"batch": b, "seq": s, **{  # noqa: E731
            k: s for k in sym if k not in ("batch", "seq")}}, seed)
        counter = _Counting(c_build.subprocess)
        c_build.subprocess = counter
        try:
            g.run(feeds(1, 8, 0))
            if reserve:   # the pairs' largest sizes: memory mapped now, not on a pair's first run
                g.reserve(**{s: max(p[0 if s == "batch" else 1] for p in pairs) for s in g.module.symbols})
            before = counter.n
            extras, firsts, plans = [], [], []
            for k, (b, s) in enumerate(pairs):
                f = feeds(b, s, k + 1)
                ins = g.ordered(f)
                plans.append(_cpu_ms(lambda: g.module._prepare(ins)))   # what is new for a new shape: its plan
                g.module._by_shapes.clear()
                g.module.layouts.clear()
                t0 = time.perf_counter()
                first_cpu = _cpu_ms(lambda: g.run(f))
                first_wall = (time.perf_counter() - t0) * 1e3
                steady = float(np.median([_cpu_ms(lambda: g.run(f)) for _ in range(3)]))
                extras.append(first_cpu - steady)
                firsts.append(first_wall)
        finally:
            c_build.subprocess = counter.real
        _first_use(name, compile_s, pairs, plans, extras, firsts, counter.n - before)
    steady_rows(path, meta, g, runs, tiered, batches)


def _first_use(name, compile_s, pairs, plans, extras, firsts, compiles) -> None:
    print(f"{name}: generic compile {compile_s:.1f} s; {len(pairs)} new (batch, seq) pairs: arena plan per new "
          f"shape median {np.median(plans):.2f} ms, max {max(plans):.2f} ms; first-use extra "
          f"(thread CPU, first run minus the median of 3 more) median {np.median(extras):.2f} ms, "
          f"max {max(extras):.2f} ms (wall, whole first run: median {np.median(firsts):.1f} ms); "
          f"C compiler runs after the first shape: {compiles}")
    print("  first-use extra ms per pair: " + ", ".join(f"{b}x{s_}: {e:.1f}" for (b, s_), e in zip(pairs, extras)))


def steady_rows(path, meta, g, runs: int, tiered: bool, batches) -> None:
    """Generic vs specialised (and, `tiered`, the tiered model once its background
    specialisation is in) at the corpus cases, one thread, thread CPU, interleaved."""
    from benchmarks.corpus.build import random_feeds
    from benchmarks.corpus.spec import case_label
    sp = kiln.compile(path, shapes="specialize")
    t = kiln.compile(path, shapes="tiered") if tiered else None
    cases = meta["cases"]
    if batches:     # the corpus cases at these batches instead of their own
        cases = [dict(c) for c in {tuple(sorted({**c, "batch": b}.items())): 0 for c in cases for b in batches}]
    for case in cases:
        f = random_feeds(meta["inputs"], case, 99)
        want, got = sp.run(f), g.run(f)
        err = max(float(np.max(np.abs(got[k] - want[k]))) for k in want)
        built = first = None
        if t is not None:   # a new shape: served generic at once, specialised in the background
            first = _cpu_ms(lambda: t.run(f))
            t0 = time.perf_counter()
            t.wait(1800)
            built = time.perf_counter() - t0
            assert not t.failed, t.failed
        engines = [g, sp] + ([t] if t is not None else [])
        times = [[] for _ in engines]
        for _ in range(runs):
            for e, acc in zip(engines, times):
                acc.append(_cpu_ms(lambda: e.run(f)))
        mg, ms = float(np.median(times[0])), float(np.median(times[1]))
        line = (f"  [{case_label(case)}] generic {mg:.3f} ms, specialised {ms:.3f} ms, generic/specialised "
                f"{mg / ms:.3f}")
        if t is not None:
            mt = float(np.median(times[2]))
            line += (f"; tiered: first run {first:.2f} ms (generic), specialised in the background in "
                     f"{built:.1f} s, then {mt:.3f} ms, tiered/specialised {mt / ms:.3f}")
        print(line + f" (1 thread, thread CPU, {runs} interleaved runs; max |diff| {err:.1e})", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=20, help="new (batch, seq) pairs run for their first use; "
                    "0 with --corpus: the steady state only")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--corpus", default="")
    ap.add_argument("--tiered", action="store_true", help="also shapes=\"tiered\" once the shape is specialised in the "
                    "background (the encoder's steady state; with --corpus, at each case)")
    ap.add_argument("--reserve", action="store_true", help="GenericModel.reserve the pairs' largest sizes first")
    ap.add_argument("--batch", default="", help="steady state at these batches (1,8) instead of the corpus cases'")
    ap.add_argument("--all-pairs", action="store_true", help="the encoder's steady state at the new pairs too "
                    "(each specialised: one compile per pair)")
    ap.add_argument("--processes", type=int, default=5, help="fresh processes the pairs' first uses run in")
    ap.add_argument("--child-first-use", nargs=2, metavar=("PAIRS", "RUNS"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child_first_use:
        print(json.dumps(child_first_use(json.loads(args.child_first_use[0]), int(args.child_first_use[1]))))
        return 0
    if args.corpus:
        pairs = _pairs(np.random.default_rng(7), args.pairs)
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; pairs {pairs}")
        for name in args.corpus.split(","):
            corpus_model(name, pairs, args.runs, args.tiered, args.reserve,
                         [int(b) for b in args.batch.split(",")] if args.batch else None)
        return 0
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    pairs = _pairs(np.random.default_rng(7), args.pairs)
    results = fresh_first_use(pairs, args.runs, args.processes)
    print(f"encoder (hidden 256, 2 layers): shapes={results[0]['shapes']}, compile {results[0]['compile_s']:.2f} s "
          f"(first process), {np.median([r['compile_s'] for r in results[1:]] or [0]):.2f} s (the others, cached)")
    print_first_use(pairs, results)
    model = _encoder()
    g = kiln.compile(model, target="cpu", shapes="generic")
    sp = kiln.compile(model, target="cpu", shapes="specialize")
    t = kiln.compile(model, target="cpu", shapes="tiered") if args.tiered else None
    print(f"\nsteady state, generic vs specialised ({args.runs} runs each in interleaved rounds, medians)"
          + ("; tiered: the shape specialised in the background, then timed with them" if t else ""))
    ratios, tiered = [], []
    for shapes, tg, ts, r, tt in steady(g, sp, [(1, 16), (1, 128), (4, 64), (8, 128)] + (pairs if args.all_pairs
                                                                                          else []), args.runs, t):
        print(f"  encoder {shapes}: generic {tg:.2f} ms, specialised {ts:.2f} ms, ratio {r:.2f}"
              + (f"; tiered {tt:.2f} ms, tiered / specialised {tt / ts:.2f}" if tt is not None else ""), flush=True)
        ratios.append(r)
        if tt is not None:
            tiered.append(tt / ts)
    print(f"generic / specialised: {min(ratios):.2f}-{max(ratios):.2f} over {len(ratios)} shapes, "
          f"{sum(r <= 1.10 for r in ratios)} within 10%"
          + (f"; tiered / specialised: {min(tiered):.2f}-{max(tiered):.2f}, {sum(r <= 1.10 for r in tiered)} within "
             "10%" if tiered else "") + f"; load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
