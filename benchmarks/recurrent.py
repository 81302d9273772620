"""The recurrent step at its limit: one LSTM / GRU / RNN layer, kiln vs ONNX Runtime, ns per step.

    python benchmarks/recurrent.py [--threads 2] [--clock wall|cpu] [--json PATH]
    python benchmarks/recurrent.py --case LSTM,bidirectional,80,256,128,1 [--case ...]
    python benchmarks/recurrent.py --corpus lstm_stacked,bilstm [--clock cpu]

At batch 1 a step of a recurrent layer multiplies the state by R (G * H * H floats: 1 MiB for an
LSTM of 256 units) and does little else, so its time is set by how fast R streams from cache:
per row this prints each engine's median ms per inference, kiln / ORT, kiln's ns per step and
direction, and the bytes of R one step reads, as GB/s (R bytes / ns per step), ns per step being the kiln::Recurrent kernel's
alone (kiln's profile: the input projection's GEMM is in the ms, not in the steps). The layers have
constant random weights (as exported models do), so kiln runs them as -O3 does: the input
projection as one GEMM, then kiln::Recurrent (kiln.lower.recurrent). Engines are timed
interleaved (kiln.bench.time_interleaved). `--clock cpu` times the calling thread's CPU time
with one thread for both engines (`--threads` is then 1): on a loaded machine that is the
figure that still says something about the kernel.

The bound: a step must stream R's bytes from wherever R lives, so each row is also held against
the read rate of one core streaming a buffer of R's size over and over (`read_bound`: a C loop of
vector loads into independent sums, as the step's GEMV reads its panels, thread CPU time): "bound
ns" is R bytes at that rate, "k/bound" how far the step is from it. With `--threads N` each
thread streams 1/N of R, so the bound is taken for that share (on its own core's caches).

`--corpus` profiles corpus models (benchmarks/corpus) kernel by kernel instead: per recurrent
layer its kiln::Recurrent kernel alone in ns per step and direction against the bytes of R one
step reads, and the share of the model's time in the input projections' GEMMs (a thread's CPU
time with `--clock cpu`, one thread; wall time otherwise, meaningful on a quiet machine only).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("KILN_TIER", "full")   # time the -O3 build, never a quick tier (kiln.codegen.tiers)

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}

READ_SOURCE = r"""
#include <stdint.h>
#include <string.h>
typedef float V __attribute__((vector_size(LANES * 4)));
/* streams n floats of a `reps` times (the even passes forward, the odd ones backward, as
   kiln::Recurrent's steps read their panels), 8 vectors per iteration into 8 sums */
