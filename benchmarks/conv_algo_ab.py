"""Whole models, kiln's conv algorithm chooser against direct convolution only, beside ONNX Runtime.

    python benchmarks/conv_algo_ab.py --only resnet50,unet [--rounds 10] [--per-round 2] [--clock cpu]

Per corpus model and benchmark shape: kiln with its default chooser (kiln.lower.conv_algo),
kiln with `decisions={"conv.algorithm": "direct"}` (every conv direct, as before Winograd),
and ORT (2 intra-op threads), each checked against ORT (rtol 1e-3, atol 1e-4) and timed
interleaved (kiln.bench.time_interleaved); prints the medians, the ratios and the load
average before and after, and how many convs each algorithm ran.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kiln  # noqa: E402
from benchmarks.corpus.build import corpus_dir, random_feeds  # noqa: E402
from benchmarks.corpus.spec import case_label  # noqa: E402
from kiln.bench import compare, ort_session, stats, time_interleaved, time_thread_cpu  # noqa: E402
from kiln.compiler import specialize  # noqa: E402


def algorithms(compiled, feeds) -> Counter:
    """How many convs ran by each algorithm at these input shapes (from the specialised graph)."""
    pipe = compiled.program.pipeline
    shapes = [tuple(feeds[s.name].shape) for s in compiled.inputs]
    g = specialize(pipe.optimized, shapes).graph
    return Counter({"ConvWinograd": "winograd", "ConvNCHWc": "nchwc", "Conv": "nchw"}[n.op]
                   for n in g.nodes if n.op in ("ConvWinograd", "ConvNCHWc", "Conv"))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="resnet50")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--per-round", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="cpu: every engine on one thread, timed by the thread's CPU time (a loaded machine)")
    args = ap.parse_args(argv)
    if args.clock == "cpu":
        os.environ["OMP_NUM_THREADS"] = "1"    # read when kiln's first module loads
        args.threads = 1
    for name in args.only.split(","):
        path = os.path.join(corpus_dir(), name + ".onnx")
        meta = json.load(open(os.path.join(corpus_dir(), name + ".json")))
        auto = kiln.compile(path)
        direct = kiln.compile(path, decisions={"conv.algorithm": "direct"})
        sess = ort_session(path, args.threads)
        names = [o.name for o in sess.get_outputs()]
        for case in meta["cases"]:
            feeds = random_feeds(meta["inputs"], case, 20261125)
            want = dict(zip(names, sess.run(None, feeds)))
            fns = {"kiln": lambda: auto.run(feeds), "kiln-direct": lambda: direct.run(feeds),
                   "ort": lambda: sess.run(None, feeds)}
            checks = {k: compare(fns[k](), want)["ok"] for k in ("kiln", "kiln-direct")}
            load0 = os.getloadavg()[0]
            if args.clock == "cpu":
                t = time_thread_cpu(fns, args.rounds * args.per_round)
            else:
                t = time_interleaved(fns, {k: args.rounds * args.per_round for k in fns}, args.rounds)
            st = {k: stats(v)["median_ms"] for k, v in t.items()}
            print(f"{name} {case_label(case)}: kiln {st['kiln']:.2f} ms | kiln-direct {st['kiln-direct']:.2f} ms "
                  f"| ort {st['ort']:.2f} ms | kiln/direct {st['kiln'] / st['kiln-direct']:.2f} "
                  f"kiln/ort {st['kiln'] / st['ort']:.2f} | match ORT {checks} | convs {dict(algorithms(auto, feeds))} "
                  f"| load {load0:.1f}->{os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
