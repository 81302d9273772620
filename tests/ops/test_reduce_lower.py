"""Native (C) lowerings of the reduction-like families (reduce, softmax, quant, loss,
attention) against their NumPy references.

Every case is a one-node model; all cases of a family are lowered and built as one
C module (cached by source hash), then each kernel runs on random inputs and is
compared with the interpreter.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from onnx import helper, numpy_helper

import kiln
from kiln.codegen import build_c
from kiln.dtypes import DType
from kiln.errors import KilnError
from kiln.interpreter import Interpreter
from kiln.loops import LoopModule
from kiln.lower.kernel import lower_node

F16, F32, F64 = np.float16, np.float32, np.float64
RNG = np.random.default_rng(0)


def rand(shape, dtype=F32, lo=-3.0, hi=3.0):
    """Random non-zero data of `dtype` (integers drawn in [lo, hi])."""
    if np.dtype(dtype).kind in "iu":
        return RNG.integers(max(lo, np.iinfo(dtype).min), hi + 1, shape).astype(dtype)
    if np.dtype(dtype) == np.bool_:
        return RNG.random(shape) < 0.5
    x = RNG.uniform(lo, hi, shape)
    return np.where(np.abs(x) < 1e-3, 0.5, x).astype(dtype)


class Case:
    """One node: inputs (None: absent), which of them are initializers (compile-time
    values), attributes, opset, number of outputs and tolerance."""

    def __init__(self, op, *inputs, consts=(), opset=18, outputs=1, rtol=1e-5, atol=1e-6, domain="", **attrs):
        self.op, self.inputs, self.consts, self.opset, self.domain = op, list(inputs), set(consts), opset, domain
        self.outputs, self.rtol, self.atol, self.attrs = outputs, rtol, atol, attrs

    def __repr__(self):
        shapes = ",".join("-" if x is None else f"{x.dtype}{list(x.shape)}" for x in self.inputs)
        attrs = ",".join(f"{k}={getattr(v, 'name', v)}" for k, v in self.attrs.items())  # a graph: its name
        return f"{self.op}@{self.opset}({shapes}){attrs}"

    @functools.cached_property
    def graph(self):
        names = ["" if x is None else f"x{k}" for k, x in enumerate(self.inputs)]
        vi = [helper.make_tensor_value_info(f"x{k}", helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
              for k, x in enumerate(self.inputs) if x is not None and k not in self.consts]
        inits = [numpy_helper.from_array(np.asarray(self.inputs[k]), f"x{k}") for k in sorted(self.consts)]
        outs = self.outputs if isinstance(self.outputs, list) else [f"y{k}" for k in range(self.outputs)]
        node = helper.make_node(self.op, names, outs, name="n0", domain=self.domain, **self.attrs)
        ovi = [helper.make_empty_tensor_value_info(o) for o in outs if o]
        opsets = [helper.make_opsetid("", self.opset)] + ([helper.make_opsetid(self.domain, 1)] if self.domain else [])
        model = helper.make_model(helper.make_graph([node], "g", vi, ovi, initializer=inits), opset_imports=opsets)
        return kiln.load_onnx(model)

    def lower(self, name):
        node = self.graph.nodes[0]
        values = [np.asarray(self.inputs[k]) if k in self.consts else None for k in range(len(node.inputs))]
        return lower_node(node, self.opset, values, name)

    def run(self, kernel):
        node = self.graph.nodes[0]
        runtime = [x for k, x in enumerate(self.inputs) if x is not None and k not in self.consts]
        want = Interpreter(self.graph).run(runtime)
        args = [np.asarray(x) for x in self.inputs if x is not None]
        bufs = [np.empty(p.shape, p.dtype.np) for p in kernel.func.params[len(args):]]  # absent: scratch
        kernel(*args, *bufs)
        got = [b for b, v in zip(bufs, node.outputs) if v is not None]
        for k, (g, w) in enumerate(zip(got, want)):
            assert g.dtype == w.dtype and g.shape == w.shape, (k, g.dtype, g.shape, w.dtype, w.shape)
            if DType.from_numpy(g.dtype).is_float:  # float8/bfloat16 too (NaNs compared as NaNs)
                np.testing.assert_allclose(g.astype(F64), w.astype(F64), rtol=self.rtol, atol=self.atol,
                                           equal_nan=True, err_msg=f"output {k} of {self}")
            else:
                np.testing.assert_array_equal(g, w, err_msg=f"output {k} of {self}")


def family(cases):
    """Lower all cases into one module (a failing lowering is kept to be raised by its test)."""
    @functools.lru_cache(maxsize=None)
    def built():
        funcs, errors = [], {}
        for k, c in enumerate(cases):
            try:
                funcs.append(c.lower(f"k{k}"))
            except KilnError as e:
                errors[k] = e
        return build_c(LoopModule(funcs)), errors

    def check(k):
        lib, errors = built()
        if k in errors:
            raise errors[k]
        cases[k].run(lib[f"k{k}"])
    return check


def axes(*a):
    return np.array(a, np.int64)


# ---- Reduce*, ArgMax/ArgMin, Softmax/LogSoftmax/Hardmax, CumSum/CumProd ----

X = rand((3, 4, 5))
REDUCE_OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
              "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]
REDUCE = [Case(op, np.abs(X) if op == "ReduceLogSum" else X, axes(*a), consts=[1], keepdims=k)
          for op in REDUCE_OPS for a, k in [((1,), 1), ((0, 2), 0), ((), 1), ((-1,), 0)]]
REDUCE += [
    Case("ReduceSum", X, opset=11, axes=[1], keepdims=0),                 # axes attribute
    Case("ReduceMax", X, opset=13, keepdims=1),                           # all axes
    Case("ReduceSum", X, axes(), consts=[1], noop_with_empty_axes=1),     # identity
    Case("ReduceSum", X, np.zeros(0, np.int64), noop_with_empty_axes=1),  # empty axes at run time
    Case("ReduceSum", rand((256, 1024)), axes(0, 1), consts=[1], keepdims=0),  # parallel partial sums
    Case("ReduceMean", rand((256, 1024)), axes(0), consts=[1]),           # inner spatial loop kept
    Case("ReduceMax", rand((2, 20, 300)), axes(2), consts=[1]),
    Case("ReduceSum", rand((2, 0, 3)), axes(1), consts=[1], keepdims=0),  # empty reductions
    Case("ReduceMean", rand((2, 0, 3)), axes(1), consts=[1]),
    Case("ReduceProd", rand((2, 0, 3)), axes(2), consts=[1]),
    Case("ReduceLogSumExp", rand((2, 0, 3)), axes(1), consts=[1]),
    Case("ReduceMax", rand((3, 4), np.bool_), axes(1), consts=[1], opset=20),
    Case("ReduceSum", rand((4, 6), F16), axes(1), consts=[1], rtol=1e-3),
    Case("ReduceL2", rand((4, 6), F64), axes(0), consts=[1], rtol=1e-12),
]
REDUCE += [Case(op, rand((3, 4, 5), dt, -9, 9), axes(1), consts=[1])
           for op in ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare"]
           for dt in (np.int8, np.int32, np.uint8, np.int64)]
REDUCE += [Case(op, rand((3, 4, 5), dt, 0, 3), opset=13, axis=a, keepdims=k, select_last_index=s)
           for op in ("ArgMax", "ArgMin") for dt in (F32, np.int32, F16)
           for a, k, s in [(0, 1, 0), (1, 0, 1), (-1, 1, 1), (2, 0, 0)]]
_nan = rand((3, 5))
_nan[1, [1, 3]] = np.nan
REDUCE += [Case("ArgMax", _nan, opset=13, axis=1), Case("ArgMin", _nan, opset=13, axis=1, select_last_index=1)]
REDUCE += [Case(op, X.astype(dt) if op != "Hardmax" else rand((3, 4, 5), dt, 0, 2), opset=o, axis=a,
                rtol=1e-3 if dt == F16 else 1e-5)
           for op in ("Softmax", "LogSoftmax", "Hardmax") for dt in (F32, F64, F16)
           for o, a in [(13, -1), (13, 1), (13, 0), (11, 1), (11, 0), (11, 3), (11, -1)]]
BF16 = DType.bfloat16.np
REDUCE += [Case(op, rand((3, 4, 5), BF16), opset=13, axis=1, rtol=1e-2)  # a storage-only dtype
           for op in ("Softmax", "LogSoftmax", "ArgMax")]
REDUCE += [Case(op, rand((3, 4, 5), BF16), axes(1), consts=[1], rtol=1e-2) for op in ("ReduceSum", "ReduceMax")]
REDUCE += [Case("Softmax", rand((2, 4, 128, 128)), opset=13, axis=-1),
           Case("LogSoftmax", rand((2, 4, 8, 64)), opset=13, axis=1)]
REDUCE += [Case(op, rand((3, 4, 5), dt, 1, 3) if dt != F32 else rand((3, 4, 5), dt, 0.5, 1.5),
                np.array(a, np.int32), opset=14 if op == "CumSum" else 26, exclusive=e, reverse=r)
           for op in ("CumSum", "CumProd") for dt in (F32, np.int32, np.int8)
           for a, e, r in [(0, 0, 0), (1, 1, 0), (-1, 0, 1), (2, 1, 1)]]
REDUCE += [Case("CumSum", rand((3, 0, 2)), np.array(1), opset=14),
           Case("CumSum", rand((7,), F16), np.array(0), opset=14, rtol=1e-3)]


@pytest.mark.parametrize("k", range(len(REDUCE)), ids=[repr(c) for c in REDUCE])
def test_reduce_family(k, _check=family(REDUCE)):
    _check(k)


def test_runtime_axes_need_values():
    with pytest.raises(KilnError, match="axes must be known at compile time"):
        Case("ReduceSum", X, axes(1)).lower("k")


def test_cumsum_bad_axis_fails_the_call():
    c = Case("CumSum", rand((2, 3)), np.array(5), opset=14)
    lib = build_c(LoopModule([c.lower("k")]))
    with pytest.raises(KilnError, match=r"axis 5 is out of range \[-2, 1\]"):
        lib["k"](c.inputs[0], np.array(5), np.empty((2, 3), F32))


# ---- QuantizeLinear / DequantizeLinear / DynamicQuantizeLinear ----

XQ = rand((3, 4, 6), F32, -300, 300)
QUANT = []
for _dt in (np.int8, np.uint8, np.int16, np.uint16, np.int32):
    QUANT += [
        Case("QuantizeLinear", XQ, np.array(0.7, F32), np.array(3, _dt), opset=21),
        Case("QuantizeLinear", XQ, rand((4,), F32, 0.5, 2), rand((4,), _dt, 0, 5), opset=21, axis=1),
        Case("QuantizeLinear", XQ, rand((3, 4, 2), F32, 0.5, 2), rand((3, 4, 2), _dt, 0, 5), opset=21,
             axis=-1, block_size=3),
        Case("DequantizeLinear", rand((3, 4, 6), _dt, 0, 100), np.array(0.7, F32), np.array(3, _dt), opset=21),
        Case("DequantizeLinear", rand((3, 4, 6), _dt, 0, 100), rand((6,), F32, 0.5, 2), rand((6,), _dt, 0, 5),
             opset=21, axis=2),
    ]
QUANT += [
    Case("QuantizeLinear", XQ, np.array(0.7, F32), opset=21),                       # uint8, no zero point
    Case("QuantizeLinear", XQ, np.array(0.7, F32), np.array(3, np.uint8), opset=10),
    Case("QuantizeLinear", XQ.astype(F16), np.array(0.7, F16), np.array(-2, np.int8), opset=21),
    Case("QuantizeLinear", np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 1e4, -1e4], F32), np.array(1, F32),
         np.array(0, np.int8), opset=21),                                           # half to even, saturation
    Case("DequantizeLinear", rand((3, 4), np.int8, -100, 100), np.array(0.7, F16), opset=21, rtol=1e-3),
    Case("DequantizeLinear", rand((3, 4), np.int32, -10**6, 10**6), np.array(0.7, F32), opset=13),
]
QUANT += [Case("QuantizeLinear", XQ, np.array(s, F32), opset=21, output_dtype=dt.onnx, **sat)  # narrow targets
          for dt, s, sat in [(DType.int4, 30.0, {}), (DType.uint4, 30.0, {}), (DType.float8e4m3fn, 0.5, {}),
                             (DType.float8e4m3fn, 0.5, {"saturate": 0}), (DType.float8e5m2, 0.01, {}),
                             (DType.float4e2m1, 40.0, {})]]
QUANT += [Case("DynamicQuantizeLinear", x, opset=11, outputs=3)
          for x in (XQ, np.abs(XQ), -np.abs(XQ), np.zeros((0, 3), F32), np.array(2.5, F32), rand((64, 1024)))]


@pytest.mark.parametrize("k", range(len(QUANT)), ids=[repr(c) for c in QUANT])
def test_quant_family(k, _check=family(QUANT)):
    _check(k)


# ---- NegativeLogLikelihoodLoss / SoftmaxCrossEntropyLoss ----

LOSS = []
for _op in ("NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"):
    for _shape in ((3, 5), (2, 5, 3, 2)):
        _x, _t = rand(_shape), rand((_shape[0], *_shape[2:]), np.int64, 0, 4)
        _w = rand((5,), F32, 0.5, 2)
        _out = 2 if _op == "SoftmaxCrossEntropyLoss" else 1
        LOSS += [Case(_op, _x, _t, *w, opset=13, outputs=_out, reduction=r, **ig)
                 for r in ("none", "sum", "mean") for w in ((), (_w,))
                 for ig in ({}, {"ignore_index": 2})]
    LOSS += [Case(_op, rand((3, 5), F64), rand((3,), np.int32, 0, 4), opset=13, rtol=1e-12),
             Case(_op, rand((3, 5), F16), rand((3,), np.int64, 0, 4), opset=13, rtol=1e-3)]
LOSS += [Case("SoftmaxCrossEntropyLoss", rand((4, 7, 5)), rand((4, 5), np.int64, 0, 6), opset=13,
              reduction="none")]


@pytest.mark.parametrize("k", range(len(LOSS)), ids=[repr(c) for c in LOSS])
def test_loss_family(k, _check=family(LOSS)):
    _check(k)


# ---- Attention / RotaryEmbedding ----

def _qkv(b=2, hq=3, hkv=3, s=4, t=6, d=8, dv=8, dt=F32, three=False):
    if three:
        return rand((b, s, hq * d), dt), rand((b, t, hkv * d), dt), rand((b, t, hkv * dv), dt)
    return rand((b, hq, s, d), dt), rand((b, hkv, t, d), dt), rand((b, hkv, t, dv), dt)


_masked_row = np.ones((4, 6), bool)
_masked_row[1] = False
ATTN = [
    Case("Attention", *_qkv(), opset=23),
    Case("Attention", *_qkv(dv=5), opset=23, is_causal=1, scale=0.3),
    Case("Attention", *_qkv(dv=5, three=True), opset=23, q_num_heads=3, kv_num_heads=3),
    Case("Attention", *_qkv(hq=6, hkv=2), opset=23, is_causal=1),                     # GQA
    Case("Attention", *_qkv(hq=4, hkv=1, three=True), opset=23, q_num_heads=4, kv_num_heads=1),
    Case("Attention", *_qkv(), rand((4, 6)), opset=23),                               # float mask
    Case("Attention", *_qkv(), rand((2, 1, 4, 6)) < 0.7, opset=23),                   # bool mask
    Case("Attention", *_qkv(), rand((4, 4)), opset=23),                               # short mask: -inf pad
    Case("Attention", *_qkv(), _masked_row, opset=23),                                # a fully masked row
    Case("Attention", *_qkv(), rand((4, 9)), rand((2, 3, 3, 8)), rand((2, 3, 3, 8)), opset=23, outputs=4,
         is_causal=1),                                                                 # past -> present
    Case("Attention", *_qkv(), None, rand((2, 3, 3, 8)), rand((2, 3, 3, 8)), opset=23,
         outputs=["y", "", "present_value"]),
    Case("Attention", *_qkv(), None, None, None, np.array([3, 6]), opset=24, is_causal=1),  # padded kv
    Case("Attention", *_qkv(), opset=25, left_window_size=1, right_window_size=0),
    Case("Attention", *_qkv(dt=F16), opset=23, rtol=2e-3, atol=1e-3),
    Case("Attention", *_qkv(dt=F64), opset=23, is_causal=1, rtol=1e-10),
    Case("Attention", *_qkv(), opset=23, softmax_precision=10, rtol=1e-3),
    Case("Attention", *_qkv(b=1, hq=2, hkv=2, s=64, t=64, d=32, dv=32), opset=23, is_causal=1, rtol=1e-4),
]
ATTN += [Case("Attention", *_qkv(), rand((4, 6)), opset=23, outputs=4, qk_matmul_output_mode=m, softcap=2.0)
         for m in range(4)]
for _inter in (0, 1):
    for _rd in (0, 4):
        _h = (_rd or 8) // 2
        _attrs = dict(interleaved=_inter, rotary_embedding_dim=_rd)
        ATTN += [Case("RotaryEmbedding", rand((2, 3, 5, 8)), rand((2, 5, _h)), rand((2, 5, _h)), opset=23, **_attrs),
                 Case("RotaryEmbedding", rand((2, 5, 24)), rand((2, 5, _h)), rand((2, 5, _h)), opset=23, num_heads=3,
                      **_attrs),
                 Case("RotaryEmbedding", rand((2, 3, 5, 8)), rand((10, _h)), rand((10, _h)),
                      rand((2, 5), np.int64, 0, 9), opset=23, **_attrs)]
ATTN += [Case("RotaryEmbedding", rand((2, 3, 5, 8), F16), rand((2, 5, 4), F16), rand((2, 5, 4), F16), opset=23)]
_PREVIEW = dict(domain="ai.onnx.preview", opset=26)
ATTN += [Case("FlexAttention", *_qkv(), **_PREVIEW),
         Case("FlexAttention", *_qkv(hq=6, hkv=2, dv=5), scale=0.2, **_PREVIEW),
         Case("FlexAttention", *_qkv(dt=F16), rtol=2e-3, atol=1e-3, **_PREVIEW),
         Case("FlexAttention", *_qkv(dt=F64), rtol=1e-10, **_PREVIEW)]


def _mod_body(*nodes, consts=None):
    """A FlexAttention modifier: x (B, H, L, S) -> y, with constants as Constant nodes."""
    cn = [helper.make_node("Constant", [], [n], value=numpy_helper.from_array(np.asarray(v), n))
          for n, v in (consts or {}).items()]
    io = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.dtype(F32)), list("BHLS"))
          for n in "xy"]
    return helper.make_graph(cn + list(nodes), "mod", io[:1], io[1:])


_N = helper.make_node
_INDEX = dict(c0=np.int64(0), c1=np.int64(1), c2=np.int64(2), c3=np.int64(3), q_shape=np.array([-1, 1]),
              k_shape=np.array([1, -1]))
_POSITIONS = [_N("Shape", ["x"], ["sh"]), _N("Gather", ["sh", "c2"], ["L"]), _N("Gather", ["sh", "c3"], ["S"]),
              _N("Range", ["c0", "L", "c1"], ["qr"]), _N("Reshape", ["qr", "q_shape"], ["qi"]),
              _N("Range", ["c0", "S", "c1"], ["kr"]), _N("Reshape", ["kr", "k_shape"], ["ki"])]
_CAUSAL_SOFTCAP = _mod_body(*_POSITIONS, _N("GreaterOrEqual", ["qi", "ki"], ["mask"]),
                            _N("Div", ["x", "cap"], ["a"]), _N("Tanh", ["a"], ["t"]), _N("Mul", ["t", "cap"], ["c"]),
                            _N("Where", ["mask", "c", "ninf"], ["y"]),
                            consts=dict(_INDEX, cap=F32(1.5), ninf=F32(-np.inf)))
_RELATIVE = _mod_body(*_POSITIONS, _N("Sub", ["qi", "ki"], ["rel"]), _N("Cast", ["rel"], ["relf"], to=1),
                      _N("Mul", ["relf", "slope"], ["b"]), _N("Add", ["x", "b"], ["x2"]), _N("Add", ["x2", "bias"], ["y"]),
                      consts=dict(_INDEX, slope=F32(-0.25), bias=rand((4, 6))))
_PROB = _mod_body(_N("Sqrt", ["x"], ["r"]), _N("Mul", ["r", "half"], ["y"]), consts=dict(half=F32(0.5)))
ATTN += [Case("FlexAttention", *_qkv(), score_mod=_CAUSAL_SOFTCAP, **_PREVIEW),
         Case("FlexAttention", *_qkv(hq=6, hkv=2, dv=5), score_mod=_RELATIVE, prob_mod=_PROB, **_PREVIEW),
         Case("FlexAttention", *_qkv(s=5, t=7), prob_mod=_PROB, **_PREVIEW)]


def _linear(rule, hq=4, hkv=2, t=5, dk=6, dv=3, past=False, per_head=False, dt=F32):
    b = 2
    ins = [rand((b, t, hq * dk), dt, -1, 1), rand((b, t, hkv * dk), dt, -1, 1), rand((b, t, hkv * dv), dt, -1, 1),
           rand((b, hkv, dk, dv), dt, -1, 1) if past else None]
    if "gated" in rule:
        ins.append(rand((b, t, hkv if per_head else hkv * dk), dt, -1, -0.1))
    if "delta" in rule:
        ins += [None] * (5 - len(ins)) + [rand((b, t, hkv), dt, 0.1, 1)]
    return Case("LinearAttention", *ins, opset=27, outputs=2, q_num_heads=hq, kv_num_heads=hkv, update_rule=rule,
                rtol=1e-3 if dt == F16 else 1e-5, atol=1e-3 if dt == F16 else 1e-6)


ATTN += [_linear("linear"), _linear("gated", past=True), _linear("gated", per_head=True), _linear("delta"),
         _linear("gated_delta", hq=2, hkv=2, past=True), _linear("gated_delta", hkv=1, dt=F16)]


@pytest.mark.parametrize("k", range(len(ATTN)), ids=[repr(c) for c in ATTN])
def test_attention_family(k, _check=family(ATTN)):
    _check(k)


def test_attention_mask_wider_than_keys_is_an_error():
    with pytest.raises(KilnError, match="exceeds total sequence length"):
        Case("Attention", *_qkv(), rand((4, 7)), opset=23).lower("k")


@pytest.mark.parametrize("body, message", [
    (_mod_body(_N("TopK", ["x", "k"], ["y", "i"]), consts=dict(k=np.array([6]))), "hand-written kernel"),
    (_mod_body(_N("Add", ["x", "big"], ["y"]), consts=dict(big=rand((2, 3, 8, 8)))), "384 elements"),
])
def test_flex_attention_modifier_that_cannot_be_inlined_is_an_error(body, message):
    with pytest.raises(KilnError, match=f"score_mod: .*{message}"):
        Case("FlexAttention", *_qkv(s=8, t=8), score_mod=body, **_PREVIEW).lower("k")


@pytest.mark.parametrize("case", [
    Case("Softmax", rand((2, 3, 16, 40)), opset=13, axis=-1),
    Case("LogSoftmax", rand((4, 3, 33)), opset=13, axis=-1),
    Case("LayerNormalization", rand((2, 5, 48)), rand((48,)), rand((48,)), consts=(1, 2), opset=17, axis=-1),
    Case("RMSNormalization", rand((3, 7, 64)), rand((64,)), consts=(1,), opset=23, axis=-1),
], ids=repr)
def test_last_axis_normalizations_are_one_loop_over_rows(case):
    """Every statistic lives in a local buffer inside a single (parallel) loop over rows:
    no pass over the whole tensor per stage, no heap temporary; and it is right."""
    func = case.lower("k")
    text = str(func)
    assert "heap" not in text, text
    outer = [line for line in text.splitlines()[1:] if line.startswith("  ") and not line.startswith("   ")]
    assert len([line for line in outer if "for (" in line]) == 1, text
    case.run(build_c(LoopModule([func]))["k"])
