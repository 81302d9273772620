"""Run the corpus: kiln (default options, `kiln.compile(path)`), ONNX Runtime and OpenVINO (f32)
on every model at every benchmark shape. kiln's outputs are checked against ONNX Runtime
(rtol 1e-3, atol 1e-4) on fresh random inputs; the engines are timed interleaved (kiln.bench:
a 50 ms pause and an untimed call before each engine's round); medians, p10 and p90.

Needs the models built (`python -m benchmarks.corpus build`); needs no torch.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import tempfile
import time
from collections import defaultdict

import numpy as np

from benchmarks.corpus.build import corpus_dir, random_feeds
from benchmarks.corpus.spec import FAMILIES, case_label

RTOL, ATOL = 1e-3, 1e-4
INPUT_SEED = 20261125  # not the build's seed: the check runs on inputs the export never saw


# ---- peers -------------------------------------------------------------------------------------

def openvino_runner(path: str, feeds: dict, threads: int):
    """OpenVINO CPU, f32 precision, `threads` threads, reshaped to the case's static shapes (what
    OpenVINO's docs advise for dynamic models); returns (fn feeds -> {name: array}, load seconds)."""
    import openvino as ov
    t = time.perf_counter()
    core = ov.Core()
    model = core.read_model(path)
    model.reshape({k: list(v.shape) for k, v in feeds.items()})
    compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32",
                                                 "INFERENCE_NUM_THREADS": threads,
                                                 "PERFORMANCE_HINT": "LATENCY"})
    req = compiled.create_infer_request()
    names = [o.get_any_name() for o in compiled.outputs]
    load = time.perf_counter() - t

    def run(f):
        req.infer(f)
        return {n: req.get_output_tensor(k).data.copy() for k, n in enumerate(names)}
    return run, load


def openvino_available() -> bool:
    try:
        import openvino  # noqa: F401
        return True
    except ImportError:
        return False


# ---- one model -----------------------------------------------------------------------------------

def plan_runs(fns: dict, budget_s: float, lo: int, hi: int) -> dict:
    """Runs per engine: as many for every engine (the most any needs to spend about `budget_s`
    timed, from one warm call each, within [lo, hi]).

    The same count for all, because p90/p10 is read from the runs: the more runs, the further out
    their p10 and p90 lie (with 5 runs they are about the 23rd and 77th percentiles, with 50 the
    12th and 88th), and more runs per round put a smaller share right after the round's pause.
    Given runs by its own speed, the fastest engine had the most and so the widest spread by the
    estimator alone: in the six corpus runs of 2026-11-25/26, kiln's p90/p10 was no wider than the
    wider peer's on 19 of 43 rows where kiln had more runs than both peers, 220 of 334 where all
    had as many."""
    runs = {}
    for name, fn in fns.items():
        fn()
        t = time.perf_counter()
        fn()
        ms = (time.perf_counter() - t) * 1e3
        runs[name] = int(min(hi, max(lo, budget_s * 1e3 / max(ms, 1e-3))))
    return dict.fromkeys(runs, max(runs.values(), default=lo))


def bench_model(meta: dict, args) -> list[dict]:
    """All rows of one corpus model: one per case."""
    import kiln
    from kiln.bench import compare, ort_session, stats, time_interleaved
    path = os.path.join(corpus_dir(), meta["name"] + ".onnx")
    base = {"model": meta["name"], "family": meta["family"], "exporter": meta["exporter"], "opset": meta["opset"]}
    compiled, error = None, None
    t = time.perf_counter()
    try:
        # the -O3 build (kiln.codegen.tiers), never a quick tier, is what gets timed
        options = {"tier": "full"} if args.opt_level is None else {"opt_level": args.opt_level, "tier": "full"}
        compiled = kiln.compile(path, **options)
    except Exception as e:  # KilnError expected; anything else is a kiln bug, reported alike
        error = f"compile: {type(e).__name__}: {first_line(e)}"
    compile_s = time.perf_counter() - t
    sess = ort_session(path, args.threads)
    ort_names = [o.name for o in sess.get_outputs()]
    rows = []
    for case in meta["cases"]:
        row = dict(base, shape=case_label(case), compile_s=round(compile_s, 3), error=error, ok=False)
        feeds = random_feeds(meta["inputs"], case, INPUT_SEED)
        want = dict(zip(ort_names, sess.run(None, feeds)))
        fns = {}
        if compiled is not None:
            try:
                t = time.perf_counter()
                got = compiled.run(feeds)   # the first run at a new shape builds its module
                row["first_run_s"] = round(time.perf_counter() - t, 3)
                row.update(compare(got, want, RTOL, ATOL))
                fns["kiln"] = lambda: compiled.run(feeds)
            except Exception as e:
                row["error"] = f"run: {type(e).__name__}: {first_line(e)}"
        if args.check_only:
            rows.append(row)
            continue
        fns["ort"] = lambda: sess.run(None, feeds)
        if args.openvino:
            try:
                ov_run, row["openvino_load_s"] = openvino_runner(path, feeds, args.threads)
                row["openvino_vs_ort"] = compare(ov_run(feeds), want, RTOL, ATOL)["max_rel"]
                fns["openvino"] = lambda: ov_run(feeds)
            except Exception as e:
                row["openvino_error"] = f"{type(e).__name__}: {first_line(e)}"
        runs = plan_runs(fns, args.budget, args.min_runs, args.max_runs)
        times = time_interleaved(fns, runs, rounds=max(1, min(10, min(runs.values()))))
        for name, ms in times.items():
            s = stats(ms)
            row[f"{name}_ms"] = s["median_ms"]
            row[f"{name}_spread"] = s["p90_ms"] / s["p10_ms"]
            row[f"{name}_runs"] = s["n"]
        peers = [row[k] for k in ("ort_ms", "openvino_ms") if k in row]
        row["best_peer_ms"] = min(peers)
        if "kiln_ms" in row:
            row["ratio"] = row["kiln_ms"] / row["best_peer_ms"]
        if args.profile and compiled is not None and "kiln_ms" in row:
            row["profile"] = profile_rows(compiled, path, feeds, args.threads)
        rows.append(row)
    return rows


