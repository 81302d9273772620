"""Benchmark models built in code with seeded random weights (nothing downloaded).

Each builder writes the graph node by node the way torch.onnx.export (or an older
HuggingFace exporter) emits it — Conv + BatchNormalization unfused, LayerNorm and
GELU as primitive ops, constant Reshape targets — so kiln's passes meet the
patterns they will meet in real exported models. Weight scales follow He/Xavier
init and BatchNorm statistics are non-trivial, so outputs are well-conditioned
(no overflow, no dead activations) and numerical comparisons mean something.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET, IR_VERSION = 17, 8


class _Builder:
    """Accumulates nodes and seeded float32 initializers; names values op_k like an exporter."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.counts: dict[str, int] = {}

    def fresh(self, base: str) -> str:
        k = self.counts.get(base, 0)
        self.counts[base] = k + 1
        return f"{base}_{k}"

    def const(self, value, base: str = "const", dtype=np.float32) -> str:
        name = self.fresh(base)
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def normal(self, shape, std: float, base: str = "weight") -> str:
        return self.const(std * self.rng.standard_normal(shape, dtype=np.float32), base)

    def uniform(self, shape, lo: float, hi: float, base: str) -> str:
        return self.const(self.rng.uniform(lo, hi, shape), base)

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, out: str | None = None, **attrs):
        """Append a node; returns its output name (a list when n_out > 1)."""
        node = self.fresh(op_type)
        outs = [out] if out else [f"{node}_output_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=node, **attrs))
        return outs if n_out > 1 else outs[0]

    def model(self, name: str, inputs, outputs) -> onnx.ModelProto:
        """inputs/outputs: (name, TensorProto elem type, shape) triples."""
        graph = helper.make_graph(self.nodes, name,
                                  [helper.make_tensor_value_info(*i) for i in inputs],
                                  [helper.make_tensor_value_info(*o) for o in outputs],
                                  initializer=self.inits)
        m = helper.make_model(graph, producer_name="kiln-benchmarks",
                              opset_imports=[helper.make_opsetid("", OPSET)])
        m.ir_version = IR_VERSION
        onnx.checker.check_model(m)
        return m

    # layers shared by several models -------------------------------------------------

    def linear(self, x: str, fan_in: int, fan_out: int, std: float | None = None) -> str:
        """MatMul + Add, as torch exports nn.Linear on a 3-D input."""
        w = self.normal((fan_in, fan_out), std or 1 / math.sqrt(fan_in))
        return self.op("Add", [self.op("MatMul", [x, w]), self.normal((fan_out,), 0.02, "bias")])

    def heads(self, x: str, shape: list[int], perm: list[int]) -> str:
        """[b, s, h*d] -> [b, h, s, d] (or [b, h, d, s] for keys)."""
        return self.op("Transpose", [self.op("Reshape", [x, self.const(shape, "shape", np.int64)])],
                       perm=perm)

    def attention(self, q, k, v, scale: float, mask, out_shape: list[int], heads_shape) -> str:
        """Scaled dot-product attention; `mask(scores)` applies the model's masking."""
        q = self.heads(q, heads_shape, [0, 2, 1, 3])
        k = self.heads(k, heads_shape, [0, 2, 3, 1])
        v = self.heads(v, heads_shape, [0, 2, 1, 3])
        s = mask(self.op("Div", [self.op("MatMul", [q, k]), self.const(scale)]))
        ctx = self.op("MatMul", [self.op("Softmax", [s], axis=-1), v])
        ctx = self.op("Transpose", [ctx], perm=[0, 2, 1, 3])
        return self.op("Reshape", [ctx, self.const(out_shape, "shape", np.int64)])


def _bn(g: _Builder, x: str, c: int, gamma=(0.5, 1.5)) -> str:
    """BatchNormalization with statistics far enough from identity that folding matters."""
    return g.op("BatchNormalization",
                [x, g.uniform((c,), *gamma, "bn.weight"), g.normal((c,), 0.1, "bn.bias"),
                 g.normal((c,), 0.1, "bn.running_mean"), g.uniform((c,), 0.5, 2.0, "bn.running_var")],
                epsilon=1e-5, momentum=0.9)


def _conv_bn(g: _Builder, x: str, cin: int, cout: int, k: int, stride: int = 1, group: int = 1,
             gamma=(0.5, 1.5)) -> str:
    """Conv (bias=False, He init) followed by BatchNormalization."""
    fan_in = cin // group * k * k
    w = g.normal((cout, cin // group, k, k), math.sqrt(2 / fan_in), "conv.weight")
    y = g.op("Conv", [x, w], kernel_shape=[k, k], strides=[stride] * 2, pads=[k // 2] * 4,
             dilations=[1, 1], group=group)
    return _bn(g, y, cout, gamma)


def _classifier(g: _Builder, x: str, features: int, classes: int = 1000) -> str:
    """GlobalAveragePool, Flatten, Gemm(transB=1): torchvision's head."""
    x = g.op("Flatten", [g.op("GlobalAveragePool", [x])], axis=1)
    w = g.normal((classes, features), 1 / math.sqrt(features), "fc.weight")
    return g.op("Gemm", [x, w, g.normal((classes,), 0.01, "fc.bias")], out="logits",
                alpha=1.0, beta=1.0, transB=1)


def _image_model(g: _Builder, name: str, batch: int) -> onnx.ModelProto:
    return g.model(name, [("input", TensorProto.FLOAT, [batch, 3, 224, 224])],
                   [("logits", TensorProto.FLOAT, [batch, 1000])])


def mlp(batch: int = 64, seed: int = 0) -> onnx.ModelProto:
    """784-2048-2048-10 with ReLU; Gemm(transB=1) as torch exports nn.Linear on 2-D input."""
    g = _Builder(seed)
    x, dims = "input", [784, 2048, 2048, 10]
    for i, (fi, fo) in enumerate(zip(dims, dims[1:])):
        w = g.normal((fo, fi), math.sqrt(2 / fi), "fc.weight")
        last = i == len(dims) - 2
        x = g.op("Gemm", [x, w, g.normal((fo,), 0.05, "fc.bias")], out="logits" if last else None,
                 alpha=1.0, beta=1.0, transB=1)
        if not last:
            x = g.op("Relu", [x])
    return g.model("mlp", [("input", TensorProto.FLOAT, [batch, 784])],
                   [("logits", TensorProto.FLOAT, [batch, 10])])


def resnet18(batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    """torchvision ResNet-18: BasicBlocks [2, 2, 2, 2], downsample Conv1x1 + BN."""
    g = _Builder(seed)
    x = g.op("Relu", [_conv_bn(g, "input", 3, 64, 7, 2)])
    x = g.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=0)
    cin = 64
    for cout, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
        for s in (stride, 1):
            h = g.op("Relu", [_conv_bn(g, x, cin, cout, 3, s)])
            h = _conv_bn(g, h, cout, cout, 3, gamma=(0.1, 0.4))  # small, as in trained ResNets
            skip = _conv_bn(g, x, cin, cout, 1, s) if (s != 1 or cin != cout) else x
            x, cin = g.op("Relu", [g.op("Add", [h, skip])]), cout
    _classifier(g, x, 512)
    return _image_model(g, "resnet18", batch)


def mobilenetv2(batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    """torchvision MobileNetV2 (width 1.0): inverted residuals, ReLU6 as Clip(0, 6)."""
    g = _Builder(seed)

    def relu6(y):
        return g.op("Clip", [y, g.const(0.0, "min"), g.const(6.0, "max")])

    x, cin = relu6(_conv_bn(g, "input", 3, 32, 3, 2)), 32
    for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                       (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]:
        for i in range(n):
            stride, hidden = (s if i == 0 else 1), cin * t
            h = relu6(_conv_bn(g, x, cin, hidden, 1)) if t != 1 else x
            h = relu6(_conv_bn(g, h, hidden, hidden, 3, stride, group=hidden))
            h = _conv_bn(g, h, hidden, c, 1)
            x, cin = (g.op("Add", [x, h]) if stride == 1 and cin == c else h), c
    x = relu6(_conv_bn(g, x, cin, 1280, 1))
    _classifier(g, x, 1280)
    return _image_model(g, "mobilenetv2", batch)


def _layernorm_primitive(g: _Builder, x: str, hidden: int, eps: float = 1e-12) -> str:
    """LayerNorm as older exporters write it out, for kiln's pattern recognition to find."""
    d = g.op("Sub", [x, g.op("ReduceMean", [x], axes=[-1], keepdims=1)])
    var = g.op("ReduceMean", [g.op("Pow", [d, g.const(2.0)])], axes=[-1], keepdims=1)
    y = g.op("Div", [d, g.op("Sqrt", [g.op("Add", [var, g.const(eps)])])])
    y = g.op("Mul", [y, g.uniform((hidden,), 0.8, 1.2, "ln.weight")])
    return g.op("Add", [y, g.normal((hidden,), 0.05, "ln.bias")])


def _gelu_erf(g: _Builder, x: str) -> str:
    """x * 0.5 * (1 + erf(x / sqrt(2))), as HF BERT exports it."""
    e = g.op("Erf", [g.op("Div", [x, g.const(math.sqrt(2.0))])])
    return g.op("Mul", [g.op("Mul", [x, g.op("Add", [e, g.const(1.0)])]), g.const(0.5)])


def _gelu_tanh(g: _Builder, x: str) -> str:
    """0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))), GPT-2's NewGELU."""
    inner = g.op("Add", [x, g.op("Mul", [g.const(0.044715), g.op("Pow", [x, g.const(3.0)])])])
    t = g.op("Tanh", [g.op("Mul", [g.const(math.sqrt(2 / math.pi)), inner])])
    return g.op("Mul", [g.op("Mul", [g.const(0.5), x]), g.op("Add", [g.const(1.0), t])])


def bert_encoder(batch: int = 1, seq: int = 128, seed: int = 0, layers: int = 6, hidden: int = 384,
                 heads: int = 12, inter: int = 1536, vocab: int = 30522) -> onnx.ModelProto:
    """A BERT encoder shaped like all-MiniLM-L6-v2 (post-LayerNorm, erf GELU, additive mask)."""
    g = _Builder(seed)
    emb = g.op("Gather", [g.normal((vocab, hidden), 0.02, "word_embeddings"), "input_ids"], axis=0)
    tok = g.op("Gather", [g.normal((2, hidden), 0.02, "token_type_embeddings"),
                          g.const(np.zeros((batch, seq)), "token_type_ids", np.int64)], axis=0)
    pos = g.op("Gather", [g.normal((512, hidden), 0.02, "position_embeddings"),
                          g.const(np.arange(seq)[None], "position_ids", np.int64)], axis=0)
    x = _layernorm_primitive(g, g.op("Add", [g.op("Add", [emb, tok]), pos]), hidden)
    m = g.op("Unsqueeze", ["attention_mask", g.const([1, 2], "axes", np.int64)])
    m = g.op("Sub", [g.const(1.0), g.op("Cast", [m], to=TensorProto.FLOAT)])
    ext = g.op("Mul", [m, g.const(-10000.0)])
    head_dim = hidden // heads
    for _ in range(layers):
        q, k, v = (g.linear(x, hidden, hidden) for _ in range(3))
        a = g.attention(q, k, v, math.sqrt(head_dim), lambda s: g.op("Add", [s, ext]),
                        [batch, seq, hidden], [batch, seq, heads, head_dim])
        x = _layernorm_primitive(g, g.op("Add", [g.linear(a, hidden, hidden), x]), hidden)
        f = g.linear(_gelu_erf(g, g.linear(x, hidden, inter)), inter, hidden)
        x = _layernorm_primitive(g, g.op("Add", [f, x]), hidden)
    g.op("Identity", [x], out="last_hidden_state")
    return g.model("bert_encoder",
                   [("input_ids", TensorProto.INT64, [batch, seq]),
                    ("attention_mask", TensorProto.INT64, [batch, seq])],
                   [("last_hidden_state", TensorProto.FLOAT, [batch, seq, hidden])])


def gpt2_decoder(batch: int = 1, seq: int = 128, seed: int = 0, layers: int = 4, hidden: int = 512,
                 heads: int = 8, inner: int = 2048, vocab: int = 8192) -> onnx.ModelProto:
    """A GPT-2-style decoder: pre-LayerNorm, fused qkv + Split, causal Where mask, tied lm head."""
    g = _Builder(seed)
    wte = g.normal((vocab, hidden), 0.02, "wte")
    x = g.op("Add", [g.op("Gather", [wte, "input_ids"], axis=0),
                     g.op("Gather", [g.normal((1024, hidden), 0.01, "wpe"),
                                     g.const(np.arange(seq)[None], "position_ids", np.int64)], axis=0)])
    causal = g.const(np.tril(np.ones((seq, seq)))[None, None], "causal_mask", bool)
    masked = g.const(-1e4)

    def ln(y):
        return g.op("LayerNormalization", [y, g.uniform((hidden,), 0.8, 1.2, "ln.weight"),
                                           g.normal((hidden,), 0.05, "ln.bias")],
                    axis=-1, epsilon=1e-5)

    head_dim, resid_std = hidden // heads, 1 / math.sqrt(2 * layers * hidden)
    for _ in range(layers):
        qkv = g.linear(ln(x), hidden, 3 * hidden)
        q, k, v = g.op("Split", [qkv, g.const([hidden] * 3, "split", np.int64)], n_out=3, axis=2)
        a = g.attention(q, k, v, float(head_dim) ** 0.5, lambda s: g.op("Where", [causal, s, masked]),
                        [batch, seq, hidden], [batch, seq, heads, head_dim])
        x = g.op("Add", [x, g.linear(a, hidden, hidden, resid_std)])
        f = g.linear(_gelu_tanh(g, g.linear(ln(x), hidden, inner)), inner, hidden,
                     1 / math.sqrt(2 * layers * inner))
        x = g.op("Add", [x, f])
    g.op("MatMul", [ln(x), g.op("Transpose", [wte], perm=[1, 0])], out="logits")
    return g.model("gpt2_decoder", [("input_ids", TensorProto.INT64, [batch, seq])],
                   [("logits", TensorProto.FLOAT, [batch, seq, vocab])])


MODELS = {"mlp": mlp, "resnet18": resnet18, "mobilenetv2": mobilenetv2,
          "bert_encoder": bert_encoder, "gpt2_decoder": gpt2_decoder}


def _vocab_size(model: onnx.ModelProto, input_name: str) -> int:
    """Rows of the embedding table that a Gather indexes with this input."""
    inits = {t.name: t for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Gather" and n.input[1] == input_name and n.input[0] in inits:
            return inits[n.input[0]].dims[0]
    raise ValueError(f"no embedding Gather reads {input_name!r}")


def inputs_for(name: str, model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random inputs for `model` (built by MODELS[name]): never all zeros.

    Images and features are standard normal (normalised pixels); token ids are
    uniform over the vocabulary; attention_mask is ones with 1..seq/4 padding
    zeros at the end of each row.
    """
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in model.graph.input:
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        if vi.name == "attention_mask":
            mask = np.ones(shape, np.int64)
            for row, pad in zip(mask, rng.integers(1, shape[-1] // 4 + 1, shape[0])):
                row[-pad:] = 0
            feeds[vi.name] = mask
        elif vi.type.tensor_type.elem_type == TensorProto.INT64:
            feeds[vi.name] = rng.integers(0, _vocab_size(model, vi.name), shape, dtype=np.int64)
        else:
            feeds[vi.name] = rng.standard_normal(shape, dtype=np.float32)
    return feeds
