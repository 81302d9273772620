"""One attention layer, fused (kiln::FusedAttention) against decomposed, and ONNX Runtime.

    python benchmarks/attention.py [--seqs 128,512,2048] [--heads 12] [--dim 64] [--batch 1]
                                   [--mask padding|causal|none] [--threads 2] [--clock wall|cpu]
                                   [--budget 2] [--json PATH]

The model is the decomposed form exporters write after the Q/K/V projections: inputs
[B, S, H * D] reshaped to heads and transposed (K to [B, H, D, S]), MatMul, / sqrt(D), + mask
(a [B, 1, 1, S] padding mask or a [1, 1, S, S] causal mask of float32's min), Softmax, MatMul,
heads merged back. kiln compiles it at -O3 (fused into one kernel) and at -O3 without
`fuse_attention` (the decomposed kernels); each row gives the medians of the three engines
timed interleaved (kiln.bench.time_interleaved), the load average beside them, and memory:
kiln's planned arena (intermediate tensors) for both, and the fused kernel's own scratch
(K and V packed as float: linear in S), against the S x S scores per head the decomposed
graph stores (B * H * S * S floats). `--clock cpu` times the calling thread's CPU time with
one thread for every engine: on a loaded machine the figure that still says something.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("KILN_TIER", "full")   # time the -O3 build, never a quick tier (kiln.codegen.tiers)


def attention_model(b: int, s: int, h: int, d: int, mask: str, seed: int = 0):
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(seed)
    f = TensorProto.FLOAT
    inits = [numpy_helper.from_array(np.array([b, s, h, d], np.int64), "heads"),
             numpy_helper.from_array(np.array([b, s, h * d], np.int64), "merged"),
             numpy_helper.from_array(np.array(np.sqrt(d), np.float32), "root")]
    nodes = [helper.make_node("Reshape", [x, "heads"], [f"{x}4"]) for x in ("q", "k", "v")]
    nodes += [helper.make_node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
              helper.make_node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
              helper.make_node("Transpose", ["v4"], ["vt"], perm=[0, 2, 1, 3]),
              helper.make_node("MatMul", ["qt", "kt"], ["qk"]),
              helper.make_node("Div", ["qk", "root"], ["scores"])]
    inputs = [helper.make_tensor_value_info(x, f, [b, s, h * d]) for x in ("q", "k", "v")]
    if mask == "padding":
        inputs.append(helper.make_tensor_value_info("mask", f, [b, 1, 1, s]))
    elif mask == "causal":
        tri = np.where(np.tril(np.ones((s, s), bool)), 0, np.finfo(np.float32).min).astype(np.float32)
        inits.append(numpy_helper.from_array(tri.reshape(1, 1, s, s), "mask"))
    if mask != "none":
        nodes.append(helper.make_node("Add", ["scores", "mask"], ["masked"]))
    nodes += [helper.make_node("Softmax", ["masked" if mask != "none" else "scores"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "vt"], ["ctx"]),
              helper.make_node("Transpose", ["ctx"], ["ctxt"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ctxt", "merged"], ["y"])]
    graph = helper.make_graph(nodes, "attention", inputs, [helper.make_tensor_value_info("y", f, None)], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    feeds = {x: rng.standard_normal((b, s, h * d)).astype(np.float32) for x in ("q", "k", "v")}
    if mask == "padding":
        pad = np.zeros((b, 1, 1, s), np.float32)
        pad[..., s - s // 8:] = -10000.0   # the last eighth of the keys is padding
        feeds["mask"] = pad
    return m, feeds


def compile_both(model):
    """(fused, unfused) kiln models with reports: -O3, and -O3 without fuse_attention."""
    import kiln
    from kiln.compiler import frontend
    from kiln.passes.pipeline import passes_for, run_passes
    fused = kiln.compile(model, report=True)
    graph, _ = run_passes(frontend(model), passes=[p for p in passes_for(3) if p != "fuse_attention"])
    unfused = kiln.compile(graph, opt_level=0, report=True)
    return fused, unfused


def cpu_times(fns: dict, budget: float) -> dict:
    """Alternating single calls, each timed by the calling thread's CPU clock."""
    import time
    times = {k: [] for k in fns}
    end = time.perf_counter() + budget
    while time.perf_counter() < end or len(times["fused"]) < 5:
        for k, fn in fns.items():
            t = time.thread_time()
            fn()
            times[k].append((time.thread_time() - t) * 1e3)
    return times