def first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [""])[0][:300]


# ---- --profile: kiln's kernels beside ORT's nodes, per op kind -----------------------------------

ANCHORS = ("ConvTranspose", "Conv", "MatMul", "Gemm", "LSTM", "GRU", "RNN", "Attention", "LayerNormalization",
           "Softmax", "Resize", "MaxPool", "AveragePool", "GlobalAveragePool", "ReduceMean")
ORT_KINDS = {"FusedConv": "Conv", "FusedMatMul": "MatMul", "FusedGemm": "Gemm", "NchwcConv": "Conv",
             "NchwcMaxPool": "MaxPool", "NchwcGlobalAveragePool": "GlobalAveragePool",
             "NchwcAveragePool": "AveragePool", "NchwcUpsample": "Resize", "ReorderInput": "(layout)",
             "ReorderOutput": "(layout)", "QuickGelu": "Gelu", "BiasGelu": "Gelu", "FastGelu": "Gelu",
             "SkipLayerNormalization": "LayerNormalization", "SkipSimplifiedLayerNormalization": "RMSNormalization",
             "SimplifiedLayerNormalization": "RMSNormalization", "MultiHeadAttention": "Attention",
             "BiasSoftmax": "Softmax", "MatMulScale": "MatMul", "FusedMatMulActivation": "MatMul"}


def kind_of_kernel(what: str) -> str:
    """'Conv node 'a' + Relu node 'b'' -> 'Conv': the group's heaviest op kind."""
    ops = re.findall(r"(\w+) node '", what) or [what.split()[0] if what else "?"]
    return next((a for a in ANCHORS if a in ops), ops[0])


def profile_rows(compiled, path: str, feeds: dict, threads: int, runs: int = 10) -> list[dict]:
    """Per op kind: kiln's and ORT's milliseconds per inference, kiln's loss first."""
    kiln_ms: dict = defaultdict(float)
    for what, s in compiled.profile(feeds, runs=runs):
        kiln_ms[kind_of_kernel(what)] += s * 1e3
    ort_ms = ort_profile(path, feeds, threads, runs)
    kinds = set(kiln_ms) | set(ort_ms)
    out = [{"op": k, "kiln_ms": kiln_ms.get(k, 0.0), "ort_ms": ort_ms.get(k, 0.0)} for k in kinds]
    return sorted(out, key=lambda r: r["ort_ms"] - r["kiln_ms"])


