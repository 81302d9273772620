"""Benchmark: a string pipeline, kiln (target cpu) vs ONNX Runtime, on the same inputs.

    python benchmarks/strings.py [--rows 10000] [--runs 30]

The pipeline normalizes words (StringNormalizer: upper case, a few stopwords removed),
appends a suffix (StringConcat with a constant), tests each against a pattern
(RegexFullMatch) and maps each to an id (LabelEncoder); a second branch counts
unigrams and bigrams of the ids (TfIdfVectorizer) per row. Each round runs kiln then
ORT (interleaved, so load drift hits both alike); reported: median milliseconds of
each and the ratio of medians. Outputs are checked equal first. Time includes moving
strings across each runtime's boundary (Python str -> native and back).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from onnx import TensorProto as TP, helper as oh, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("KILN_TIER", "full")   # time the -O3 build, never a quick tier (kiln.codegen.tiers)

import kiln  # noqa: E402

# ASCII and CJK only: ORT upper-cases with its C locale (é, ß unchanged), kiln as Python does
WORDS = ["the", "Kiln", "compiler", "a", "東京", "model", "fast", "of", "GPU", "strings", "x", "onnx"]


def pipeline(n: int):
    vocab = sorted({w.upper() + "_W" for w in WORDS})
    nodes = [
        oh.make_node("StringNormalizer", ["x"], ["u"], case_change_action="UPPER", locale="C"),
        oh.make_node("StringConcat", ["u", "suffix"], ["s"]),
        oh.make_node("RegexFullMatch", ["s"], ["m"], pattern=r"[A-Z]{2,}(_W)?"),
        oh.make_node("LabelEncoder", ["s"], ["ids"], domain="ai.onnx.ml", keys_strings=vocab,
                     values_int64s=list(range(len(vocab))), default_int64=-1),
        oh.make_node("Reshape", ["ids", "rows"], ["ids2"]),
        oh.make_node("TfIdfVectorizer", ["ids2"], ["tf"], mode="TF", min_gram_length=1, max_gram_length=2,
                     max_skip_count=0, ngram_counts=[0, len(vocab)], ngram_indexes=list(range(len(vocab) + 3)),
                     pool_int64s=list(range(len(vocab))) + [0, 1, 1, 2, 2, 3]),
    ]
    init = [numpy_helper.from_array(np.array(["_W"], dtype=object), "suffix"),
            numpy_helper.from_array(np.array([n // 10, 10], np.int64), "rows")]
    g = oh.make_graph(nodes, "strings", [oh.make_tensor_value_info("x", TP.STRING, [n])],
                      [oh.make_tensor_value_info("m", TP.BOOL, [n]), oh.make_tensor_value_info("ids", TP.INT64, [n]),
                       oh.make_tensor_value_info("tf", TP.FLOAT, None)], init)
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 20), oh.make_opsetid("ai.onnx.ml", 4)], ir_version=10)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10000)
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    import onnxruntime
    n = args.rows // 10 * 10
    model = pipeline(n)
    rng = np.random.default_rng(0)
    x = np.array(rng.choice(np.array(WORDS, dtype=object), n), dtype=object)
    t = time.perf_counter()
    native = kiln.compile(model, target="cpu")
    build_s = time.perf_counter() - t
    sess = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got, want = native.run({"x": x}), sess.run(None, {"x": x})
    for (name, a), b in zip(got.items(), want):
        if a.dtype == object or a.tolist() != b.tolist():
            assert [str(v) for v in a.ravel()] == [str(v) for v in np.asarray(b).ravel()], name
    tk, to = [], []
    for _ in range(args.runs):
        t = time.perf_counter()
        native.run({"x": x})
        tk.append(time.perf_counter() - t)
        t = time.perf_counter()
        sess.run(None, {"x": x})
        to.append(time.perf_counter() - t)
    mk, mo = np.median(tk) * 1e3, np.median(to) * 1e3
    print(f"string pipeline, {n} words: kiln {mk:.3f} ms, onnxruntime {mo:.3f} ms, "
          f"kiln/ort {mk / mo:.2f}x (compile {build_s:.1f} s)")


if __name__ == "__main__":
    main()
