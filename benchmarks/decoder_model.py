"""A Llama-style decoder with past key/values, built as ONNX with seeded random weights.

The graph is what a decoder exported with `use_cache` looks like, written node by node:
token embedding (Gather), per layer RMSNorm as primitive ops (Pow, ReduceMean, Add, Sqrt,
Reciprocal, Mul), Q/K/V projections split into heads (Reshape + Transpose), rotary
embeddings from a cos/sin table gathered by `position_ids` (rotate_half as Slice, Neg,
Concat), grouped-query attention as the ONNX `Attention` op (opset 23) with `past_key` /
`past_value` inputs and `present_key` / `present_value` outputs, a SiLU-gated MLP
(Sigmoid, Mul) and the LM head. Nothing is downloaded.

    inputs:  input_ids [batch, seq] int64, position_ids [batch, seq] int64,
             past_key_values.<i>.key / .value [batch, kv_heads, past, head_dim] float32
    outputs: logits [batch, seq, vocab], present.<i>.key / .value [batch, kv_heads, total, head_dim]
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from benchmarks.models import _Builder

OPSET = 23


def _rmsnorm(g: _Builder, x: str, hidden: int, eps: float) -> str:
    sq = g.op("Pow", [x, g.const(2.0, "two")])
    mean = g.op("ReduceMean", [sq, g.const([-1], "axes", np.int64)], keepdims=1)
    inv = g.op("Reciprocal", [g.op("Sqrt", [g.op("Add", [mean, g.const(eps, "eps")])])])
    return g.op("Mul", [g.op("Mul", [x, inv]), g.uniform((hidden,), 0.8, 1.2, "norm_weight")])


def _heads(g: _Builder, x: str, heads: int, dim: int) -> str:
    """[B, S, heads * dim] -> [B, heads, S, dim]."""
    r = g.op("Reshape", [x, g.const([0, 0, heads, dim], "shape", np.int64)])
    return g.op("Transpose", [r], perm=[0, 2, 1, 3])


def _rotary(g: _Builder, x: str, cos: str, sin: str, dim: int) -> str:
    """x * cos + rotate_half(x) * sin, rotate_half(x) = concat(-x[..., d/2:], x[..., :d/2])."""
    half = dim // 2
    axis = g.const([-1], "axis", np.int64)
    lo = g.op("Slice", [x, g.const([0], "start", np.int64), g.const([half], "end", np.int64), axis])
    hi = g.op("Slice", [x, g.const([half], "start", np.int64), g.const([dim], "end", np.int64), axis])
    rot = g.op("Concat", [g.op("Neg", [hi]), lo], axis=-1)
    return g.op("Add", [g.op("Mul", [x, cos]), g.op("Mul", [rot, sin])])


def _merge(g: _Builder, x: str, heads: int, dim: int) -> str:
    """[B, heads, S, dim] -> [B, S, heads * dim]."""
    t = g.op("Transpose", [x], perm=[0, 2, 1, 3])
    return g.op("Reshape", [t, g.const([0, 0, heads * dim], "shape", np.int64)])


def llama_decoder(layers: int = 2, hidden: int = 256, heads: int = 8, kv_heads: int = 2,
                  intermediate: int = 688, vocab: int = 1024, max_positions: int = 2048,
                  eps: float = 1e-5, theta: float = 10000.0, seed: int = 0,
                  attention: str = "onnx") -> onnx.ModelProto:
    """The decoder (see the module docstring); head_dim = hidden / heads.

    attention="gqa": the same weights (same seed) with ONNX Runtime's contrib
    GroupQueryAttention in place of Attention, the form onnxruntime-genai runs Llama with:
    past/present [batch, kv_heads, max, head_dim] one shared buffer of `max` rows, inputs
    seqlens_k int32 [batch] (the filled rows after this step, minus 1) and
    total_sequence_length int32 []. For benchmarking ORT's best decode path only."""
    g = _Builder(seed)
    dim = hidden // heads
    inv_freq = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    angles = np.outer(np.arange(max_positions), inv_freq)
    angles = np.concatenate([angles, angles], axis=-1)
    cos_t, sin_t = g.const(np.cos(angles), "cos_table"), g.const(np.sin(angles), "sin_table")
    x = g.op("Gather", [g.normal((vocab, hidden), 1.0, "embed_tokens"), "input_ids"])
    one = g.const([1], "axis", np.int64)
    cos = g.op("Unsqueeze", [g.op("Gather", [cos_t, "position_ids"]), one])   # [B, 1, S, dim]
    sin = g.op("Unsqueeze", [g.op("Gather", [sin_t, "position_ids"]), one])
    std = 1.0 / np.sqrt(hidden)
    cache_in, cache_out = [], []
    for i in range(layers):
        h = _rmsnorm(g, x, hidden, eps)
        q = _heads(g, g.op("MatMul", [h, g.normal((hidden, heads * dim), std, "q_proj")]), heads, dim)
        k = _heads(g, g.op("MatMul", [h, g.normal((hidden, kv_heads * dim), std, "k_proj")]), kv_heads, dim)
        v = g.op("MatMul", [h, g.normal((hidden, kv_heads * dim), std, "v_proj")])
        q, k = _rotary(g, q, cos, sin, dim), _rotary(g, k, cos, sin, dim)
        pk, pv = f"past_key_values.{i}.key", f"past_key_values.{i}.value"
        ok, ov = f"present.{i}.key", f"present.{i}.value"
        if attention == "gqa":
            y = g.op("GroupQueryAttention", [_merge(g, q, heads, dim), _merge(g, k, kv_heads, dim), v, pk, pv,
                                             "seqlens_k", "total_sequence_length"], n_out=3,
                     domain="com.microsoft", num_heads=heads, kv_num_heads=kv_heads)
            g.nodes[-1].output[1:] = [ok, ov]
            y = y[0]
        else:
            y = g.op("Attention", [q, k, _heads(g, v, kv_heads, dim), "", pk, pv], n_out=3, is_causal=1)
            g.nodes[-1].output[1:] = [ok, ov]
            y = _merge(g, y[0], heads, dim)
        x = g.op("Add", [x, g.op("MatMul", [y, g.normal((heads * dim, hidden), std, "o_proj")])])
        h = _rmsnorm(g, x, hidden, eps)
        gate = g.op("MatMul", [h, g.normal((hidden, intermediate), std, "gate_proj")])
        up = g.op("MatMul", [h, g.normal((hidden, intermediate), std, "up_proj")])
        act = g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate])]), up])
        x = g.op("Add", [x, g.op("MatMul", [act, g.normal((intermediate, hidden), 1.0 / np.sqrt(intermediate),
                                                              "down_proj")])])
        shape = ["batch", kv_heads, "max" if attention == "gqa" else "past", dim]
        cache_in += [(pk, TensorProto.FLOAT, shape), (pv, TensorProto.FLOAT, shape)]
        total = ["batch", kv_heads, "max" if attention == "gqa" else "total", dim]
        cache_out += [(ok, TensorProto.FLOAT, total), (ov, TensorProto.FLOAT, total)]
    x = _rmsnorm(g, x, hidden, eps)
    logits = g.op("MatMul", [x, g.normal((hidden, vocab), std, "lm_head")], out="logits")
    ids = [("input_ids", TensorProto.INT64, ["batch", "seq"]), ("position_ids", TensorProto.INT64, ["batch", "seq"])]
    if attention == "gqa":
        cache_in += [("seqlens_k", TensorProto.INT32, ["batch"]), ("total_sequence_length", TensorProto.INT32, [])]
    graph = helper.make_graph(g.nodes, "llama_decoder",
                              [helper.make_tensor_value_info(*t) for t in ids + cache_in],
                              [helper.make_tensor_value_info(*t) for t in
                               [(logits, TensorProto.FLOAT, ["batch", "seq", vocab])] + cache_out],
                              initializer=g.inits)
    opsets = [helper.make_opsetid("", OPSET)] + ([helper.make_opsetid("com.microsoft", 1)] if attention == "gqa" else [])
    m = helper.make_model(graph, producer_name="kiln-benchmarks", opset_imports=opsets)
    m.ir_version = 10
    onnx.checker.check_model(m)
    return m


