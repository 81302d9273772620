"""Where one corpus model's time goes, kernel by kernel: kiln's kernels at one shape, each
called alone (`CompiledModel.profile`, median of --runs), summed per fused-op combination and
listed heaviest first, beside ONNX Runtime's per-op-kind profile of the same inputs.

    python benchmarks/kernel_profile.py efficientnet_b0 --dims batch=1,height=224,width=224 [--top 30]

Kernel-by-kernel times miss the threads' overlap and include one call's overhead each: read
them as where the time goes, not as the total (see benchmarks/corpus/README.md).

`--warm` adds each kernel's time called --runs times in a row (its weights and inputs then in
cache as far as they fit) beside its time in the model's order, and lists the kernels by the
difference, what the model's memory traffic costs them:

    python benchmarks/kernel_profile.py mobilenet_v3_large --dims batch=1 --warm
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import kiln  # noqa: E402
from benchmarks.corpus.run import ort_profile  # noqa: E402


def feeds_for(path: str, dims: dict) -> dict:
    """Normal float32 inputs (the CNN corpus's are images) with symbolic dims from `dims`."""
    import onnx
    rng = np.random.default_rng(0)
    feeds = {}
    for i in onnx.load(path, load_external_data=False).graph.input:
        shape = [d.dim_value or int(dims.get(d.dim_param, 1)) for d in i.type.tensor_type.shape.dim]
        feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def corpus_path(model: str) -> str:
    """The corpus model's ONNX file ($KILN_CORPUS_DIR, else ~/.cache/kiln-corpus)."""
    return os.path.join(os.environ.get("KILN_CORPUS_DIR", os.path.expanduser("~/.cache/kiln-corpus")), f"{model}.onnx")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--dims", default="batch=1,height=224,width=224", help="symbolic dims: name=size,...")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--threads", type=int, default=2, help="ORT intra-op threads")
    ap.add_argument("--warm", action="store_true", help="also each kernel called --runs times in a row")
    args = ap.parse_args(argv)
    path = corpus_path(args.model)
    dims = dict(kv.split("=") for kv in args.dims.split(",") if kv)
    feeds = feeds_for(path, dims)
    m = kiln.compile(path)
    m.run(feeds)
    prof = m.profile(feeds, runs=args.runs)
    kinds: dict = collections.defaultdict(float)
    for what, s in prof:
        kinds["+".join(dict.fromkeys(re.findall(r"(\w+) node '", what))) or what[:40]] += s
    print(f"kiln: {len(prof)} kernels, {sum(s for _, s in prof) * 1e3:.3f} ms summed")
    for k, s in sorted(kinds.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"  {s * 1e3:8.3f}  {k}")
    print("heaviest kernels:")
    for what, s in sorted(prof, key=lambda x: -x[1])[:args.top]:
        print(f"  {s * 1e3:8.3f}  {what[:160]}")
    if args.warm:
        warm = m.profile(feeds, runs=args.runs, warm=True)
        print(f"in the model's order {sum(s for _, s in prof) * 1e3:.3f} ms, each kernel warm "
              f"{sum(s for _, s in warm) * 1e3:.3f} ms; by the difference (order, warm, ms):")
        pairs = sorted(zip(prof, warm), key=lambda p: p[1][1] - p[0][1])
        for (what, s), (_, w) in pairs[:args.top]:
            print(f"  {s * 1e3:8.3f} {w * 1e3:8.3f} {(s - w) * 1e3:+8.3f}  {what[:140]}")
    ort = ort_profile(path, feeds, args.threads, args.runs)
    print(f"ONNX Runtime: {sum(ort.values()):.3f} ms summed; " +
          ", ".join(f"{k} {v:.3f}" for k, v in sorted(ort.items(), key=lambda kv: -kv[1])))


if __name__ == "__main__":
    main()