def run_case(b: int, s: int, h: int, d: int, mask: str, threads: int, budget: float, clock: str = "wall") -> dict:
    import onnx
    from kiln.bench import compare, ort_session, stats, time_interleaved
    model, feeds = attention_model(b, s, h, d, mask)
    fused, unfused = compile_both(model)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "attention.onnx")
        onnx.save(model, path)
        sess = ort_session(path, threads)
    want = {"y": sess.run(None, feeds)[0]}
    err = {k: compare(m.run(feeds), want) for k, m in (("fused", fused), ("unfused", unfused))}
    fns = {"fused": lambda: fused.run(feeds), "unfused": lambda: unfused.run(feeds),
           "ort": lambda: sess.run(None, feeds)}
    load = os.getloadavg()[0]
    if clock == "cpu":
        times = cpu_times(fns, budget)
    else:
        one = {k: stats(v)["median_ms"] for k, v in time_interleaved(fns, {k: 3 for k in fns}, 3).items()}
        runs = {k: max(5, min(200, int(budget / 3 / max(one[k], 1e-3) * 1e3))) for k in fns}
        times = time_interleaved(fns, runs, max(3, min(runs.values()) // 3))
    med = {k: stats(v)["median_ms"] for k, v in times.items()}
    from kiln.lower.fused_attention import flash_tile
    from kiln.targets.target import Target
    t = flash_tile(Target.host(), d, s)   # the kernel packs K (and V), padded to whole blocks
    skp, dvp = -(-s // t.bk) * t.bk, -(-d // (t.no * t.lanes)) * t.no * t.lanes
    if d % t.lanes == 0 and dvp == d:     # V's rows (contiguous here) read in place: not packed
        dvp = 0
    flops = 2 * b * h * s * s * 2 * d
    return {"batch": b, "seq": s, "heads": h, "dim": d, "mask": mask, "threads": threads, "clock": clock,
            "fused_gflops": flops / med["fused"] / 1e6,
            "load_before": load, "load_after": os.getloadavg()[0],
            "fused_ms": med["fused"], "unfused_ms": med["unfused"], "ort_ms": med["ort"],
            "fused_arena": fused.report.arena_bytes, "unfused_arena": unfused.report.arena_bytes,
            "fused_scratch": b * h * skp * (d + dvp) * 4, "scores_bytes": b * h * s * s * 4,
            "fused_kernels": fused.report.kernels, "unfused_kernels": unfused.report.kernels,
            "max_abs_fused": err["fused"]["max_abs"], "max_abs_unfused": err["unfused"]["max_abs"],
            "ok": err["fused"]["ok"] and err["unfused"]["ok"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", default="128,512,2048")
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--mask", default="padding", choices=["padding", "causal", "none"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    ap.add_argument("--budget", type=float, default=2.0, help="seconds of timing per row")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    threads = 1 if a.clock == "cpu" else a.threads
    os.environ["OMP_NUM_THREADS"] = str(threads)   # before kiln's native code loads
    rows = []
    print(f"({a.batch} x {a.heads} heads x dim {a.dim}, {a.mask} mask, {threads} thread(s), {a.clock} clock)")
    print(f"{'seq':>5} {'fused ms':>9} {'unfused':>9} {'ort':>9} {'f/unf':>6} {'f/ort':>6} "
          f"{'GFLOP/s':>8} {'arena fused':>12} {'arena unfused':>14} {'scratch':>10} {'S*S*H*4':>12} {'load':>10} ok")
    for s in (int(x) for x in a.seqs.split(",")):
        r = run_case(a.batch, s, a.heads, a.dim, a.mask, threads, a.budget, a.clock)
        rows.append(r)
        print(f"{s:5d} {r['fused_ms']:9.3f} {r['unfused_ms']:9.3f} {r['ort_ms']:9.3f} "
              f"{r['fused_ms'] / r['unfused_ms']:6.2f} {r['fused_ms'] / r['ort_ms']:6.2f} {r['fused_gflops']:8.1f} "
              f"{r['fused_arena']:12,d} {r['unfused_arena']:14,d} {r['fused_scratch']:10,d} "
              f"{r['scores_bytes']:12,d} {r['load_before']:4.1f}-{r['load_after']:4.1f} {r['ok']}", flush=True)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
