"""Mutation fuzzing: valid models and artifacts, broken on purpose, must fail cleanly.

An ONNX file or a `.kiln` artifact is untrusted input. This harness takes valid
seeds and breaks them the ways an attacker (or a buggy exporter) would:

- models: attribute values (edge and huge ints, NaN/inf floats, wrong types,
  dropped or invented attributes), declared input dims and dtypes, initializer
  dims, dtypes, values and bytes, op types swapped, inputs dropped, renamed or
  added, outputs dropped, domains and opsets changed, names with control
  characters, and the run-time input arrays (extreme values, other shapes and
  dtypes);
- artifacts: manifest fields (deleted, retyped, edge values), members
  truncated, garbled, dropped or added, and the zip itself cut.

Each case runs in a sandboxed subprocess (kiln.testing.sandbox: time and memory
limits) that imports the model, compiles it (target cpu or interpreter) and
runs it, or loads and runs the artifact. The outcome must be `ok` or a
`KilnError`; an other exception, a crash (signal) or a hang fails.

    kiln fuzz-mutate --models 200 --artifacts 50 --seed 0      # a quick budget
    kiln fuzz-mutate --hours 4 --corpus all --out fuzz-out      # a long run

Seed corpora: `builtin` (23 small models over the ops an attacker aims at), `onnx`
(the ~1,900 ONNX backend node models), `generated` (100 random valid graphs of the
differential fuzzer, kiln.testing.fuzz_graphs), `all` (the three).

Failing cases are written to `--out` (the mutated .onnx or .kiln plus a JSON
line saying which seed, which mutations and what happened), so each one can be
replayed with `kiln run`.
"""

from __future__ import annotations

import copy
import json
import os
import time
import warnings
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from kiln.testing.sandbox import OUTCOMES, Outcome, Sandbox

A = onnx.AttributeProto
INTERESTING_INTS = [0, 1, -1, 2, 3, -2, 7, 255, 256, 65535, 2 ** 31 - 1, -2 ** 31, 2 ** 32, 10 ** 6,
                    10 ** 12, 2 ** 62, 2 ** 63 - 1, -2 ** 63]
INTERESTING_FLOATS = [0.0, -0.0, 1.0, -1.0, 0.5, 1e-38, 1e38, -1e38, float("inf"), float("-inf"), float("nan"),
                      3.4e38, 1e300]
CONTROL = ["\x1b[2J", "\x1b]0;pwned\x07", "\n", "\r", "\x00", "\u202e", "\x7f", "%s%n", "'\"`;$(id)"]
DTYPES = [T.FLOAT, T.UINT8, T.INT8, T.UINT16, T.INT16, T.INT32, T.INT64, T.STRING, T.BOOL, T.FLOAT16,
          T.DOUBLE, T.UINT32, T.UINT64, T.COMPLEX64, T.BFLOAT16, T.FLOAT8E4M3FN, T.INT4, 0, 99]
ATTR_NAMES = ["axis", "axes", "perm", "kernel_shape", "pads", "strides", "dilations", "group", "to", "keepdims",
              "mode", "alpha", "beta", "epsilon", "transA", "transB", "num_outputs", "split", "batch_dims",
              "reduction", "direction", "hidden_size", "blocksize", "k", "largest", "sorted", "value", "seed",
              "allowzero", "coordinate_transformation_mode", "auto_pad", "ceil_mode", "count_include_pad"]


# ---------------------------------------------------------------- seeds

@dataclass
class Seed:
    name: str
    model: onnx.ModelProto
    feeds: dict[str, np.ndarray] = field(default_factory=dict)


def _io(name, dtype, shape):
    return h.make_tensor_value_info(name, dtype, shape)


def _mk(name, nodes, inputs, outputs, inits=(), opset=17, feeds=None) -> Seed:
    g = h.make_graph(nodes, name, inputs, outputs, list(inits))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 8
    return Seed(name, m, feeds or {})