def ort_profile(path: str, feeds: dict, threads: int, runs: int) -> dict:
    """ORT's per-node kernel times (SessionOptions.enable_profiling) summed per op kind, ms per run."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.enable_profiling = True
    with tempfile.TemporaryDirectory() as d:
        so.profile_file_prefix = os.path.join(d, "ort")
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        for _ in range(runs + 1):
            sess.run(None, feeds)
        with open(sess.end_profiling()) as f:
            events = sorted((ev for ev in json.load(f) if ev.get("cat") == "Node"
                             and ev.get("name", "").endswith("_kernel_time")), key=lambda ev: ev["ts"])
    seen, per_run = set(), defaultdict(list)
    for ev in events:   # each node's first call is the untimed warm-up
        if ev["name"] in seen:
            per_run[ev["args"].get("op_name", "?")].append(ev["dur"] / 1e3)
        seen.add(ev["name"])
    out = {}
    for op, ds in per_run.items():
        kind = ORT_KINDS.get(op, op)
        out[kind] = out.get(kind, 0.0) + sum(ds) / runs
    return out


# ---- report -----------------------------------------------------------------------------------

def geomean(xs) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def summary(rows: list[dict]) -> dict:
    """Geometric mean of kiln / best peer over the rows kiln ran and matched, per family and overall."""
    good = [r for r in rows if r.get("ok") and "ratio" in r]
    fams = {f: geomean(r["ratio"] for r in good if r["family"] == f) for f in FAMILIES}
    return {"geomean": geomean(r["ratio"] for r in good), "geomean_by_family": fams,
            "rows": len(rows), "rows_ok": len(good),
            "models_failing": sorted({r["model"] for r in rows if not r.get("ok")})}


def fmt(x, spec=".2f", none="-"):
    return none if x is None else format(x, spec)


def table(rows: list[dict]) -> str:
    head = ["model", "shape", "kiln ms", "ort ms", "ov ms", "kiln/best", "ok", "max rel", "spread k/o/v",
            "compile s", "1st run s"]
    lines = []
    for r in rows:
        spread = "/".join(fmt(r.get(f"{e}_spread")) for e in ("kiln", "ort", "openvino"))
        ok = "yes" if r.get("ok") else ("NO" if "max_rel" in r else "ERR")
        lines.append([r["model"], r["shape"], fmt(r.get("kiln_ms"), ".3f"), fmt(r.get("ort_ms"), ".3f"),
                      fmt(r.get("openvino_ms"), ".3f"), fmt(r.get("ratio")), ok, fmt(r.get("max_rel"), ".1e"),
                      spread, fmt(r.get("compile_s")), fmt(r.get("first_run_s"))])
    widths = [max(len(c) for c in col) for col in zip(head, *lines)]
    out = ["  ".join(c.ljust(w) for c, w in zip(line, widths)) for line in [head, *lines]]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def profile_table(row: dict, top: int = 12) -> str:
    lines = [f"  {row['model']} [{row['shape']}] per op kind, ms per inference (kiln's losses first):",
             f"    {'op kind':<26}{'kiln ms':>10}{'ort ms':>10}{'kiln-ort':>10}"]
    for p in row["profile"][:top]:
        lines.append(f"    {p['op']:<26}{p['kiln_ms']:>10.3f}{p['ort_ms']:>10.3f}{p['kiln_ms'] - p['ort_ms']:>+10.3f}")
    return "\n".join(lines)


def report(rows: list[dict], args) -> str:
    s = summary(rows)
    out = [f"kiln {'default options' if args.opt_level is None else f'-O{args.opt_level}'} vs ONNX Runtime"
           f"{' and OpenVINO (f32)' if args.openvino else ''}, {args.threads} threads, rtol {RTOL} atol {ATOL}, "
           f"load {os.getloadavg()[0]:.1f}", table(rows), ""]
    out += [f"{r['model']} [{r['shape']}]: {r['error']}" for r in rows if r.get("error")]
    out += [f"{r['model']} [{r['shape']}]: kiln differs from ORT: max abs {r['max_abs']:.2e}, max rel "
            f"{r['max_rel']:.2e}" for r in rows if "max_rel" in r and not r["ok"]]
    out += [f"{r['model']} [{r['shape']}]: openvino: {r['openvino_error']}" for r in rows if "openvino_error" in r]
    if args.profile:
        out += [profile_table(r) for r in rows if r.get("profile")]
    out.append("geometric mean of kiln / best peer (rows that compiled and matched): "
               + ", ".join(f"{f} {fmt(g)}" for f, g in s["geomean_by_family"].items())
               + f"; overall {fmt(s['geomean'])} ({s['rows_ok']} of {s['rows']} rows)")
    return "\n".join(out)


def main(args, metas: list[dict]) -> list[dict]:
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))  # read when kiln's first library loads
    args.openvino = args.openvino and openvino_available()
    rows = []
    t0 = time.perf_counter()
    for meta in metas:
        t = time.perf_counter()
        new = bench_model(meta, args)
        rows += new
        for r in new:
            print(f"{r['model']:<20} {r['shape']:<32} kiln {fmt(r.get('kiln_ms'), '.3f'):>9} ms  "
                  f"ort {fmt(r.get('ort_ms'), '.3f'):>9}  ov {fmt(r.get('openvino_ms'), '.3f'):>9}  "
                  f"ratio {fmt(r.get('ratio'))}  {'ok' if r.get('ok') else 'FAIL'}", file=sys.stderr, flush=True)
        print(f"  ({time.perf_counter() - t:.0f} s, {time.perf_counter() - t0:.0f} s in all)", file=sys.stderr)
    print(report(rows, args))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": rows, **summary(rows), "args": {k: v for k, v in vars(args).items()
                                                                  if isinstance(v, (int, float, str, bool, type(None)))},
                       "load": os.getloadavg(), "seconds": time.perf_counter() - t0}, f, indent=1)
    return rows
