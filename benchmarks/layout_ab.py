"""kiln -O3 with and without the layout transformation (transform_layout), against ONNX Runtime.

All three run interleaved in one process (alternating rounds, so machine load hits them
alike) on the same seeded inputs; prints the median and p10 of each, and checks both kiln
builds against ORT. The pass is switched off for one build with KILN_NCHWC=0.

    python benchmarks/layout_ab.py --models resnet18,mobilenetv2 --rounds 20 --per-round 5
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kiln  # noqa: E402
from benchmarks.models import MODELS, inputs_for  # noqa: E402
from kiln.bench import compare, stats, time_interleaved  # noqa: E402


def ort_session(model, threads: int, spin: bool):
    """An ORT CPU session like kiln.bench.ort_session, its intra-op threads spinning or not."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def build(model, layout: bool):
    old = os.environ.pop("KILN_NCHWC", None)
    if not layout:
        os.environ["KILN_NCHWC"] = "0"
    try:
        return kiln.compile(model, target="cpu", opt_level=3, report=True)
    finally:
        os.environ.pop("KILN_NCHWC", None)
        if old is not None:
            os.environ["KILN_NCHWC"] = old


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet18,mobilenetv2")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--per-round", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="ORT intra-op threads")
    ap.add_argument("--ort-spin", action="store_true",
                    help="let ORT's threads spin after a run (its default); off here, as the spinning "
                         "threads took a core from the kiln run interleaved after it (2-core machine: "
                         "kiln medians 20-40%% slower in the slot after ORT)")
    args = ap.parse_args(argv)
    for name in args.models.split(","):
        model = MODELS[name]()
        feeds = inputs_for(name, model)
        nchw, nchwc = build(model, False), build(model, True)
        sess = ort_session(model, args.threads, spin=args.ort_spin)
        out = [o.name for o in model.graph.output]
        want = dict(zip(out, sess.run(None, feeds)))
        checks = {k: compare(m.run(feeds), want) for k, m in (("nchw", nchw), ("nchwc", nchwc))}
        fns = {"kiln -O3 nchw": lambda: nchw.run(feeds), "kiln -O3 nchwc": lambda: nchwc.run(feeds),
               "ort": lambda: sess.run(None, feeds)}
        for f in fns.values():
            f()
        t = time_interleaved(fns, {k: args.rounds * args.per_round for k in fns}, args.rounds)
        s = {k: stats(v) for k, v in t.items()}
        print(f"{name}: kernels {nchw.report.kernels} -> {nchwc.report.kernels}; "
              + "; ".join(f"{k} {v['median_ms']:.2f} ms (p10 {v['p10_ms']:.2f})" for k, v in s.items())
              + f"; max rel err vs ort: nchw {checks['nchw']['max_rel']:.1e}, nchwc {checks['nchwc']['max_rel']:.1e}",
              flush=True)


if __name__ == "__main__":
    main()
