"""A model with a symbolic batch dim against the same model with its dims fixed (issue 18).

    python benchmarks/symbolic_batch.py [--only mobilenet_v2,bert_base,...] [--threads 2]

For each corpus model (~/.cache/kiln-corpus; `python -m benchmarks.corpus build`) and its
first case: the file as exported (symbolic batch, and sequence or image dims) and a copy
whose graph inputs carry the case's sizes, both compiled with kiln's default options and
run on the same random inputs. Outputs must agree; the two are timed interleaved
(kiln.bench.time_interleaved) and the ratio symbolic / fixed printed with both medians.
The acceptance is a ratio within 1.05.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
import onnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.corpus.build import corpus_dir, random_feeds  # noqa: E402
from benchmarks.corpus.run import INPUT_SEED  # noqa: E402
from benchmarks.corpus.spec import case_label  # noqa: E402

DEFAULT = "mobilenet_v2,resnet50,efficientnet_b0,bert_base,gpt2,lstm_stacked,transformer_layer,mlp_tabular"


def fixed_copy(path: str, case: dict, out: str) -> None:
    """`path` with every symbolic input dim named in `case` replaced by its size."""
    m = onnx.load(path)
    for v in m.graph.input:
        for d in v.type.tensor_type.shape.dim:
            if d.dim_param in case:
                d.dim_value = int(case[d.dim_param])   # clears dim_param (a oneof)
    onnx.save(m, out)


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=DEFAULT)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=60)
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import json

    import kiln
    from kiln.bench import stats, time_interleaved
    rows = []
    with tempfile.TemporaryDirectory(prefix="kiln-fixed-") as tmp:
        for name in args.only.split(","):
            meta = json.load(open(os.path.join(corpus_dir(), name + ".json")))
            case = meta["cases"][0]
            path = os.path.join(corpus_dir(), name + ".onnx")
            fixed = os.path.join(tmp, name + ".onnx")
            fixed_copy(path, case, fixed)
            feeds = random_feeds(meta["inputs"], case, INPUT_SEED)
            sym, fix = kiln.compile(path), kiln.compile(fixed)
            a, b = sym.run(feeds), fix.run(feeds)
            same = all(np.allclose(a[k], b[k], rtol=1e-4, atol=1e-5) for k in a)
            times = time_interleaved({"symbolic": lambda: sym.run(feeds), "fixed": lambda: fix.run(feeds)},
                                     {"symbolic": args.runs, "fixed": args.runs}, rounds=10)
            s, f = stats(times["symbolic"])["median_ms"], stats(times["fixed"])["median_ms"]
            rows.append({"model": name, "shape": case_label(case), "symbolic_ms": s, "fixed_ms": f,
                         "ratio": s / f, "outputs_agree": same})
            print(f"{name:18s} {case_label(case):28s} symbolic {s:8.3f} ms  fixed {f:8.3f} ms  "
                  f"ratio {s / f:5.3f}  {'agree' if same else 'DIFFER'}", flush=True)
    print(f"load {os.getloadavg()[0]:.1f}; within 5%: {sum(r['ratio'] <= 1.05 for r in rows)} of {len(rows)}")
    return rows


if __name__ == "__main__":
    main()
