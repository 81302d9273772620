"""Small transformers written the way torch's ONNX exporters write them (no torch needed):
shapes computed in the graph (Shape -> Gather -> Unsqueeze -> Concat -> Reshape), positions
from Range over the sequence length, attention masks built from it, a causal bias Sliced up
to the sequence length (GPT-2), grouped-query heads Expanded from a computed shape and
rotary halves Sliced and Concatenated (Llama), a Gemm over [-1, hidden] rows.
Inputs `input_ids` and `attention_mask` are [batch, seq] int64."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

F = onnx.TensorProto.FLOAT
I64 = onnx.TensorProto.INT64


class _Builder:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.n = [], [], 0

    def w(self, *shape, scale=0.1, base=0.0):
        return self.const((base + scale * self.rng.standard_normal(shape)).astype(np.float32))

    def const(self, data):
        self.n += 1
        name = f"c{self.n}"
        self.inits.append(numpy_helper.from_array(np.asarray(data), name))
        return name

    def ints(self, *values):
        return self.const(np.array(values, np.int64))

    def node(self, op, ins, **attrs):
        self.n += 1
        out = f"t{self.n}"
        self.nodes.append(helper.make_node(op, list(ins), [out], name=f"{op}_{self.n}", **attrs))
        return out

    def dim(self, x, k):
        """Gather(Shape(x), k) as a 1-element vector (what the exporters Unsqueeze)."""
        return self.node("Unsqueeze", [self.dim_scalar(x, k), self.ints(0)])

    def dim_scalar(self, x, k):
        return self.node("Gather", [self.node("Shape", [x]), self.const(np.array(k, np.int64))])

    def model(self, outs, opset=18):
        g = helper.make_graph(self.nodes, "exported_style",
                              [helper.make_tensor_value_info("input_ids", I64, ["batch", "seq"]),
                               helper.make_tensor_value_info("attention_mask", I64, ["batch", "seq"])],
                              [helper.make_tensor_value_info(o, F, None) for o in outs], self.inits)
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _layernorm(b, x, hidden):
    return b.node("LayerNormalization", [x, b.w(hidden, base=1.0), b.w(hidden)], axis=-1, epsilon=1e-5)


def _rmsnorm(b, x, hidden):
    ms = b.node("ReduceMean", [b.node("Pow", [x, b.const(np.float32(2.0))]), b.ints(-1)], keepdims=1)
    inv = b.node("Div", [b.const(np.float32(1.0)), b.node("Sqrt", [b.node("Add", [ms, b.const(np.float32(1e-6))])])])
    return b.node("Mul", [b.w(hidden, base=1.0), b.node("Mul", [x, inv])])


def _heads(b, x, ref, heads, dh):
    """[batch, seq, heads*dh] -> [batch, heads, seq, dh], the target shape computed from `ref`."""
    shape = b.node("Concat", [b.dim(ref, 0), b.dim(ref, 1), b.ints(heads), b.ints(dh)], axis=0)
    return b.node("Transpose", [b.node("Reshape", [x, shape])], perm=[0, 2, 1, 3])


def _merge(b, x, ref):
    """[batch, heads, seq, dh] -> [batch, seq, hidden] with a -1 in the computed target."""
    t = b.node("Transpose", [x], perm=[0, 2, 1, 3])
    return b.node("Reshape", [t, b.node("Concat", [b.dim(ref, 0), b.dim(ref, 1), b.ints(-1)], axis=0)])


def _rotary(b, x, cos, sin, dh):
    half = dh // 2
    x1 = b.node("Slice", [x, b.ints(0), b.ints(half), b.ints(-1)])
    x2 = b.node("Slice", [x, b.ints(half), b.ints(2 ** 63 - 1), b.ints(-1)])
    rot = b.node("Concat", [b.node("Neg", [x2]), x1], axis=-1)
    return b.node("Add", [b.node("Mul", [x, cos]), b.node("Mul", [rot, sin])])


def build(kind: str = "bert", seed: int = 0, vocab: int = 50, hidden: int = 32, heads: int = 4,
          kv_heads: int = 2, layers: int = 2, ffn: int = 64, max_pos: int = 64) -> onnx.ModelProto:
    """`kind`: "bert" (learned positions, padding mask added to the scores), "gpt2" (causal
    bias Sliced up to seq, QKV by one Gemm over [-1, hidden] rows), "llama" (RMSNorm, rotary
    from a position Range, grouped-query heads Expanded, SiLU-gated MLP, causal mask from
    Range comparisons)."""
    b = _Builder(seed)
    dh = hidden // heads
    ids = "input_ids"
    seq = b.dim_scalar(ids, 1)
    pos = b.node("Range", [b.const(np.array(0, np.int64)), seq, b.const(np.array(1, np.int64))])
    x = b.node("Gather", [b.w(vocab, hidden, scale=1.0), ids])
    if kind != "llama":
        x = b.node("Add", [x, b.node("Gather", [b.w(max_pos, hidden, scale=1.0), b.node("Unsqueeze", [pos, b.ints(0)])])])
    # padding mask: [batch, 1, 1, seq], 0 where attended, -1e4 where not
    m = b.node("Cast", [b.node("Unsqueeze", [b.node("Unsqueeze", ["attention_mask", b.ints(1)]), b.ints(2)])], to=F)
    mask = b.node("Mul", [b.node("Sub", [b.const(np.float32(1.0)), m]), b.const(np.float32(-1e4))])
    if kind == "gpt2":   # a causal bias buffer Sliced to [.., :seq, :seq]
        tri = np.tril(np.ones((max_pos, max_pos), bool)).reshape(1, 1, max_pos, max_pos)
        end = b.dim(ids, 1)
        causal = b.node("Slice", [b.node("Slice", [b.const(tri), b.ints(0), end, b.ints(2)]), b.ints(0), end, b.ints(3)])
    elif kind == "llama":  # i >= j from two Ranges, Expanded to [batch, 1, seq, seq]
        rows = b.node("Unsqueeze", [pos, b.ints(1)])
        cols = b.node("Unsqueeze", [pos, b.ints(0)])
        le = b.node("LessOrEqual", [cols, rows])
        shape = b.node("Concat", [b.dim(ids, 0), b.ints(1), b.dim(ids, 1), b.dim(ids, 1)], axis=0)
        causal = b.node("Expand", [b.node("Unsqueeze", [le, b.ints(0, 1)]), shape])
        inv = 1.0 / (10000 ** (np.arange(0, dh, 2, dtype=np.float32) / dh))
        freqs = b.node("Mul", [b.node("Unsqueeze", [b.node("Cast", [pos], to=F), b.ints(1)]), b.const(inv.reshape(1, -1))])
        emb = b.node("Concat", [freqs, freqs], axis=-1)                              # [seq, dh]
        cos = b.node("Unsqueeze", [b.node("Cos", [emb]), b.ints(0, 1)])
        sin = b.node("Unsqueeze", [b.node("Sin", [emb]), b.ints(0, 1)])
    for _ in range(layers):
        h = _rmsnorm(b, x, hidden) if kind == "llama" else x
        if kind == "gpt2":   # Conv1D: rows = Reshape(x, [-1, hidden]), one Gemm, back to [batch, seq, 3*hidden]
            h = _layernorm(b, x, hidden)
            rows = b.node("Reshape", [h, b.ints(-1, hidden)])
            qkv = b.node("Gemm", [rows, b.w(hidden, 3 * hidden), b.w(3 * hidden)])
            back = b.node("Concat", [b.dim(h, 0), b.dim(h, 1), b.ints(3 * hidden)], axis=0)
            qkv = b.node("Reshape", [qkv, back])
            parts = [b.node("Slice", [qkv, b.ints(k * hidden), b.ints((k + 1) * hidden), b.ints(2)]) for k in range(3)]
        else:
            nkv = kv_heads if kind == "llama" else heads
            parts = [b.node("MatMul", [h, b.w(hidden, n * dh)]) for n in (heads, nkv, nkv)]
            if kind == "bert":
                parts = [b.node("Add", [p, b.w(hidden)]) for p in parts]
        q = _heads(b, parts[0], h, heads, dh)
        k = _heads(b, parts[1], h, heads if kind != "llama" else kv_heads, dh)
        v = _heads(b, parts[2], h, heads if kind != "llama" else kv_heads, dh)
        if kind == "llama":
            q, k = _rotary(b, q, cos, sin, dh), _rotary(b, k, cos, sin, dh)
            rep = heads // kv_heads   # [b, kvh, s, d] -> [b, kvh, rep, s, d] -> [b, heads, s, d]
            big = b.node("Concat", [b.dim(h, 0), b.ints(kv_heads), b.ints(rep), b.dim(h, 1), b.ints(dh)], axis=0)
            flat = b.node("Concat", [b.dim(h, 0), b.ints(heads), b.dim(h, 1), b.ints(dh)], axis=0)
            k, v = (b.node("Reshape", [b.node("Expand", [b.node("Unsqueeze", [t, b.ints(2)]), big]), flat]) for t in (k, v))
        s = b.node("Mul", [b.node("MatMul", [q, b.node("Transpose", [k], perm=[0, 1, 3, 2])]),
                           b.const(np.float32(1 / np.sqrt(dh)))])
        if kind != "bert":
            s = b.node("Where", [causal, s, b.const(np.float32(-1e4))])
        s = b.node("Add", [s, mask])
        ctx = _merge(b, b.node("MatMul", [b.node("Softmax", [s], axis=-1), v]), h)
        x = b.node("Add", [x, b.node("MatMul", [ctx, b.w(hidden, hidden)])])
        h = _rmsnorm(b, x, hidden) if kind == "llama" else _layernorm(b, x, hidden)
        if kind == "llama":
            gate = b.node("MatMul", [h, b.w(hidden, ffn)])
            up = b.node("MatMul", [h, b.w(hidden, ffn)])
            act = b.node("Mul", [b.node("Mul", [gate, b.node("Sigmoid", [gate])]), up])
        else:
            up = b.node("Add", [b.node("MatMul", [h, b.w(hidden, ffn)]), b.w(ffn)])
            act = b.node("Mul", [b.node("Mul", [up, b.const(np.float32(0.5))]),
                                 b.node("Add", [b.const(np.float32(1.0)),
                                                b.node("Erf", [b.node("Div", [up, b.const(np.float32(np.sqrt(2)))])])])])
        x = b.node("Add", [x, b.node("MatMul", [act, b.w(ffn, hidden)])])
    out = _rmsnorm(b, x, hidden) if kind == "llama" else _layernorm(b, x, hidden)
    return b.model([out])


def feeds(batch: int, seq: int, seed: int = 0, vocab: int = 50) -> dict:
    """Random ids and a padding mask with some zeros past the first position of each row."""
    rng = np.random.default_rng(seed)
    mask = (rng.random((batch, seq)) > 0.2).astype(np.int64)
    mask[:, 0] = 1
    return {"input_ids": rng.integers(0, vocab, (batch, seq)).astype(np.int64), "attention_mask": mask}