float read_loop(const float* a, int64_t n, int64_t reps) {
  V s[8] = {{0}};
  for (int64_t r = 0; r < reps; ++r)
    for (int64_t i0 = 0; i0 + 8 * LANES <= n; i0 += 8 * LANES) {
      const int64_t i = r & 1 ? n - 8 * LANES - i0 : i0;
      for (int k = 0; k < 8; ++k) { V v; memcpy(&v, a + i + k * LANES, sizeof v); s[k] += v; }
    }
  float t = 0;
  for (int k = 0; k < 8; ++k) for (int l = 0; l < LANES; ++l) t += s[k][l];
  return t;
}
"""


def read_bound(nbytes: int, seconds: float = 0.2) -> float:
    """GB/s at which one core streams a buffer of `nbytes` again and again (its best of a few
    timings, thread CPU time): the rate a batch-1 step that reads R of that size cannot beat."""
    import ctypes
    import subprocess
    from kiln.targets.target import Target
    lanes = Target.host().vector_lanes(4)
    with tempfile.TemporaryDirectory() as d:
        src, lib = os.path.join(d, "read.c"), os.path.join(d, "read.so")
        with open(src, "w") as f:
            f.write(READ_SOURCE)
        subprocess.run(["cc", "-O2", "-march=native", "-shared", "-fPIC", f"-DLANES={lanes}", src, "-o", lib],
                       check=True)
        fn = ctypes.CDLL(lib).read_loop
        fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
        n = max(8 * lanes, nbytes // 4 // (8 * lanes) * (8 * lanes))
        a = np.random.default_rng(0).random(n).astype(np.float32)
        reps, best = 4, 0.0
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            t = time.thread_time()
            fn(a.ctypes.data, n, reps)
            dt = time.thread_time() - t
            if dt > 2e-3:
                best = max(best, n * 4 * reps / dt / 1e9)
            else:
                reps *= 2
        return best
# (kind, direction, input size, hidden, steps, batch): the corpus' recurrent layers and their neighbours
CASES = [("LSTM", "forward", 80, 64, 50, 1), ("LSTM", "forward", 80, 128, 128, 1),
         ("LSTM", "forward", 80, 256, 128, 1), ("LSTM", "bidirectional", 80, 256, 128, 1),
         ("LSTM", "bidirectional", 512, 256, 512, 1), ("LSTM", "forward", 256, 256, 128, 8),
         ("GRU", "forward", 80, 256, 128, 1), ("GRU", "bidirectional", 80, 384, 128, 1),
         ("RNN", "forward", 80, 512, 128, 1)]


def layer_model(kind: str, direction: str, inp: int, hs: int, seq: int, batch: int, seed: int = 0):
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(seed)
    nd, g = (2 if direction == "bidirectional" else 1), GATES[kind]
    w = (rng.standard_normal((nd, g * hs, inp)) / np.sqrt(inp)).astype(np.float32)
    r = (rng.standard_normal((nd, g * hs, hs)) / np.sqrt(hs)).astype(np.float32)
    b = (rng.standard_normal((nd, 2 * g * hs)) * 0.1).astype(np.float32)
    outs = ["Y", "Y_h"] + (["Y_c"] if kind == "LSTM" else [])
    attrs = dict(direction=direction, hidden_size=hs, **({"linear_before_reset": 1} if kind == "GRU" else {}))
    node = helper.make_node(kind, ["X", "W", "R", "B"], outs, **attrs)
    graph = helper.make_graph(
        [node], kind.lower(), [helper.make_tensor_value_info("X", TensorProto.FLOAT, [seq, batch, inp])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs],
        [numpy_helper.from_array(a, n) for a, n in ((w, "W"), (r, "R"), (b, "B"))])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    m.ir_version = 8
    return m


def run_case(case, threads: int, clock: str, budget: float) -> dict:
    import onnx
    import onnxruntime as ort

    import kiln
    from kiln.bench import compare, stats, time_interleaved
    kind, direction, inp, hs, seq, batch = case
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "layer.onnx")
        onnx.save(layer_model(*case), path)
        cm = kiln.compile(path)
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((seq, batch, inp)).astype(np.float32)
    feeds = {"X": x}
    check = compare(cm.run(feeds), dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds))))
    fns = {"kiln": lambda: cm.run(feeds), "ort": lambda: sess.run(None, feeds)}
    if clock == "cpu":
        times = {k: [] for k in fns}
        end = time.perf_counter() + budget * 2
        while time.perf_counter() < end or len(times["kiln"]) < 5:
            for k, fn in fns.items():
                t = time.thread_time()
                fn()
                times[k].append((time.thread_time() - t) * 1e3)
    else:
        t0 = time.perf_counter()
        fns["kiln"]()
        one = max(time.perf_counter() - t0, 1e-4)
        n = int(min(50, max(5, budget / one)))
        times = time_interleaved(fns, {"kiln": n, "ort": n}, 5)
    k, o = stats(times["kiln"])["median_ms"], stats(times["ort"])["median_ms"]
    nd = 2 if direction == "bidirectional" else 1
    r_bytes = GATES[kind] * hs * hs * 4
    rec_ms = 1e3 * sum(s for what, s in kernel_profile(cm, feeds, clock, 10) if "Recurrent" in what)
    ns_step = rec_ms * 1e6 / (seq * nd)
    share = r_bytes * nd // max(1, threads)       # what one thread streams per step (all directions)
    bound_ns = share / read_bound(share) / nd     # per step and direction, as ns_step
    return {"bound_ns": bound_ns, "over_bound": ns_step / bound_ns, "case": f"{kind} {direction} in={inp} H={hs} seq={seq} batch={batch}", "kiln_ms": k, "ort_ms": o,
            "ratio": k / o, "kiln_ns_per_step": ns_step, "r_bytes": r_bytes, "gb_per_s": r_bytes / ns_step,
            "ok": bool(check["ok"]), "threads": threads, "clock": clock}


def kernel_profile(cm, feeds: dict, clock: str, runs: int) -> list:
    """kiln's profile of `cm`: (kernel, median seconds) each called alone, with clock "cpu"
    the calling thread's CPU time."""
    clock_fn = time.perf_counter
    if clock == "cpu":
        time.perf_counter = time.thread_time    # the profile reads this clock
    try:
        return cm.profile(feeds, runs=runs)
    finally:
        time.perf_counter = clock_fn


