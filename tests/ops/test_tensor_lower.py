"""Native (cpu) lowerings of the tensor and indexing families against the NumPy reference.

Each case is a one-node ONNX model: runtime inputs are random graph inputs,
compile-time inputs (shapes, axes, pads, indices we want known) are initializers.
All cases of a test are lowered node by node and built as one C module (one
compiler run, cached), then each kernel is compared with the interpreter.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import helper as oh, numpy_helper

import kiln
from kiln.codegen import build_c
from kiln.dtypes import DType
from kiln.errors import KilnError
from kiln.interpreter import Interpreter
from kiln.loops import LoopModule
from kiln.lower.kernel import lower_node

RNG = np.random.default_rng(0)


def rand(shape, dtype=np.float32, lo=-5, hi=5):
    """Random non-zero data (integers in [lo, hi) without 0 for int dtypes)."""
    dtype = np.dtype(dtype)
    if dtype == bool:
        return np.asarray(RNG.random(shape) < 0.5)
    if dtype.kind in "iu":
        lo = max(lo, 0) if dtype.kind == "u" else lo
        v = np.asarray(RNG.integers(lo, hi, shape)).astype(dtype)
        return np.where(v == 0, np.ones((), dtype), v)
    return np.asarray(RNG.standard_normal(shape) * 2 + 0.5).astype(dtype)


class C:
    """A compile-time known input (an initializer), e.g. a shape, axes or pads."""

    def __init__(self, data, dtype=np.int64):
        self.data = np.asarray(data, dtype)


def case(op, inputs, attrs=None, opset=18, outputs=1, id=None):
    """A one-node model: each input is an array (a graph input, random at test time), a C(...)
    (an initializer, known when lowering) or None (an absent optional input)."""
    names = ["" if v is None else f"x{k}" for k, v in enumerate(inputs)]
    outs = [f"y{k}" for k in range(outputs)]
    node = oh.make_node(op, names, outs, **(attrs or {}))
    vi = [oh.make_tensor_value_info(n, oh.np_dtype_to_tensor_dtype(v.dtype), v.shape)
          for n, v in zip(names, inputs) if isinstance(v, np.ndarray)]
    init = [numpy_helper.from_array(v.data, n) for n, v in zip(names, inputs) if isinstance(v, C)]
    g = oh.make_graph([node], "g", vi, [oh.make_tensor_value_info(o, 0, None) for o in outs], init)
    model = oh.make_model(g, opset_imports=[oh.make_opsetid("", opset)])
    return pytest.param(model, [v for v in inputs if isinstance(v, np.ndarray)], id=id or op)


def _lower(model, name):
    graph = kiln.load_onnx(model)
    (node,) = graph.nodes
    values = [None if v is None else v.const for v in node.inputs]
    return graph, lower_node(node, graph.opset(""), values, name)


def check_all(cases, rtol=1e-6):
    """Lower every case, build them as one module, compare each kernel with the interpreter."""
    built = [_lower(model, f"k{n}") + (inputs,) for n, (model, inputs) in enumerate(cases)]
    mod = build_c(LoopModule([f for _, f, _ in built]))
    for n, (graph, func, inputs) in enumerate(built):
        want = Interpreter(graph).run(inputs)
        got = [np.empty(v.type.shape, v.type.dtype.np) for v in graph.outputs]
        fed = dict(zip([v.id for v in graph.inputs], inputs))
        args = [v.const if v.const is not None else fed[v.id] for v in graph.nodes[0].inputs if v is not None]
        mod[func.name](*[np.array(a, order="C") for a in args], *got)
        for w, g in zip(want, got):
            assert g.dtype == w.dtype and g.shape == w.shape, (n, graph.nodes[0])
            np.testing.assert_allclose(g, w, rtol=rtol, err_msg=f"case {n}: {graph.nodes[0]}")


def values(cases):
    return [tuple(c.values) for c in cases]


X = rand((2, 3, 4, 5))

SHAPE_CASES = [
    case("Reshape", [X, C([6, -1, 5])]),
    case("Reshape", [X, C([0, 0, 20])], id="Reshape-copy-dims"),
    case("Reshape", [X, C([5, 4, 3, 2])], id="Reshape-regroup"),
    case("Reshape", [rand((1, 6, 1)), C([3, 1, 2])], id="Reshape-unit-dims"),
    case("Reshape", [rand(()), C([1, 1])], id="Reshape-scalar"),
    case("Flatten", [X], {"axis": 2}),
    case("Flatten", [X], {"axis": 0}, id="Flatten-0"),
    case("Squeeze", [rand((3, 1, 4, 1)), C([-1])]),
    case("Squeeze", [rand((3, 1, 4, 1))], id="Squeeze-all"),
    case("Squeeze", [rand((3, 1, 4, 1))], {"axes": [1]}, opset=11, id="Squeeze-11"),
    case("Unsqueeze", [rand((3, 4)), C([0, 3])]),
    case("Transpose", [X], {"perm": [0, 2, 1, 3]}, id="Transpose-rows"),
    case("Transpose", [X], {"perm": [3, 0, 2, 1]}, id="Transpose-tiled"),
    case("Transpose", [rand((33, 17))], id="Transpose-2d-ragged"),
    case("Transpose", [rand((2, 3, 4), np.int8)], id="Transpose-default-int8"),
    case("Shape", [X]),
    case("Shape", [X], {"start": 1, "end": -1}, id="Shape-range"),
    case("Size", [X]),
    case("ConstantOfShape", [C([2, 3])], {"value": numpy_helper.from_array(np.array([7], np.int32))}),
    case("ConstantOfShape", [C([3])], id="ConstantOfShape-default"),
    case("Constant", [], {"value": numpy_helper.from_array(rand((3, 4)))}),
    case("Constant", [], {"value": numpy_helper.from_array(rand((10, 10)))}, id="Constant-table"),
    case("Constant", [], {"value": numpy_helper.from_array(np.array([np.nan, -np.inf, 0.5], np.float16))},
         id="Constant-f16-special"),
    case("Constant", [], {"value_ints": [3, -2**63, 2**40]}, id="Constant-ints"),
    case("Constant", [], {"value": numpy_helper.from_array(
        np.concatenate([[-2**63, 2**63 - 1], RNG.integers(-9, 9, 98)]).astype(np.int64))}, id="Constant-table-i64"),
    case("Constant", [], {"value": numpy_helper.from_array(RNG.integers(0, 2**64, 70, np.uint64))},
         id="Constant-table-u64"),
    case("Constant", [], {"value": numpy_helper.from_array(rand((7, 11)) > 0)}, id="Constant-table-bool"),
    case("Constant", [], {"value": numpy_helper.from_array(
        np.concatenate([[np.nan, np.inf, -np.inf, -0.0], rand(80)]).astype(np.float16))}, id="Constant-table-f16"),
    case("Constant", [], {"value_float": 2.5}, id="Constant-float"),
]


def test_shapes_and_constants():
    check_all(values(SHAPE_CASES))


COPY_CASES = [
    case("Concat", [rand((2, 3, 4)), rand((2, 1, 4)), rand((2, 0, 4)), rand((2, 5, 4))], {"axis": 1}),
    case("Concat", [rand((2, 3)), rand((2, 2))], {"axis": -1}, id="Concat-last"),
    case("Concat", [rand((3,), np.int64)], {"axis": 0}, id="Concat-one"),
    case("Split", [X], {"axis": 1}, outputs=3),
    case("Split", [X, C([1, 3, 1])], {"axis": -1}, outputs=3, id="Split-sizes"),
    case("Split", [rand((7, 2))], {"axis": 0, "num_outputs": 3}, outputs=3, id="Split-num-outputs"),
    case("Split", [rand((6, 2))], {"axis": 0, "split": [2, 4]}, opset=11, outputs=2, id="Split-11"),
    case("Slice", [X, C([1, -1]), C([100, 0]), C([2, -1]), C([1, -2])]),
    case("Slice", [X, C([0, 1, -10]), C([2, 3, 3]), None, C([1, 2, 1])], id="Slice-no-axes"),
    case("Slice", [X, C([-1]), C([-1000]), C([0]), C([-1])], id="Slice-reverse"),
    case("Slice", [X, C([3]), C([1]), C([2])], id="Slice-empty"),
    case("Slice", [X], {"starts": [1], "ends": [3], "axes": [2]}, opset=9, id="Slice-9"),
    case("Expand", [rand((3, 1)), C([2, 3, 4])]),
    case("Expand", [rand((1,), np.int32), C([5])], id="Expand-1d"),
    case("Tile", [rand((2, 3)), C([2, 3])]),
    case("Tile", [rand((2, 1, 3)), C([1, 4, 0])], id="Tile-zero"),
    case("Pad", [X, C([0, 1, 2, 0, 1, 0, 3, 2])], {"mode": "constant"}),
    case("Pad", [X, C([0, 1, 2, 0, 1, 0, 3, 2]), C(1.5, np.float32)], id="Pad-value"),
    case("Pad", [X, C([1, -2, 0, 0, -1, 3]), None, C([1, 2, 3])], id="Pad-axes-crop"),
    case("Pad", [X, C([0, 1, 2, 3, 0, 2, 1, 4])], {"mode": "reflect"}, id="Pad-reflect"),
    case("Pad", [X, C([0, 3, 5, 1, 0, 2, 1, 7])], {"mode": "edge"}, id="Pad-edge"),
    case("Pad", [X, C([0, 4, 9, -1, 0, 5, 1, 6])], {"mode": "wrap"}, id="Pad-wrap"),
    case("Pad", [rand((2, 3), np.int32)], {"pads": [1, 0, 0, 2], "value": 7.0}, opset=2, id="Pad-2"),
    case("Pad", [rand((2, 3)), C([0, -3, 0, 2]), rand(())], id="Pad-all-cropped"),
    case("CenterCropPad", [rand((5, 4, 3)), C([3, 7])], {"axes": [0, 2]}),
    case("CenterCropPad", [rand((5, 4), np.int64), C([2, 9])], id="CenterCropPad-all"),
    case("DepthToSpace", [rand((2, 8, 3, 2))], {"blocksize": 2}),
    case("DepthToSpace", [rand((2, 8, 3, 2))], {"blocksize": 2, "mode": "CRD"}, id="DepthToSpace-CRD"),
    case("SpaceToDepth", [rand((2, 3, 4, 6))], {"blocksize": 2}),
    case("ReverseSequence", [rand((4, 3, 2)), np.array([4, 1, 3], np.int64)], {"batch_axis": 1, "time_axis": 0}),
    case("ReverseSequence", [rand((3, 5)), np.array([0, 5, 2], np.int64)], {"batch_axis": 0, "time_axis": 1},
         id="ReverseSequence-batch-major"),
]


def test_copies():
    check_all(values(COPY_CASES))


def idx(shape, dim, dtype=np.int64):
    """Random indices in [-dim, dim): negatives count from the end."""
    return RNG.integers(-dim, dim, shape).astype(dtype)


GEN_CASES = [
    case("Range", [C(1.5, np.float32), C(7.0, np.float32), C(0.7, np.float32)]),
    case("Range", [C(10), C(-3), C(-4)], id="Range-int-down"),
    case("Range", [C(3, np.int32), C(3, np.int32), C(1, np.int32)], id="Range-empty"),
    case("Range", [C(0.1, np.float64), C(1.0, np.float64), C(0.1, np.float64)], id="Range-f64"),
    case("EyeLike", [rand((3, 5))], {"k": 1}),
    case("EyeLike", [rand((4, 3), np.int32)], {"k": -2, "dtype": 11}, id="EyeLike-dtype"),
    case("Trilu", [rand((2, 4, 5))]),
    case("Trilu", [rand((4, 5), np.int64), C(-1)], {"upper": 0}, id="Trilu-lower-k"),
    case("Trilu", [rand((3, 3)), np.array(1, np.int64)], id="Trilu-runtime-k"),
    case("OneHot", [idx((2, 3), 5), C(5), rand((2,))], {"axis": 1}),
    case("OneHot", [np.array([0.0, 1.5, -1.0, 3.0], np.float32), C(4.0, np.float32), C([0, 9], np.int32)],
         id="OneHot-float-indices"),
]

INDEX_CASES = [
    case("Gather", [X, idx((2, 3), 4)], {"axis": 2}),
    case("Gather", [rand((5, 3), np.int32), C(-2)], id="Gather-scalar-index"),
    case("Gather", [X, idx((7,), 5, np.int32)], {"axis": -1}, id="Gather-last-int32"),
    case("GatherElements", [rand((3, 4)), idx((3, 2), 4)], {"axis": 1}),
    case("GatherElements", [rand((3, 4)), idx((2, 4), 3, np.int32)], id="GatherElements-0"),
    case("GatherND", [X, idx((4, 2), 2)]),
    case("GatherND", [X, idx((2, 3, 2), 3)], {"batch_dims": 1}, id="GatherND-batch"),
    case("GatherND", [X, np.array([[1, -1, 2, 0]], np.int64)], id="GatherND-full"),
    case("Compress", [X, C([0, 1, 1, 0, 1], bool)], {"axis": 3}),
    case("Compress", [rand((3, 4)), C([1, 1, 0, 1, 0, 0, 1, 1], bool)], id="Compress-flat"),
    case("Compress", [rand((3, 4)), C([0, 0], bool)], {"axis": 0}, id="Compress-none"),
]


def test_generators():
    check_all(values(GEN_CASES))


def test_indexing():
    check_all(values(INDEX_CASES))


def perm_idx(shape, dim, axis):
    """Indices without repeats along `axis` (a scatter without reduction is then deterministic)."""
    a = np.argsort(RNG.random(shape[:axis] + (dim,) + shape[axis + 1:]), axis=axis)
    a = np.take(a, np.arange(shape[axis]), axis=axis)
    return np.where(RNG.random(shape) < 0.5, a - dim, a).astype(np.int64)


TIES = np.array([[3, 1, 3, np.nan, 2, 1], [0, 0, 0, 0, 0, 0], [np.nan, 5, np.nan, -1, 5, 2]], np.float32)

EXTERN_CASES = [
    case("ScatterElements", [rand((4, 5)), perm_idx((2, 5), 4, 0), rand((2, 5))]),
    case("ScatterElements", [rand((4, 5)), idx((4, 3), 5), rand((4, 3))], {"axis": 1, "reduction": "add"},
         id="ScatterElements-add"),
    case("ScatterElements", [rand((4, 5), np.int32), idx((4, 3), 5), rand((4, 3), np.int32)],
         {"axis": 1, "reduction": "mul"}, id="ScatterElements-mul-int"),
    case("ScatterElements", [rand((4, 5)), idx((4, 3), 5), rand((4, 3))], {"axis": -1, "reduction": "max"},
         id="ScatterElements-max"),
    case("ScatterElements", [rand((4, 5)), idx((4, 3), 5), rand((4, 3))], {"axis": 1, "reduction": "min"},
         id="ScatterElements-min"),
    case("Scatter", [rand((3, 3)), perm_idx((2, 3), 3, 0), rand((2, 3))], opset=10),
    case("ScatterND", [X, np.array([[1, 2], [0, -1]], np.int64), rand((2, 4, 5))]),
    case("ScatterND", [X, np.array([[[1, 2, 3, 4]], [[1, 2, 3, 4]]], np.int64), rand((2, 1))],
         {"reduction": "add"}, id="ScatterND-add-repeats"),
    case("ScatterND", [rand((6,), np.int64), np.array([[5], [-6]], np.int64), rand((2,), np.int64)],
         {"reduction": "mul"}, id="ScatterND-mul"),
    case("TensorScatter", [rand((2, 3, 6, 4)), rand((2, 3, 2, 4)), np.array([1, 4], np.int64)], opset=24),
    case("TensorScatter", [rand((2, 5, 3)), rand((2, 3, 3)), np.array([3, -1], np.int64)],
         {"mode": "circular", "axis": 1}, opset=24, id="TensorScatter-circular"),
    case("TensorScatter", [rand((2, 5, 3)), rand((2, 2, 3))], {"axis": 1}, opset=24, id="TensorScatter-no-idx"),
    case("TopK", [rand((3, 7)), C([3])], outputs=2),
    case("TopK", [TIES, C([4])], {"largest": 1}, outputs=2, id="TopK-ties-nan"),
    case("TopK", [TIES, C([5])], {"largest": 0}, outputs=2, id="TopK-smallest"),
    case("TopK", [rand((5, 4, 3), np.int32), C([2])], {"axis": 1}, outputs=2, id="TopK-axis-int"),
    case("TopK", [rand((2, 9))], {"k": 9}, opset=9, outputs=2, id="TopK-9-all"),
    case("TopK", [np.where(RNG.random((3, 150)) < 0.1, np.nan, RNG.integers(0, 20, (3, 150))).astype(np.float32),
                  C([100])], {"largest": 0}, outputs=2, id="TopK-merge-sort"),
]


def test_externs():
    check_all(values(EXTERN_CASES))


def test_bad_indices_never_touch_memory_out_of_bounds():
    """Scatters and gathers fail on an index out of range, naming it (the reference fails too)."""
    bad = [case("ScatterElements", [rand((4, 5)), np.array([[0, 5]]), rand((1, 2))], {"axis": 1}),
           case("ScatterND", [rand((4, 5)), np.array([[-5]]), rand((1, 5))]),
           case("TensorScatter", [rand((2, 5, 3)), rand((2, 2, 3)), np.array([0, 4])], {"axis": 1}, opset=24),
           case("Gather", [rand((4, 5)), np.array([[0, 9, -7]])], {"axis": 1})]
    built = [_lower(model, f"k{n}") + (inputs,) for n, (model, inputs) in enumerate(values(bad))]
    mod = build_c(LoopModule([f for _, f, _ in built]))
    for (graph, func, inputs), what in zip(built, ["index 5 is out", "index -5 is out", "value 4 plus 2",
                                                   "index 9 is out"]):
        y = np.empty(graph.outputs[0].type.shape, np.float32)
        with pytest.raises(KilnError, match=what):
            mod[func.name](*inputs, y)


@pytest.mark.parametrize("model, inputs, message", [
    case("Slice", [X, np.array([1]), C([3])]).values + ("run-time value of starts",),
    case("Pad", [X, np.array([0, 1, 0, 0, 0, 1, 0, 0])]).values + ("run-time value of pads",),
    case("Range", [np.array(0.5, np.float32), C(3.0, np.float32), C(1.0, np.float32)]).values + ("start, limit",),
    case("Constant", [], {"value_strings": ["a"]}).values + ("no native",),
])
def test_what_cannot_be_lowered_says_why(model, inputs, message):
    with pytest.raises(KilnError, match=message):
        _lower(model, "k")


UNIQUE_X = np.array([[2, 1, 2, 0], [2, 1, 2, 0], [-1, 1, 3, 0]], np.float32)
FLAT_NAN = np.array([3, 1, 3, np.nan, 0, -0.0, np.nan, 1], np.float32)
COND = np.array([1, 0, 1, 1], bool)

SIZED_AT_RUN_TIME = [
    case("Compress", [rand((2, 3, 4)), COND], {"axis": 2}),
    case("Compress", [rand((2, 3, 4)), COND], id="Compress-flat"),
    case("Unique", [FLAT_NAN], outputs=4, id="Unique-flat-nan"),
    case("Unique", [FLAT_NAN], {"sorted": 0}, outputs=4, id="Unique-unsorted"),
    case("Unique", [UNIQUE_X], {"axis": 0}, outputs=4, id="Unique-rows"),
    case("Unique", [UNIQUE_X], {"axis": 1, "sorted": 0}, outputs=4, id="Unique-cols-unsorted"),
    case("Unique", [UNIQUE_X.astype(np.int32)], {"axis": -1}, outputs=2, id="Unique-int-2-outputs"),
    case("Unique", [np.zeros((0, 3), np.int64)], {"axis": 0}, outputs=4, id="Unique-empty"),
    case("Unique", [FLAT_NAN.astype(ml_dtypes.bfloat16)], outputs=4, id="Unique-bfloat16-nan"),
    case("Unique", [UNIQUE_X.astype(ml_dtypes.bfloat16)], {"axis": 1, "sorted": 0}, outputs=4,
         id="Unique-bfloat16-cols"),
]


def test_outputs_sized_by_data_report_their_dims():
    """Run-time sized outputs: the kernel writes each compactly into a capacity buffer and
    their actual dims, concatenated, into one more int64 parameter."""
    built = [_lower(model, f"k{n}") + (inputs,) for n, (model, inputs) in enumerate(values(SIZED_AT_RUN_TIME))]
    mod = build_c(LoopModule([f for _, f, _ in built]))
    for graph, func, inputs in built:
        bufs = [np.zeros(p.shape, p.dtype.np) for p in func.params[len(inputs):]]
        mod[func.name](*inputs, *bufs)
        dims, at = bufs[-1].tolist(), 0
        for want, buf in zip(Interpreter(graph).run(inputs), bufs):
            shape = tuple(dims[at:at + want.ndim])
            at += want.ndim
            assert shape == want.shape, graph.nodes[0]
            got = buf.reshape(-1)[:want.size].reshape(shape)
            if want.dtype == ml_dtypes.bfloat16:  # NumPy compares bfloat16 NaNs as unequal
                got, want = got.astype(np.float32), want.astype(np.float32)
            np.testing.assert_array_equal(got, want)


EMPTY_CASES = [
    case("Transpose", [rand((0, 3, 4))], {"perm": [2, 1, 0]}),
    case("Reshape", [rand((0, 3)), C([3, 0])], {"allowzero": 1}),
    case("Concat", [rand((2, 0)), rand((2, 0))], {"axis": 1}),
    case("Split", [rand((4, 3))], {"axis": 0, "split": [4, 0]}, opset=11, outputs=2),
    case("Gather", [rand((3, 4)), np.zeros((0, 2), np.int64)], {"axis": 1}),
    case("GatherND", [rand((3, 4)), np.zeros((0, 1), np.int64)]),
    case("Expand", [rand((1, 3)), C([0, 3])]),
    case("Pad", [rand((0, 3)), C([1, 1, 0, 1])]),
    case("OneHot", [np.zeros((0,), np.int64), C(3), rand((2,))]),
    case("TopK", [rand((3, 4)), C([0])], outputs=2),
    case("ScatterND", [rand((3, 4)), np.zeros((0, 1), np.int64), rand((0, 4))]),
    case("ScatterElements", [rand((0, 4)), np.zeros((0, 4), np.int64), rand((0, 4))]),
    case("Range", [C(3), C(1), C(1)]),
]


def test_empty_tensors():
    check_all(values(EMPTY_CASES))