def builtin_seeds() -> list[Seed]:
    """Small valid models over the ops an attacker would aim at: convolutions, GEMMs,
    gathers and scatters, shape arithmetic, generators, control flow, data-dependent sizes."""
    rng = np.random.default_rng(0)

    def f32(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    def init(name, arr):
        return numpy_helper.from_array(np.asarray(arr), name)
    x4 = _io("x", T.FLOAT, ["batch", 4])
    seeds = [
        _mk("relu_add", [h.make_node("Relu", ["x"], ["r"]), h.make_node("Add", ["r", "b"], ["y"])],
            [x4], [_io("y", T.FLOAT, ["batch", 4])], [init("b", f32(4))], feeds={"x": f32(2, 4)}),
        _mk("conv", [h.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1]),
                     h.make_node("Relu", ["c"], ["y"])],
            [_io("x", T.FLOAT, [1, 3, 8, 8])], [_io("y", T.FLOAT, [1, 4, 8, 8])],
            [init("w", f32(4, 3, 3, 3)), init("b", f32(4))], feeds={"x": f32(1, 3, 8, 8)}),
        _mk("gemm", [h.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1, alpha=1.0, beta=1.0)],
            [x4], [_io("y", T.FLOAT, ["batch", 3])], [init("w", f32(3, 4)), init("b", f32(3))],
            feeds={"x": f32(2, 4)}),
        _mk("matmul_softmax", [h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Softmax", ["m"], ["y"], axis=-1)],
            [x4], [_io("y", T.FLOAT, ["batch", 5])], [init("w", f32(4, 5))], feeds={"x": f32(3, 4)}),
        _mk("gather", [h.make_node("Gather", ["t", "i"], ["y"], axis=0)],
            [_io("i", T.INT64, [3])], [_io("y", T.FLOAT, [3, 4])], [init("t", f32(5, 4))],
            feeds={"i": np.array([0, 4, 2], np.int64)}),
        _mk("gather_elements", [h.make_node("GatherElements", ["x", "i"], ["y"], axis=1)],
            [_io("x", T.FLOAT, [2, 4]), _io("i", T.INT64, [2, 2])], [_io("y", T.FLOAT, [2, 2])],
            feeds={"x": f32(2, 4), "i": np.array([[0, 3], [1, 2]], np.int64)}),
        _mk("scatter_nd", [h.make_node("ScatterND", ["x", "i", "u"], ["y"])],
            [_io("x", T.FLOAT, [4, 3]), _io("i", T.INT64, [2, 1]), _io("u", T.FLOAT, [2, 3])],
            [_io("y", T.FLOAT, [4, 3])],
            feeds={"x": f32(4, 3), "i": np.array([[1], [3]], np.int64), "u": f32(2, 3)}),
        _mk("reshape_transpose", [h.make_node("Reshape", ["x", "s"], ["r"]),
                                  h.make_node("Transpose", ["r"], ["y"], perm=[1, 0, 2])],
            [_io("x", T.FLOAT, [2, 12])], [_io("y", T.FLOAT, [3, 2, 4])], [init("s", np.array([2, 3, 4], np.int64))],
            feeds={"x": f32(2, 12)}),
        _mk("slice_concat", [h.make_node("Slice", ["x", "st", "en", "ax"], ["s"]),
                             h.make_node("Concat", ["s", "x"], ["y"], axis=1)],
            [_io("x", T.FLOAT, [2, 6])], [_io("y", T.FLOAT, [2, 10])],
            [init("st", np.array([1], np.int64)), init("en", np.array([5], np.int64)), init("ax", np.array([1], np.int64))],
            feeds={"x": f32(2, 6)}),
        _mk("generators", [h.make_node("ConstantOfShape", ["s"], ["c"], value=h.make_tensor("v", T.FLOAT, [1], [2.0])),
                           h.make_node("Range", ["a", "b", "d"], ["r"]),
                           h.make_node("Expand", ["r", "s"], ["e"]),
                           h.make_node("Add", ["c", "e"], ["y"])],
            [], [_io("y", T.FLOAT, None)],
            [init("s", np.array([3, 4], np.int64)), init("a", np.float32(0)), init("b", np.float32(4)),
             init("d", np.float32(1))]),
        _mk("shape_arith", [h.make_node("Shape", ["x"], ["sh"]), h.make_node("ReduceProd", ["sh"], ["n"], keepdims=1),
                            h.make_node("Reshape", ["x", "n"], ["y"])],
            [_io("x", T.FLOAT, ["a", "b"])], [_io("y", T.FLOAT, None)], feeds={"x": f32(3, 5)}),
        _mk("pool_pad", [h.make_node("Pad", ["x", "p"], ["q"], mode="constant"),
                         h.make_node("MaxPool", ["q"], ["y"], kernel_shape=[2, 2], strides=[2, 2])],
            [_io("x", T.FLOAT, [1, 2, 6, 6])], [_io("y", T.FLOAT, None)],
            [init("p", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))], feeds={"x": f32(1, 2, 6, 6)}),
        _mk("topk_nonzero", [h.make_node("TopK", ["x", "k"], ["v", "i"], axis=-1),
                             h.make_node("NonZero", ["i"], ["y"])],
            [_io("x", T.FLOAT, [2, 6])], [_io("v", T.FLOAT, None), _io("y", T.INT64, None)],
            [init("k", np.array([3], np.int64))], feeds={"x": f32(2, 6)}),
        _mk("resize", [h.make_node("Resize", ["x", "", "sc"], ["y"], mode="nearest")],
            [_io("x", T.FLOAT, [1, 1, 4, 4])], [_io("y", T.FLOAT, None)],
            [init("sc", np.array([1, 1, 2, 2], np.float32))], opset=13, feeds={"x": f32(1, 1, 4, 4)}),
        _mk("int_div_mod", [h.make_node("Div", ["a", "b"], ["q"]), h.make_node("Mod", ["q", "b"], ["y"])],
            [_io("a", T.INT32, [4]), _io("b", T.INT32, [4])], [_io("y", T.INT32, [4])],
            feeds={"a": np.array([7, -9, 100, 5], np.int32), "b": np.array([2, 4, 7, 3], np.int32)}),
        _mk("cast_where", [h.make_node("Cast", ["x"], ["c"], to=T.INT64), h.make_node("Greater", ["x", "z"], ["g"]),
                           h.make_node("Cast", ["c"], ["cf"], to=T.FLOAT),
                           h.make_node("Where", ["g", "x", "cf"], ["y"])],
            [x4], [_io("y", T.FLOAT, None)], [init("z", np.float32(0))], feeds={"x": f32(2, 4)}),
        _mk("layernorm", [h.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1, epsilon=1e-5)],
            [x4], [_io("y", T.FLOAT, ["batch", 4])], [init("g", f32(4)), init("b", f32(4))], feeds={"x": f32(2, 4)}),
        _mk("reduce_argmax", [h.make_node("ReduceMean", ["x", "ax"], ["m"], keepdims=0),
                              h.make_node("ArgMax", ["x"], ["y"], axis=1, keepdims=0)],
            [x4], [_io("m", T.FLOAT, None), _io("y", T.INT64, None)], [init("ax", np.array([1], np.int64))],
            feeds={"x": f32(3, 4)}),
        _mk("split_tile", [h.make_node("Split", ["x"], ["p", "q"], axis=1, num_outputs=2),
                           h.make_node("Tile", ["p", "r"], ["y"])],
            [x4], [_io("y", T.FLOAT, None), _io("q", T.FLOAT, None)], [init("r", np.array([2, 3], np.int64))],
            opset=18, feeds={"x": f32(2, 4)}),
        _mk("cumsum_onehot", [h.make_node("CumSum", ["x", "ax"], ["c"]),
                              h.make_node("OneHot", ["i", "d", "v"], ["y"])],
            [x4, _io("i", T.INT64, [3])], [_io("c", T.FLOAT, None), _io("y", T.FLOAT, None)],
            [init("ax", np.int64(1)), init("d", np.int64(5)), init("v", np.array([0, 1], np.float32))],
            feeds={"x": f32(2, 4), "i": np.array([0, 4, 2], np.int64)}),
        _loop_seed(), _if_seed(), _scan_seed(),
    ]
    return seeds