def empty_cache(model: onnx.ModelProto, batch: int = 1) -> dict[str, np.ndarray]:
    """Zero-length past key/values for every past input of `model` (the first step's)."""
    out = {}
    for i in model.graph.input:
        dims = [d.dim_value for d in i.type.tensor_type.shape.dim]
        if len(dims) == 4 and i.type.tensor_type.elem_type == TensorProto.FLOAT:
            out[i.name] = np.zeros((batch, dims[1], 0, dims[3]), np.float32)
    return out


def hf_llama_decoder(layers: int = 2, hidden: int = 64, heads: int = 4, kv_heads: int = 2,
                     intermediate: int = 96, vocab: int = 97, max_positions: int = 2048, seed: int = 0,
                     exporter: str = "torchscript", opset: int = 17) -> onnx.ModelProto:
    """transformers' LlamaForCausalLM (random weights from a LlamaConfig, no hub) exported by
    torch.onnx.export with its cache as plain tensors, as users export a decoder: the past
    key/values `past_key_values.<i>.key/.value` [batch, kv_heads, past, head_dim] concatenated
    onto the new ones into `present.<i>.key/.value`, positions and the causal mask computed
    from the past length and `attention_mask` [batch, past + seq]. `exporter`: "torchscript"
    (dynamo=False) or "dynamo". Traced at past length 3 (the Concat path of the cache)."""
    import io

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.cache_utils import DynamicCache

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      max_position_embeddings=max_positions)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()

    class WithCache(torch.nn.Module):
        """forward(ids, mask, positions, *past) -> (logits, *presents): the cache as tensors."""

        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, position_ids, *past):
            cache = DynamicCache(config=cfg)
            for i in range(layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             past_key_values=cache, use_cache=True, return_dict=True)
            layers_out = out.past_key_values.layers
            return (out.logits, *[t for layer in layers_out for t in (layer.keys, layer.values)])

    dim = hidden // heads
    past_len, seq = 3, 2
    args = (torch.randint(0, vocab, (1, seq)), torch.ones(1, past_len + seq, dtype=torch.int64),
            torch.arange(past_len, past_len + seq)[None],
            *[torch.randn(1, kv_heads, past_len, dim) for _ in range(2 * layers)])
    past = [f"past_key_values.{i}.{k}" for i in range(layers) for k in ("key", "value")]
    present = [f"present.{i}.{k}" for i in range(layers) for k in ("key", "value")]
    names = ["input_ids", "attention_mask", "position_ids"] + past
    buf = io.BytesIO()
    with torch.no_grad():
        if exporter == "torchscript":
            axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "total"},
                    "position_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"},
                    **{n: {0: "batch", 2: "past"} for n in past}, **{n: {0: "batch", 2: "total"} for n in present}}
            torch.onnx.export(WithCache(), args, buf, input_names=names, output_names=["logits"] + present,
                              dynamic_axes=axes, opset_version=opset, dynamo=False)
        elif exporter == "dynamo":
            b, s, p, t = (torch.export.Dim(n) for n in ("batch", "seq", "past", "total"))
            shapes = ({0: b, 1: s}, {0: b, 1: t}, {0: b, 1: s}, tuple({0: b, 2: p} for _ in past))
            prog = torch.onnx.export(WithCache(), args, input_names=names, output_names=["logits"] + present,
                                     dynamic_shapes=shapes, opset_version=opset, dynamo=True)
            return prog.model_proto
        else:
            raise ValueError(f"exporter must be 'torchscript' or 'dynamo', got {exporter!r}")
    return onnx.load_from_string(buf.getvalue())