def corpus_rows(name: str, clock: str, runs: int) -> list[dict]:
    """Per case of corpus model `name`: each kiln::Recurrent kernel's ns per step and direction
    and R bytes, and the input projections' and the whole model's kernel ms (kiln.profile)."""
    import onnx

    import kiln
    from benchmarks.corpus.build import corpus_dir, random_feeds
    from benchmarks.corpus.spec import case_label
    with open(os.path.join(corpus_dir(), name + ".json")) as f:
        meta = json.load(f)
    path = os.path.join(corpus_dir(), name + ".onnx")
    proto = onnx.load(path)
    inits = {t.name: t.dims for t in proto.graph.initializer}
    layers = []   # (kind, nd, G * H * H * 4): the model's recurrent nodes in order
    for node in proto.graph.node:
        if node.op_type in GATES:
            nd, gh, hs = inits[node.input[2]]
            layers.append((node.op_type, nd, gh * hs * 4))
    rows = []
    for case in meta["cases"]:
        feeds = random_feeds(meta["inputs"], case, 7)
        m = kiln.compile(path)
        m.run(feeds)
        prof = kernel_profile(m, feeds, clock, runs)
        steps = case.get("seq")
        rec = [s for what, s in prof if "Recurrent" in what]
        proj = sum(s for what, s in prof if "input_projection" in what)
        total = sum(s for _, s in prof)
        for i, s in enumerate(rec):
            kind, nd, r_bytes = layers[i] if i < len(layers) else ("?", 1, 0)
            ns = s * 1e9 / (steps * nd)
            rows.append({"model": name, "case": case_label(case), "layer": i, "kind": kind, "dirs": nd,
                         "ns_per_step": ns, "r_bytes": r_bytes, "gb_per_s": r_bytes / ns,
                         "recurrent_ms": s * 1e3, "projection_ms": proj * 1e3, "model_ms": total * 1e3})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    ap.add_argument("--budget", type=float, default=1.0, help="seconds per engine per case (about)")
    ap.add_argument("--case", action="append", help="kind,direction,input,hidden,steps,batch")
    ap.add_argument("--corpus", help="corpus models to profile kernel by kernel (comma separated)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    threads = 1 if args.clock == "cpu" else args.threads
    os.environ["OMP_NUM_THREADS"] = str(threads)   # before kiln's native code loads
    if args.corpus:
        print(f"{'model':<14} {'case':<18} {'layer':>5} {'kind':>4} {'dirs':>4} {'ns/step':>8} {'R KiB':>6} "
              f"{'GB/s':>6} {'rec ms':>7} {'proj ms':>7} {'all ms':>7}   ({threads} thread"
              f"{'s' * (threads > 1)}, {args.clock} clock, load {os.getloadavg()[0]:.1f})")
        rows = []
        for name in args.corpus.split(","):
            for r in corpus_rows(name, args.clock, max(5, int(args.budget * 10))):
                rows.append(r)
                print(f"{r['model']:<14} {r['case']:<18} {r['layer']:5d} {r['kind']:>4} {r['dirs']:4d} "
                      f"{r['ns_per_step']:8.0f} {r['r_bytes'] / 1024:6.0f} {r['gb_per_s']:6.1f} "
                      f"{r['recurrent_ms']:7.3f} {r['projection_ms']:7.3f} {r['model_ms']:7.3f}", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"results": rows}, f, indent=1)
        return 0
    cases = [tuple(int(v) if v.isdigit() else v for v in c.split(",")) for c in args.case] if args.case else CASES
    print(f"{'layer':<48} {'kiln ms':>9} {'ort ms':>9} {'k/ort':>6} {'ns/step':>9} {'R KiB':>7} {'GB/s':>6} "
          f"{'bound ns':>8} {'k/bound':>7}  ok"
          f"   ({threads} thread{'s' * (threads > 1)}, {args.clock} clock, load {os.getloadavg()[0]:.1f})")
    rows = []
    for case in cases:
        r = run_case(case, threads, args.clock, args.budget)
        rows.append(r)
        print(f"{r['case']:<48} {r['kiln_ms']:9.3f} {r['ort_ms']:9.3f} {r['ratio']:6.2f} {r['kiln_ns_per_step']:9.0f} "
              f"{r['r_bytes'] / 1024:7.0f} {r['gb_per_s']:6.1f} {r['bound_ns']:8.0f} {r['over_bound']:7.2f}  "
              f"{'yes' if r['ok'] else 'NO'}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": rows}, f, indent=1)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
