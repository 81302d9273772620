"""The mutation fuzzer's seed corpora: valid models to break (kiln.testing.mutate).

`builtin` (small models over the ops an attacker aims at, control flow included), `onnx` (the
ONNX backend node models), `generated` (random valid graphs of the differential fuzzer,
kiln.testing.fuzz_graphs).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper


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