def _loop_seed() -> Seed:
    body = h.make_graph([h.make_node("Identity", ["c"], ["co"]), h.make_node("Add", ["acc", "x"], ["acco"]),
                         h.make_node("Mul", ["acco", "two"], ["sc"])], "body",
                        [_io("i", T.INT64, []), _io("c", T.BOOL, []), _io("acc", T.FLOAT, [2])],
                        [_io("co", T.BOOL, []), _io("acco", T.FLOAT, [2]), _io("sc", T.FLOAT, [2])],
                        [numpy_helper.from_array(np.float32(2), "two")])
    return _mk("loop", [h.make_node("Loop", ["M", "", "z"], ["y", "s"], body=body)],
               [_io("x", T.FLOAT, [2])], [_io("y", T.FLOAT, None), _io("s", T.FLOAT, None)],
               [numpy_helper.from_array(np.int64(5), "M"), numpy_helper.from_array(np.zeros(2, np.float32), "z")],
               feeds={"x": np.array([1.5, -2], np.float32)})


def _if_seed() -> Seed:
    then = h.make_graph([h.make_node("Relu", ["x"], ["t"])], "then", [], [_io("t", T.FLOAT, [3])])
    other = h.make_graph([h.make_node("Neg", ["x"], ["e"])], "else", [], [_io("e", T.FLOAT, [3])])
    return _mk("if", [h.make_node("ReduceSum", ["x"], ["s"], keepdims=0), h.make_node("Greater", ["s", "z"], ["c"]),
                      h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
               [_io("x", T.FLOAT, [3])], [_io("y", T.FLOAT, None)], [numpy_helper.from_array(np.float32(0), "z")],
               feeds={"x": np.array([1, -2, 3], np.float32)})


def _scan_seed() -> Seed:
    body = h.make_graph([h.make_node("Add", ["s", "x"], ["so"]), h.make_node("Identity", ["so"], ["out"])], "body",
                        [_io("s", T.FLOAT, [2]), _io("x", T.FLOAT, [2])],
                        [_io("so", T.FLOAT, [2]), _io("out", T.FLOAT, [2])])
    return _mk("scan", [h.make_node("Scan", ["init", "xs"], ["y", "ys"], num_scan_inputs=1, body=body)],
               [_io("xs", T.FLOAT, ["n", 2])], [_io("y", T.FLOAT, None), _io("ys", T.FLOAT, None)],
               [numpy_helper.from_array(np.zeros(2, np.float32), "init")],
               feeds={"xs": np.arange(8, dtype=np.float32).reshape(4, 2)})


def onnx_seeds() -> list[Seed]:
    """The ONNX backend node test cases shipped with the onnx package (~1,900 models)."""
    from onnx.backend.test.case.node import collect_testcases
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases(None)
    out = []
    for c in cases:
        inits = {t.name for t in c.model.graph.initializer}
        names = [v.name for v in c.model.graph.input if v.name not in inits]
        feeds = {}
        if c.data_sets:
            ins = c.data_sets[0][0]
            feeds = {n: x for n, x in zip(names, ins) if isinstance(x, np.ndarray)}
        out.append(Seed(c.name, c.model, feeds))
    return out


def generated_seeds(count: int = 100) -> list[Seed]:
    """Random valid graphs of the differential fuzzer (kiln.testing.fuzz_graphs), seeds 0..count-1."""
    from kiln.testing.fuzz_graphs import generate
    return [Seed(f"generated_{c.seed}", c.model, dict(c.feeds)) for c in map(generate, range(count))]


CORPORA = {"builtin": lambda: builtin_seeds(), "onnx": lambda: onnx_seeds(), "generated": lambda: generated_seeds(),
           "all": lambda: builtin_seeds() + onnx_seeds() + generated_seeds()}


def seeds_for(corpus: str) -> list[Seed]:
    if corpus not in CORPORA:
        raise ValueError(f"unknown corpus {corpus!r}: one of {sorted(CORPORA)}")
    return CORPORA[corpus]()


# ---------------------------------------------------------------- model mutations

def _graphs(g: onnx.GraphProto):
    """The graph and every subgraph in it."""
    yield g
    for n in g.node:
        for a in n.attribute:
            if a.type == A.GRAPH:
                yield from _graphs(a.g)
            elif a.type == A.GRAPHS:
                for s in a.graphs:
                    yield from _graphs(s)


def _nodes(m: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for g in _graphs(m.graph) for n in g.node]


def _pick(rng, seq):
    return seq[int(rng.integers(len(seq)))] if len(seq) else None


def _int(rng) -> int:
    return int(_pick(rng, INTERESTING_INTS)) if rng.random() < 0.7 else int(rng.integers(-8, 9))


def _float(rng) -> float:
    return float(_pick(rng, INTERESTING_FLOATS)) if rng.random() < 0.7 else float(rng.normal() * 4)


def _value_names(m: onnx.ModelProto) -> list[str]:
    names = [v.name for v in m.graph.input] + [t.name for t in m.graph.initializer]
    return names + [o for n in _nodes(m) for o in n.output if o]


def m_attr_value(m, rng, feeds) -> str:
    nodes = [n for n in _nodes(m) if n.attribute]
    n = _pick(rng, nodes)
    if n is None:
        return m_attr_add(m, rng, feeds)
    a = _pick(rng, n.attribute)
    if a.type == A.INT:
        a.i = _int(rng)
    elif a.type == A.FLOAT:
        a.f = _float(rng)
    elif a.type == A.INTS:
        vals = list(a.ints) or [0]
        k = int(rng.integers(4))
        if k == 0:
            vals[int(rng.integers(len(vals)))] = _int(rng)
        elif k == 1:
            vals = vals[:-1]
        elif k == 2:
            vals.append(_int(rng))
        else:
            vals = [_int(rng) for _ in range(int(rng.integers(0, 9)))]
        del a.ints[:]
        a.ints.extend(vals)
    elif a.type == A.FLOATS:
        vals = list(a.floats) or [0.0]
        vals[int(rng.integers(len(vals)))] = _float(rng)
        del a.floats[:]
        a.floats.extend(vals)
    elif a.type == A.STRING:
        a.s = _pick(rng, [b"", b"bogus", b"NOTSET", b"reflect", b"linear", b"\xff\xfe",
                          _pick(rng, CONTROL).encode()])
    elif a.type == A.TENSOR:
        _mutate_tensor(a.t, rng)
    else:
        n.attribute.remove(a)
        return f"attr_drop {n.op_type}.{a.name}"
    return f"attr_value {n.op_type}.{a.name}"


def m_attr_add(m, rng, feeds) -> str:
    n = _pick(rng, _nodes(m))
    if n is None:
        return "noop"
    name = _pick(rng, ATTR_NAMES)
    for a in list(n.attribute):
        if a.name == name:
            n.attribute.remove(a)
    kind = int(rng.integers(4))
    value = (_int(rng) if kind == 0 else _float(rng) if kind == 1 else
             [_int(rng) for _ in range(int(rng.integers(0, 6)))] if kind == 2 else "bogus")
    n.attribute.append(h.make_attribute(name, value) if kind != 2 or value else
                       h.make_attribute(name, [], attr_type=A.INTS))
    return f"attr_add {n.op_type}.{name}"


def m_attr_retype(m, rng, feeds) -> str:
    """An attribute of the right name and the wrong type (INT where INTS is wanted, ...)."""
    nodes = [n for n in _nodes(m) if n.attribute]
    n = _pick(rng, nodes)
    if n is None:
        return "noop"
    a = _pick(rng, n.attribute)
    name = a.name
    n.attribute.remove(a)
    n.attribute.append(h.make_attribute(name, _pick(rng, [1, 1.5, [1, 2], [1.0], "x", b"y"])))
    return f"attr_retype {n.op_type}.{name}"


def m_input_dims(m, rng, feeds) -> str:
    vi = _pick(rng, list(m.graph.input))
    if vi is None or not vi.type.HasField("tensor_type"):
        return "noop"
    tt = vi.type.tensor_type
    dims = tt.shape.dim
    k = int(rng.integers(5))
    if k == 0 and len(dims):
        dims[int(rng.integers(len(dims)))].dim_value = _pick(rng, [0, 1, 2, 3, 5, 2 ** 20, 2 ** 40, 2 ** 62])
    elif k == 1 and len(dims):
        dims[int(rng.integers(len(dims)))].dim_param = _pick(rng, ["n", "batch", "\x1b[2J", ""])
    elif k == 2:
        tt.shape.dim.add().dim_value = int(rng.integers(1, 4))
    elif k == 3 and len(dims):
        del dims[-1]
    else:
        tt.ClearField("shape")
    _reshape_feed(feeds, vi.name, rng)
    return f"input_dims {vi.name}"


def m_input_dtype(m, rng, feeds) -> str:
    vi = _pick(rng, list(m.graph.input))
    if vi is None or not vi.type.HasField("tensor_type"):
        return "noop"
    vi.type.tensor_type.elem_type = int(_pick(rng, DTYPES))
    if vi.name in feeds and rng.random() < 0.5:
        feeds.pop(vi.name)  # let the harness make values of the new dtype
    return f"input_dtype {vi.name}"


def _mutate_tensor(t: onnx.TensorProto, rng) -> str:
    k = int(rng.integers(5))
    if k == 0 and len(t.dims):  # dims that no longer match the data
        t.dims[int(rng.integers(len(t.dims)))] = _pick(rng, [0, 1, 2, 7, 2 ** 31, 2 ** 40, -1])
        return "dims"
    if k == 1:
        t.data_type = int(_pick(rng, DTYPES))
        return "dtype"
    if k == 2 and t.raw_data:
        t.raw_data = t.raw_data[:int(rng.integers(len(t.raw_data)))]
        return "truncated"
    try:
        arr = numpy_helper.to_array(t)
    except Exception:  # noqa: BLE001 - already broken: break it more
        t.ClearField("raw_data")
        return "cleared"
    if arr.dtype.kind in "iu" and arr.size:
        flat = arr.reshape(-1).copy()
        info = np.iinfo(arr.dtype)
        flat[int(rng.integers(flat.size))] = np.clip(_int(rng), info.min, info.max)
        arr = flat.reshape(arr.shape)
    elif arr.dtype.kind == "f" and arr.size:
        flat = arr.reshape(-1).copy()
        with np.errstate(all="ignore"):
            flat[int(rng.integers(flat.size))] = _float(rng)
        arr = flat.reshape(arr.shape)
    elif k == 4:
        arr = np.zeros([int(rng.integers(0, 3)) for _ in range(int(rng.integers(0, 3)))], arr.dtype)
    new = numpy_helper.from_array(arr, t.name)
    t.CopyFrom(new)
    return "values"


def m_initializer(m, rng, feeds) -> str:
    inits = [t for g in _graphs(m.graph) for t in g.initializer]
    inits += [a.t for n in _nodes(m) for a in n.attribute if a.type == A.TENSOR]
    t = _pick(rng, inits)
    if t is None:
        return m_attr_value(m, rng, feeds)
    return f"initializer {_mutate_tensor(t, rng)} {t.name}"


def _ops() -> list[str]:
    from kiln.ops.registry import REGISTRY
    return sorted(name for d, name in REGISTRY if d == "")


def m_op_swap(m, rng, feeds) -> str:
    n = _pick(rng, _nodes(m))
    if n is None:
        return "noop"
    old, n.op_type = n.op_type, _pick(rng, _ops() + ["NoSuchOp"])
    return f"op_swap {old}->{n.op_type}"


def m_drop_input(m, rng, feeds) -> str:
    n = _pick(rng, [n for n in _nodes(m) if n.input])
    if n is None:
        return "noop"
    k = int(rng.integers(len(n.input)))
    if rng.random() < 0.5:
        del n.input[k]
        return f"drop_input {n.op_type}[{k}]"
    n.input[k] = ""
    return f"blank_input {n.op_type}[{k}]"


def m_rewire_input(m, rng, feeds) -> str:
    """An input read from another value (type confusion), an unknown name, or one more input."""
    n = _pick(rng, _nodes(m))
    if n is None:
        return "noop"
    names = _value_names(m) + ["no_such_value"]
    if n.input and rng.random() < 0.6:
        k = int(rng.integers(len(n.input)))
        n.input[k] = _pick(rng, names)
        return f"rewire_input {n.op_type}[{k}]"
    n.input.append(_pick(rng, names))
    return f"extra_input {n.op_type}"


def m_outputs(m, rng, feeds) -> str:
    k = int(rng.integers(4))
    if k == 0 and len(m.graph.output) > 1:
        del m.graph.output[int(rng.integers(len(m.graph.output)))]
        return "drop_graph_output"
    if k == 1:
        name = _pick(rng, _value_names(m))
        m.graph.output.append(h.make_tensor_value_info(name, int(_pick(rng, DTYPES[:12])), None))
        return f"add_graph_output {name}"
    n = _pick(rng, _nodes(m))
    if n is None:
        return "noop"
    if k == 2 and n.output:
        del n.output[-1]
        return f"drop_output {n.op_type}"
    n.output.append(f"extra_{int(rng.integers(100))}")
    return f"extra_output {n.op_type}"


def m_opset(m, rng, feeds) -> str:
    m.opset_import[0].version = int(_pick(rng, [1, 5, 6, 7, 9, 10, 11, 12, 13, 16, 18, 21, 23, 28, 29, 999, 0]))
    return f"opset {m.opset_import[0].version}"


def m_domain(m, rng, feeds) -> str:
    n = _pick(rng, _nodes(m))
    if n is None:
        return "noop"
    n.domain = _pick(rng, ["ai.onnx.ml", "com.microsoft", "kiln", "ai.onnx", "x\x1b"])
    return f"domain {n.op_type}"


def m_names(m, rng, feeds) -> str:
    """Control characters in node, graph and value names (a value renamed consistently)."""
    weird = "v" + _pick(rng, CONTROL) + str(int(rng.integers(100)))
    k = int(rng.integers(3))
    if k == 0:
        m.graph.name = weird
        return "graph_name"
    if k == 1:
        n = _pick(rng, _nodes(m))
        if n is not None:
            n.name = weird
        return "node_name"
    names = _value_names(m)
    old = _pick(rng, names)
    if not old:
        return "noop"
    for g in _graphs(m.graph):
        for coll in (g.input, g.output, g.value_info):
            for v in coll:
                if v.name == old:
                    v.name = weird
        for t in g.initializer:
            if t.name == old:
                t.name = weird
        for n in g.node:
            for seq in (n.input, n.output):
                for i, x in enumerate(seq):
                    if x == old:
                        seq[i] = weird
    if old in feeds:
        feeds[weird] = feeds.pop(old)
    return "value_name"


def m_feeds(m, rng, feeds) -> str:
    """The run-time inputs: extreme values (huge or negative indices, NaN), other shapes or dtypes."""
    if not feeds:
        return m_attr_value(m, rng, feeds)
    name = _pick(rng, sorted(feeds))
    x = np.array(feeds[name])
    k = int(rng.integers(4))
    if k == 0 and x.size:
        flat = x.reshape(-1).copy()
        if x.dtype.kind in "iu":
            info = np.iinfo(x.dtype)
            flat[int(rng.integers(flat.size))] = np.clip(_int(rng), info.min, info.max)
        elif x.dtype.kind == "f":
            flat[int(rng.integers(flat.size))] = _float(rng)
        feeds[name] = flat.reshape(x.shape)
    elif k == 1:
        _reshape_feed(feeds, name, rng)
    elif k == 2:
        feeds[name] = x.astype(_pick(rng, [np.float64, np.int32, np.int64, np.float16, np.bool_, np.uint8]))
    else:
        feeds[name] = np.full(x.shape, _int(rng) if x.dtype.kind in "iu" else _float(rng)).astype(x.dtype)
    return f"feeds {name}"


def _reshape_feed(feeds, name, rng) -> None:
    x = feeds.get(name)
    if x is None:
        return
    shape = list(np.shape(x))
    k = int(rng.integers(3))
    if k == 0 and shape:
        shape[int(rng.integers(len(shape)))] = int(rng.integers(0, 7))
    elif k == 1:
        shape.append(int(rng.integers(1, 3)))
    elif shape:
        shape.pop()
    size = int(np.prod(shape)) if shape else 1
    flat = np.resize(np.asarray(x).reshape(-1), size) if np.size(x) else np.zeros(size, np.asarray(x).dtype)
    feeds[name] = flat.reshape(shape)


MODEL_MUTATORS: list[tuple[str, Callable]] = [
    ("attr_value", m_attr_value), ("attr_value", m_attr_value), ("attr_add", m_attr_add),
    ("attr_retype", m_attr_retype), ("input_dims", m_input_dims), ("input_dtype", m_input_dtype),
    ("initializer", m_initializer), ("initializer", m_initializer), ("op_swap", m_op_swap),
    ("drop_input", m_drop_input), ("rewire_input", m_rewire_input), ("outputs", m_outputs),
    ("opset", m_opset), ("domain", m_domain), ("names", m_names), ("feeds", m_feeds), ("feeds", m_feeds),
]


def mutate_model(seed: Seed, rng: np.random.Generator) -> tuple[bytes, dict, list[str]]:
    """One to three stacked mutations of `seed`: (model bytes, run-time feeds, what was done)."""
    m = copy.deepcopy(seed.model)
    feeds = {k: np.array(v) for k, v in seed.feeds.items()}
    done = []
    for _ in range(1 + int(rng.integers(3) if rng.random() < 0.4 else 0)):
        _, fn = MODEL_MUTATORS[int(rng.integers(len(MODEL_MUTATORS)))]
        try:
            done.append(fn(m, rng, feeds))
        except (ValueError, TypeError, OverflowError) as e:  # protobuf refused the value itself
            done.append(f"(mutation refused: {type(e).__name__})")
    try:
        data = m.SerializeToString()
    except Exception:  # noqa: BLE001 - an unserialisable mutation: keep the seed
        data, done = seed.model.SerializeToString(), done + ["(unserialisable: seed kept)"]
    return data, feeds, done


# ---------------------------------------------------------------- artifact mutations

def _json_paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _json_paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _json_paths(v, prefix + (i,))


def _mutate_json(manifest: dict, rng) -> str:
    paths = [p for p in _json_paths(manifest) if p]
    path = _pick(rng, paths)
    parent = manifest
    for k in path[:-1]:
        parent = parent[k]
    key, old = path[-1], parent[path[-1]]
    k = int(rng.integers(5))
    if k == 0:
        if isinstance(parent, dict):
            del parent[key]
        else:
            parent.pop(key)
        return f"manifest delete {'.'.join(map(str, path))}"
    if isinstance(old, bool) or k == 1:
        parent[key] = _pick(rng, [None, "", [], {}, 0, -1, "x", True, 1.5])
    elif isinstance(old, int):
        parent[key] = _pick(rng, [0, 1, -1, old // 2, old * 2, old + 64, 2 ** 31, 2 ** 63, -2 ** 63, 10 ** 30])
    elif isinstance(old, str):
        parent[key] = _pick(rng, ["", "system", "main", "../../lib.so", "model.h", "float64", "int8", "unknown",
                                  old[:-1], old + "_", "kiln_main", "\x1b[2J", "cpu", "aarch64", "0" * 64])
    elif isinstance(old, list):
        parent[key] = _pick(rng, [[], old[:-1], old + old[-1:], [old[0]] if old else [0], [-1], [2 ** 40]])
    elif isinstance(old, dict):
        parent[key] = _pick(rng, [{}, [], "x"])
    return f"manifest set {'.'.join(map(str, path))}"


def mutate_artifact(data: bytes, rng: np.random.Generator) -> tuple[bytes, list[str]]:
    """A mutated copy of a `.kiln` zip: manifest fields, members truncated/garbled/dropped/added,
    or the zip itself cut or flipped."""
    import io
    k = int(rng.integers(10))
    if k == 0:
        cut = int(rng.integers(len(data)))
        return data[:cut], [f"zip truncated at {cut}"]
    if k == 1:
        b = bytearray(data)
        for _ in range(int(rng.integers(1, 8))):
            b[int(rng.integers(len(b)))] = int(rng.integers(256))
        return bytes(b), ["zip bytes flipped"]
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        members = {n: z.read(n) for n in z.namelist()}
    done = []
    if k <= 5:
        manifest = json.loads(members["manifest.json"])
        for _ in range(1 + int(rng.integers(2))):
            if isinstance(manifest, dict) and manifest:
                done.append(_mutate_json(manifest, rng))
        members["manifest.json"] = json.dumps(manifest).encode()
    else:
        name = _pick(rng, sorted(members))
        body = members[name]
        if k == 6:
            members[name] = body[:int(rng.integers(len(body) + 1))]
            done.append(f"member {name} truncated")
        elif k == 7:
            b = bytearray(body)
            for _ in range(int(rng.integers(1, 16))):
                if b:
                    b[int(rng.integers(len(b)))] = int(rng.integers(256))
            members[name] = bytes(b)
            done.append(f"member {name} garbled")
        elif k == 8:
            del members[name]
            done.append(f"member {name} dropped")
        else:
            other = _pick(rng, sorted(set(members) - {name})) or name
            members[name] = members[other]
            done.append(f"member {name} replaced by {other}")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, body in members.items():
            z.writestr(name, body)
    return buf.getvalue(), done


# ---------------------------------------------------------------- running a case (in the sandbox)

def run_case(case: dict) -> None:
    """The sandbox worker's job for one case: import, compile and run a model, or load and
    run an artifact. Raises whatever kiln raises; the sandbox classifies it."""
    import kiln
    if case["kind"] == "artifact":
        model = kiln.load(case["path"])
    else:
        model = kiln.compile(case["model"], target=case["target"], opt_level=case.get("opt_level", 2))
    model.run(_feeds_for(model, case.get("feeds") or {}, case.get("seed", 0)))


def _feeds_for(model, given: dict, seed: int) -> dict:
    """The case's arrays for the inputs they name (as given: the model must check them);
    seeded random values (symbols sized 2) for the rest."""
    from kiln.runtime.inputs import random_inputs, symbols
    names = {s.name for s in model.inputs}
    given = {k: v for k, v in given.items() if k in names}
    missing = [s for s in model.inputs if s.name not in given]
    if missing:
        dims = {d: 2 for d in symbols(missing)}
        try:
            given = {**random_inputs(missing, dims, seed, given={}), **given}
        except Exception:  # noqa: BLE001 - a spec the harness cannot fill (sequence, unknown shape):
            given.update({s.name: np.zeros((), np.float32) for s in missing})  # the model must refuse it
    return given


# ---------------------------------------------------------------- campaigns

@dataclass
class Report:
    counts: Counter = field(default_factory=Counter)     # (kind "model"/"artifact", outcome) -> n
    failures: list[dict] = field(default_factory=list)   # one per failing case
    seconds: float = 0.0
    wrapped: Counter = field(default_factory=Counter)    # KilnErrors wrapping another exception, by type

    def total(self, kind: str) -> int:
        return sum(n for (k, _), n in self.counts.items() if k == kind)

    def failed(self) -> int:
        return len(self.failures)

    def __str__(self) -> str:
        lines = []
        for kind in ("model", "artifact"):
            n = self.total(kind)
            if n:
                parts = ", ".join(f"{o} {self.counts[(kind, o)]}" for o in OUTCOMES)
                lines.append(f"{n} mutated {kind}s: {parts}")
        if self.wrapped:
            lines.append("KilnErrors wrapping an internal exception (the op's code failed, not a check): "
                         + ", ".join(f"{k} {n}" for k, n in self.wrapped.most_common()))
        lines.append(f"{self.failed()} failing case(s) in {self.seconds:.0f} s")
        for f in self.failures[:20]:
            detail = f["detail"].strip().splitlines()
            lines.append(f"  [{f['outcome']}] {f['seed']} <- {'; '.join(f['mutations'])}: "
                         f"{detail[-1] if detail else ''}"[:300])
        return "\n".join(lines)


def model_cases(count: int, seed: int, corpus: str = "builtin", targets=("cpu", "interpreter")) -> list[dict]:
    rng = np.random.default_rng(seed)
    seeds = seeds_for(corpus)
    cases = []
    for i in range(count):
        s = seeds[int(rng.integers(len(seeds)))]
        data, feeds, done = mutate_model(s, rng)
        cases.append({"kind": "model", "model": data, "feeds": feeds, "seed": seed * 1_000_003 + i,
                      "target": targets[int(rng.integers(len(targets)))], "origin": s.name, "mutations": done})
    return cases


ARTIFACT_BASES = ("relu_add", "conv", "gather", "int_div_mod", "reshape_transpose", "scatter_nd")


def artifact_cases(count: int, seed: int, folder: Path, bases: tuple = ARTIFACT_BASES) -> list[dict]:
    """Mutated copies of artifacts of a few built-in seeds (compiled here, for cpu)."""
    import kiln
    rng = np.random.default_rng(seed + 7)
    folder.mkdir(parents=True, exist_ok=True)
    names, bases = bases, []
    for s in builtin_seeds():
        if s.name not in names:
            continue
        path = folder / f"seed_{s.name}.kiln"
        m = kiln.compile(s.model, target="cpu")
        dims = {d: 2 for spec in m.inputs for d in (spec.shape or ()) if isinstance(d, str)}
        kiln.save(m, path, dims=dims, source=s.model.SerializeToString())
        bases.append((s.name, path.read_bytes()))
    cases = []
    for i in range(count):
        name, data = bases[int(rng.integers(len(bases)))]
        mutated, done = mutate_artifact(data, rng)
        path = folder / f"case_{seed}_{i}.kiln"
        path.write_bytes(mutated)
        cases.append({"kind": "artifact", "path": str(path), "seed": seed * 1_000_003 + i,
                      "origin": name, "mutations": done})
    return cases


def run_campaign(models: int = 200, artifacts: int = 0, seed: int = 0, *, corpus: str = "builtin",
                 jobs: int = 2, timeout_s: float = 60.0, memory_bytes: int = 4 << 30, batch: int = 50,
                 out: str | os.PathLike | None = None, targets=("cpu", "interpreter"),
                 progress: Callable[[int, int], None] | None = None, workdir: str | os.PathLike | None = None,
                 artifact_bases: tuple = ARTIFACT_BASES) -> Report:
    """Make and run `models` mutated models and `artifacts` mutated artifacts; failing cases are
    saved under `out` (when given) for replay."""
    import tempfile
    t0 = time.perf_counter()
    report = Report()
    with tempfile.TemporaryDirectory(prefix="kiln-mutate-", dir=workdir) as tmp:
        cases = model_cases(models, seed, corpus, targets) if models else []
        if artifacts:
            cases += artifact_cases(artifacts, seed, Path(tmp), artifact_bases)
        box = Sandbox("kiln.testing.mutate:run_case", timeout_s=timeout_s, memory_bytes=memory_bytes,
                      jobs=jobs, batch=batch)
        done = [0]

        def tick(o: Outcome) -> None:
            done[0] += 1
            if progress is not None:
                progress(done[0], len(cases))
        for o in box.run(cases, tick):
            case = cases[o.index]
            report.counts[(case["kind"], o.kind)] += 1
            if o.failed:
                report.failures.append(_failure(case, o, out))
            elif o.detail.startswith("wraps "):
                report.wrapped[o.detail.split(";")[0].removeprefix("wraps ")] += 1
    report.seconds = time.perf_counter() - t0
    return report


def _failure(case: dict, o: Outcome, out) -> dict:
    rec = {"kind": case["kind"], "seed": case["origin"], "mutations": case["mutations"], "outcome": o.kind,
           "detail": o.detail, "target": case.get("target"), "case_seed": case["seed"]}
    if out is not None:
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        stem = f"{case['kind']}_{case['seed']}"
        if case["kind"] == "model":
            (folder / f"{stem}.onnx").write_bytes(case["model"])
            if case.get("feeds"):
                np.savez(folder / f"{stem}.feeds.npz", **{f"i{k}": v for k, v in enumerate(case["feeds"].values())})
            rec["file"] = str(folder / f"{stem}.onnx")
        else:
            dest = folder / f"{stem}.kiln"
            dest.write_bytes(Path(case["path"]).read_bytes())
            rec["file"] = str(dest)
        with open(folder / "failures.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")
    return rec
