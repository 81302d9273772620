"""Where the latency spread comes from: the corpus harness's timing of a few rows, with every
timed run recorded raw (engine, round, index in the round, ms, page faults, context switches,
the calling thread's CPU time), so slow runs can be attributed: first of a round (the wake-up
after the harness's 50 ms pause), one round (drift), page faults, preemption, or at random.

    python -m benchmarks.spread unet:batch=1,height=128,width=192 gru_stacked:seq=128,batch=1 \
        --repeat 3 [--scale 2] [--no-openvino] [--ab KILN_POOL_SPIN_US=1000] [--json PATH]

A row is model[:shape] (shape as `python -m benchmarks.corpus list` prints it; none: every
shape). Each repeat is one measurement exactly as `python -m benchmarks.corpus run` takes it
(plan_runs, then kiln.bench.time_interleaved); the verdict per repeat is whether kiln's p90/p10
is no wider than the wider peer's, the corpus acceptance's test. `--scale` multiplies the
planned runs (the same for every engine). `--ab VAR=VALUE` adds an engine: kiln's library loaded
a second time (from a copy of the build cache), its thread pool started under that setting
(KILN_POOL_SPIN_US, KILN_POOL_CALM_MS, ...), timed interleaved with the rest: an A/B that
meets the same noise as the default. Under load the figures
are noise: read the structure (which runs are slow), not the milliseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("KILN_TIER", "full")   # time the -O3 build, never a quick tier (kiln.codegen.tiers)


def rows_of(spec: str) -> list[tuple[dict, dict]]:
    """'model[:shape]' -> [(meta, case)]."""
    from benchmarks.corpus.build import corpus_dir
    from benchmarks.corpus.spec import case_label
    name, _, label = spec.partition(":")
    with open(os.path.join(corpus_dir(), name + ".json")) as f:
        meta = json.load(f)
    cases = [c for c in meta["cases"] if not label or case_label(c) == label]
    if not cases:
        raise SystemExit(f"{name} has no shape {label!r}: {[case_label(c) for c in meta['cases']]}")
    return [(meta, c) for c in cases]


def engines(meta: dict, case: dict, threads: int, openvino: bool, ab: list | None = None) -> dict:
    """{engine: fn()} for one row, as the corpus harness builds them (kiln checked against ORT).
    `ab`, a list of {VAR: value}: also per item "kiln+VAR=value", the same model's library loaded
    again (from a copy of the build cache) whose thread pool starts under those environment
    settings: a paired A/B of run-time settings, all timed interleaved through the same minutes."""
    import kiln
    from benchmarks.corpus.build import corpus_dir, random_feeds
    from benchmarks.corpus.run import ATOL, INPUT_SEED, RTOL, openvino_available, openvino_runner
    from kiln.bench import compare, ort_session
    path = os.path.join(corpus_dir(), meta["name"] + ".onnx")
    feeds = random_feeds(meta["inputs"], case, INPUT_SEED)
    compiled = kiln.compile(path)
    sess = ort_session(path, threads)
    names = [o.name for o in sess.get_outputs()]
    got, want = compiled.run(feeds), dict(zip(names, sess.run(None, feeds)))
    if not compare(got, want, RTOL, ATOL)["ok"]:
        raise SystemExit(f"{meta['name']}: kiln differs from ORT")
    fns = {"kiln": lambda: compiled.run(feeds)}
    for env in ab or []:
        fns["kiln+" + ",".join(f"{k}={v}" for k, v in env.items())] = (
            lambda m: lambda: m.run(feeds))(second_copy(path, feeds, env))
    fns["ort"] = lambda: sess.run(None, feeds)
    if openvino and openvino_available():
        ov_run, _ = openvino_runner(path, feeds, threads)
        fns["openvino"] = lambda: ov_run(feeds)
    return fns


def second_copy(path: str, feeds: dict, env: dict):
    """The model compiled again from a copy of kiln's build cache (so its library is loaded
    anew, with its own thread pool), run once with `env` set (the pool reads it as it starts)."""
    import atexit
    import shutil
    import tempfile

    import kiln
    from kiln.codegen.cachedir import cache_dir
    copy = tempfile.mkdtemp(prefix="kiln-ab-")
    atexit.register(shutil.rmtree, copy, True)   # (a loaded library's file may go: it stays mapped)
    shutil.copytree(cache_dir(), copy, dirs_exist_ok=True, ignore=shutil.ignore_patterns("locks"))
    saved = {k: os.environ.get(k) for k in [*env, "KILN_CACHE_DIR"]}
    os.environ.update({**env, "KILN_CACHE_DIR": copy})
    try:
        model = kiln.compile(path)
        model.run(feeds)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return model


def measure(fns: dict, budget: float, lo: int, hi: int, scale: float = 1.0) -> tuple[dict, int, list]:
    """One measurement as the corpus harness takes it; returns (runs, rounds, raw records)."""
    from benchmarks.corpus.run import plan_runs
    from kiln.bench import time_interleaved
    runs = plan_runs(fns, budget, lo, hi)
    runs = {k: max(1, int(round(v * scale))) for k, v in runs.items()}
    rounds = max(1, min(10, min(runs.values())))
    raw: list = []
    time_interleaved(fns, runs, rounds, record=raw)
    return runs, rounds, raw


def fmt(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def spread(ms) -> float:
    p10, p90 = np.percentile(ms, [10, 90])
    return float(p90 / p10)


def analyse(raw: list, engine: str) -> dict:
    """The structure of one engine's runs in one measurement."""
    rs = [r for r in raw if r["engine"] == engine]
    ms = np.array([r["ms"] for r in rs])
    med = float(np.median(ms))
    first = np.array([r["k"] == 0 for r in rs])
    out = {"n": len(rs), "median_ms": med, "spread": spread(ms), "per_round": int(max(r["k"] for r in rs)) + 1}
    if first.all() or not first.any():
        out["first_over_rest"] = None
    else:
        out["first_over_rest"] = float(np.median(ms[first]) / np.median(ms[~first]))
        out["spread_first_only"] = spread(ms[first]) if first.sum() > 1 else None
    slow = ms >= np.percentile(ms, 90)
    out["slow_first_frac"] = float(first[slow].mean())
    rounds = sorted({r["round"] for r in rs})
    rmed = np.array([np.median([r["ms"] for r in rs if r["round"] == k]) for k in rounds])
    out["between_rounds"] = float(rmed.max() / rmed.min())     # drift: the slowest round's median / the fastest's
    out["slow_rounds"] = sorted({r["round"] for r, s in zip(rs, slow) if s})
    for key in ("minflt", "nivcsw", "nvcsw"):
        v = np.array([r[key] for r in rs])
        out[key] = float(np.median(v))
        out[key + "_slow"] = float(np.median(v[slow]))
    cpu = np.array([r["cpu_ms"] for r in rs])
    out["cpu_over_wall"] = float(np.median(cpu / ms))
    out["cpu_over_wall_slow"] = float(np.median(cpu[slow] / ms[slow]))
    wait = np.array([r.get("wait_ms") if r.get("wait_ms") is not None else np.nan for r in rs])
    out["wait_ms"] = float(np.nanmedian(wait)) if np.isfinite(wait).any() else None   # the caller runnable, not running
    out["wait_ms_slow"] = float(np.nanmedian(wait[slow])) if np.isfinite(wait[slow]).any() else None
    moved = np.array([r.get("cpu_before", -1) != r.get("cpu_after", -1) for r in rs])
    out["moved"], out["moved_slow"] = float(moved.mean()), float(moved[slow].mean())   # caller changed CPU
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.spread", description=__doc__.split("\n\n")[0])
    p.add_argument("rows", nargs="+", help="model[:shape]")
    p.add_argument("--repeat", type=int, default=3, help="measurements per row (default 3)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--budget", type=float, default=1.0, help="as the corpus harness (default 1 s)")
    p.add_argument("--min-runs", type=int, default=5)
    p.add_argument("--max-runs", type=int, default=50)
    p.add_argument("--scale", type=float, default=1.0, help="multiply every engine's planned runs")
    p.add_argument("--no-openvino", dest="openvino", action="store_false")
    p.add_argument("--ab", metavar="VAR=VALUE[,VAR=VALUE]", action="append", default=[],
                   help="also time kiln's library loaded again, its pool started under these settings "
                        "(repeatable: one more engine each)")
    p.add_argument("--json", metavar="PATH", help="write the raw runs and the analysis")
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    from benchmarks.corpus.spec import case_label
    print("per engine: runs, median, p90/p10; first/rest: median of each round's first timed run over the "
          "others'; slow runs (p90 and over): share first of their round, rounds they fell in; then "
          "all runs / slow runs: page faults, involuntary context switches (process), the caller's CPU "
          "over wall time and its run-queue wait, the share of runs the caller changed CPU")
    out = []
    for spec in args.rows:
        for meta, case in rows_of(spec):
            ab = [dict(kv.split("=", 1) for kv in a.split(",")) for a in args.ab]
            fns = engines(meta, case, args.threads, args.openvino, ab)
            label = f"{meta['name']} [{case_label(case)}]"
            for rep in range(args.repeat):
                t = time.perf_counter()
                runs, rounds, raw = measure(fns, args.budget, args.min_runs, args.max_runs, args.scale)
                res = {e: analyse(raw, e) for e in fns}
                peers = [res[e]["spread"] for e in fns if not e.startswith("kiln")]
                verdict = res["kiln"]["spread"] <= max(peers)
                kilns = {e: res[e]["spread"] <= max(peers) for e in fns if e.startswith("kiln")}
                out.append({"row": label, "repeat": rep, "runs": runs, "rounds": rounds, "verdict": verdict,
                            "verdicts": kilns,
                            "analysis": res, "raw": raw, "load": os.getloadavg()[0],
                            "seconds": time.perf_counter() - t})
                print(f"{label} #{rep}: {rounds} rounds, {runs['kiln']} runs each, load {os.getloadavg()[0]:.1f}, kiln "
                      f"{'<=' if verdict else '>'} wider peer", flush=True)
                for e, a in res.items():
                    f = a["first_over_rest"]
                    print(f"  {e:<9} n {a['n']:>3} ({a['per_round']}/round)  median {a['median_ms']:9.3f} ms  "
                          f"p90/p10 {a['spread']:.3f}  first/rest {'-' if f is None else format(f, '.3f')}  "
                          f"slow runs first-of-round {a['slow_first_frac']:.0%}  rounds max/min {a['between_rounds']:.3f}  "
                          f"slow rounds {a['slow_rounds']}  faults {a['minflt']:.0f}/{a['minflt_slow']:.0f}  "
                          f"invol.cs {a['nivcsw']:.0f}/{a['nivcsw_slow']:.0f}  cpu/wall {a['cpu_over_wall']:.2f}/"
                          f"{a['cpu_over_wall_slow']:.2f}  queue wait ms {fmt(a['wait_ms'])}/{fmt(a['wait_ms_slow'])}"
                          f"  moved {a['moved']:.0%}/{a['moved_slow']:.0%}", flush=True)
    rows = sorted({o["row"] for o in out})
    print("verdicts (kiln's p90/p10 no wider than the wider peer's):")
    for r in rows:
        got = [o["verdicts"] for o in out if o["row"] == r]
        print(f"  {r}: " + ", ".join(f"{e} {sum(g[e] for g in got)}/{len(got)}" for e in got[0]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "measurements": out}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
