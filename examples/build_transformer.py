"""Small models with symbolic batch and sequence dims, seeded random weights (nothing downloaded):
a BERT-like encoder (embedding gather, layer norm, multi-head attention, GELU feed-forward,
residuals) and an MLP classifier. Used by the shape-generic tests and benchmarks.

Usage: python examples/build_transformer.py [OUT.onnx]
"""

from __future__ import annotations

import sys

import numpy as np
import onnx
from onnx import helper, numpy_helper

F, I64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64


def build_encoder(seed: int = 0, batch: int | str = "batch", seq: int | str = "seq", vocab: int = 100,
                  hidden: int = 64, heads: int = 4, ffn: int = 256, layers: int = 2) -> onnx.ModelProto:
    """ids [batch, seq] (int64) -> hidden states [batch, seq, hidden]."""
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def w(name, *shape, scale=0.1, base=0.0):
        inits.append(numpy_helper.from_array((base + rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    def c(name, values, dtype=np.int64):
        inits.append(numpy_helper.from_array(np.asarray(values, dtype), name))
        return name

    def node(op, ins, out, **attrs):
        nodes.append(helper.make_node(op, ins, [out], name=out, **attrs))
        return out

    dh = hidden // heads
    c("split_heads", [0, 0, heads, dh])
    c("merge_heads", [0, 0, hidden])
    inits.append(numpy_helper.from_array(np.array(1 / np.sqrt(dh), np.float32), "scale"))
    inits.append(numpy_helper.from_array(np.array(np.sqrt(0.5), np.float32), "rsqrt2"))
    inits.append(numpy_helper.from_array(np.array(1.0, np.float32), "one"))
    inits.append(numpy_helper.from_array(np.array(0.5, np.float32), "half"))
    x = node("Gather", [w("emb", vocab, hidden, scale=1.0), "ids"], "embed")
    x = node("Add", [x, w("pos", hidden, scale=0.1)], "embed_pos")
    for k in range(layers):
        p = f"l{k}_"
        h = node("LayerNormalization", [x, w(p + "ln1_g", hidden, base=1.0), w(p + "ln1_b", hidden)], p + "ln1",
                 axis=-1)

        def proj(src, name, n_out, n_in=hidden):
            y = node("MatMul", [src, w(p + name + "_w", n_in, n_out, scale=1 / np.sqrt(n_in))], p + name + "_mm")
            return node("Add", [y, w(p + name + "_b", n_out)], p + name)
        q = node("Transpose", [node("Reshape", [proj(h, "q", hidden), "split_heads"], p + "q4")], p + "qt",
                 perm=[0, 2, 1, 3])
        kt = node("Transpose", [node("Reshape", [proj(h, "k", hidden), "split_heads"], p + "k4")], p + "kt",
                  perm=[0, 2, 3, 1])
        v = node("Transpose", [node("Reshape", [proj(h, "v", hidden), "split_heads"], p + "v4")], p + "vt",
                 perm=[0, 2, 1, 3])
        s = node("Mul", [node("MatMul", [q, kt], p + "qk"), "scale"], p + "scores")
        a = node("Softmax", [s], p + "probs", axis=-1)
        ctx = node("MatMul", [a, v], p + "ctx")
        ctx = node("Reshape", [node("Transpose", [ctx], p + "ctx_t", perm=[0, 2, 1, 3]), "merge_heads"],
                   p + "ctx_m")
        x = node("Add", [x, proj(ctx, "o", hidden)], p + "res1")
        h = node("LayerNormalization", [x, w(p + "ln2_g", hidden, base=1.0), w(p + "ln2_b", hidden)], p + "ln2",
                 axis=-1)
        f = proj(h, "f1", ffn)
        # GELU as exported from PyTorch: x * 0.5 * (1 + erf(x / sqrt(2)))
        g = node("Mul", [node("Mul", [f, node("Add", [node("Erf", [node("Mul", [f, "rsqrt2"], p + "g0")], p + "g1"),
                                                      "one"], p + "g2")], p + "g3"), "half"], p + "gelu")
        x = node("Add", [x, proj(g, "f2", hidden, ffn)], p + "res2")
    graph = helper.make_graph(nodes, "encoder", [helper.make_tensor_value_info("ids", I64, [batch, seq])],
                              [helper.make_tensor_value_info(x, F, [batch, seq, hidden])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def build_mlp(seed: int = 0, batch: int | str = "batch", features: int = 64, hidden: int = 128,
              classes: int = 10) -> onnx.ModelProto:
    """x [batch, features] -> class probabilities [batch, classes]: Gemm-ReLU-MatMul-Add-Softmax."""
    rng = np.random.default_rng(seed)

    def w(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32), name)
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1, name="fc1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["m"], name="fc2"),
        helper.make_node("Add", ["m", "b2"], ["logits"], name="bias2"),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1, name="softmax"),
    ]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", F, [batch, features])],
                              [helper.make_tensor_value_info("probs", F, [batch, classes])],
                              [w("w1", hidden, features), w("b1", hidden), w("w2", hidden, classes), w("b2", classes)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "encoder.onnx"
    onnx.save(build_encoder(), out)
    print(f"wrote {out}")
