"""Tensor and indexing ops: static shape propagation, old opset forms, error paths."""

import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.errors import KilnError
from kiln.frontends.onnx import load_onnx

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs=("y",), opset=21, inits=()):
    """A model from (op, inputs, outputs, attrs) tuples; `inputs` maps name -> (elem type, shape)."""
    vi = [helper.make_tensor_value_info(n, t, s) for n, (t, s) in inputs.items()]
    ns = [helper.make_node(op, i, o, name=f"n{k}", **a) for k, (op, i, o, a) in enumerate(nodes)]
    outs = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs]
    inits = [numpy_helper.from_array(np.asarray(v), n) for n, v in inits]
    return helper.make_model(helper.make_graph(ns, "g", vi, outs, inits),
                             opset_imports=[helper.make_opsetid("", opset)])


def _out_shapes(model):
    return [v.type.shape for v in load_onnx(model).outputs]


def _run(model, *xs):
    return kiln.compile(model, target="interpreter")(*xs)


# ---- static shape propagation ----

def test_reshape_to_shape_of_other_tensor_is_static():
    m = _model([("Shape", ["s"], ["sh"], {}), ("Reshape", ["x", "sh"], ["y"], {})],
               {"x": (F, [2, 6]), "s": (F, [3, 4])})
    assert _out_shapes(m) == [(3, 4)]


def test_reshape_through_shape_slice_concat_is_static():
    m = _model([("Shape", ["x"], ["sh"], {"end": 1}),
                ("Concat", ["sh", "m1"], ["t"], {"axis": 0}),
                ("Reshape", ["x", "t"], ["y"], {})],
               {"x": (F, [2, 3, 4])}, inits=[("m1", np.array([-1], np.int64))])
    assert _out_shapes(m) == [(2, 12)]


def test_reshape_keeps_symbols_that_cancel():
    m = _model([("Reshape", ["x", "t"], ["y"], {})], {"x": (F, ["N", 3, 4])},
               inits=[("t", np.array([0, -1], np.int64))])
    assert _out_shapes(m) == [("N", 12)]


def test_shape_of_symbolic_tensor_slice_is_known_where_static():
    m = _model([("Shape", ["x"], ["sh"], {"start": 1}), ("ConstantOfShape", ["sh"], ["y"], {})],
               {"x": (F, ["N", 3, 4])})
    assert _out_shapes(m) == [(3, 4)]


def test_slice_gather_expand_tile_pad_infer_static_shapes():
    i64 = lambda *v: np.array(v, np.int64)
    m = _model([("Slice", ["x", "st", "en", "ax", "sp"], ["a"], {}),
                ("Gather", ["x", "gi"], ["b"], {"axis": 1}),
                ("Expand", ["x", "ex"], ["c"], {}),
                ("Tile", ["x", "rp"], ["d"], {}),
                ("Pad", ["x", "pd"], ["e"], {"mode": "reflect"})],
               {"x": (F, [4, 5])}, outputs=("a", "b", "c", "d", "e"),
               inits=[("st", i64(-1, 0)), ("en", i64(-2**63, 2**62)), ("ax", i64(0, 1)), ("sp", i64(-2, 2)),
                      ("gi", i64([0, -1], [1, 2], [3, 3])), ("ex", i64(2, 1, 1)), ("rp", i64(2, 3)),
                      ("pd", i64(1, 0, 2, -1))])
    assert _out_shapes(m) == [(2, 3), (4, 3, 2), (2, 4, 5), (8, 15), (7, 4)]


def test_data_dependent_outputs_get_fresh_symbols():
    m = _model([("NonZero", ["x"], ["y"], {}), ("Unique", ["x"], ["u", "i", "inv", "c"], {})],
               {"x": (F, [3, 4])}, outputs=("y", "u", "inv"))
    (r, n), (u,), (inv,) = _out_shapes(m)
    assert r == 2 and isinstance(n, str) and isinstance(u, str) and inv == 12


@pytest.mark.parametrize("attr, value, want", [
    ("value_float", 1.5, np.array(1.5, np.float32)),
    ("value_ints", [1, 2], np.array([1, 2], np.int64)),
    ("value_strings", ["a", "bc"], np.array(["a", "bc"], object)),
    ("sparse_value", helper.make_sparse_tensor(numpy_helper.from_array(np.array([5.0], np.float32)),
                                               numpy_helper.from_array(np.array([3], np.int64)), [2, 2]),
     np.array([[0, 0], [0, 5]], np.float32)),
])
def test_constant_attribute_forms(attr, value, want):
    y = _run(_model([("Constant", [], ["y"], {attr: value})], {}))
    assert y.dtype == want.dtype and y.shape == want.shape and (y == want).all()


# ---- old opset forms ----

def test_attribute_forms_of_old_opsets():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    m = _model([("Slice", ["x"], ["a"], {"starts": [1, -1], "ends": [2**62, -4], "axes": [1, 2]}),
                ("Pad", ["x"], ["b"], {"pads": [0, 1, -1, 0, 0, 2], "value": 7.0}),
                ("Split", ["x"], ["c0", "c1"], {"axis": 2, "split": [1, 3]}),
                ("TopK", ["x"], ["v", "i"], {"k": 2}),
                ("Unsqueeze", ["x"], ["u"], {"axes": [0, 4]})],
               {"x": (F, [2, 3, 4])}, outputs=("a", "b", "c1", "v", "i", "u"), opset=7)
    a, b, c1, v, i, u = _run(m, x)
    np.testing.assert_array_equal(a, x[:, 1:, -1:-4:1])
    np.testing.assert_array_equal(b, np.pad(x[:, :, 1:], [(0, 0), (1, 0), (0, 2)], constant_values=7))
    np.testing.assert_array_equal(c1, x[:, :, 1:])
    np.testing.assert_array_equal(v, x[:, :, :1:-1])
    np.testing.assert_array_equal(i, np.broadcast_to([3, 2], (2, 3, 2)))
    assert u.shape == (1, 2, 3, 4, 1)


def test_reshape_attribute_form_of_opset_1():
    x = np.arange(6, dtype=np.float32)
    m = _model([("Reshape", ["x"], ["y"], {"shape": [3, -1]})], {"x": (F, [6])}, opset=1)
    np.testing.assert_array_equal(_run(m, x), x.reshape(3, 2))


def test_topk_ties_keep_index_order():
    x = np.array([[3, 1, 3, 2, 3, 1]], np.float32)
    for largest, want in ((1, [0, 2, 4, 3]), (0, [1, 5, 3, 0])):
        m = _model([("TopK", ["x", "k"], ["v", "y"], {"largest": largest})], {"x": (F, [1, 6])},
                   inits=[("k", np.array([4], np.int64))])
        np.testing.assert_array_equal(_run(m, x), [want])


def test_slice_negative_step_clamps_start_like_onnx_not_python():
    x = np.arange(4, dtype=np.float32)
    m = _model([("Slice", ["x", "s", "e", "a", "p"], ["y"], {})], {"x": (F, [4])},
               inits=[("s", np.array([-6], np.int64)), ("e", np.array([-9], np.int64)),
                      ("a", np.array([0], np.int64)), ("p", np.array([-1], np.int64))])
    assert _out_shapes(m) == [(1,)]  # start clamps to 0, end to "before 0": Python would give []
    np.testing.assert_array_equal(_run(m, x), [0.0])


# ---- errors name the node and what went wrong ----

@pytest.mark.parametrize("nodes, inputs, inits, message", [
    ([("Reshape", ["x", "t"], ["y"], {})], {"x": (F, [2, 3])}, [("t", np.array([4, -1], np.int64))],
     "cannot reshape (2, 3) to [4, -1]"),
    ([("Concat", ["x", "z"], ["y"], {"axis": 0})], {"x": (F, [2, 3]), "z": (F, [3])}, [],
     "different ranks"),
    ([("Concat", ["x", "z"], ["y"], {"axis": 0})], {"x": (F, [2, 3]), "z": (F, [2, 4])}, [],
     "differ in dim 1"),
    ([("Squeeze", ["x", "a"], ["y"], {})], {"x": (F, [2, 3])}, [("a", np.array([1], np.int64))],
     "cannot squeeze axis 1 of size 3"),
    ([("Transpose", ["x"], ["y"], {"perm": [0, 0]})], {"x": (F, [2, 3])}, [], "not a permutation"),
    ([("Slice", ["x", "s", "s", "a", "z"], ["y"], {})], {"x": (F, [2, 3])},
     [("s", np.array([0], np.int64)), ("a", np.array([0], np.int64)), ("z", np.array([0], np.int64))],
     "must be non-zero"),
    ([("Split", ["x"], ["a", "b"], {"axis": 1})], {"x": (F, [2, 3])}, [], "does not split evenly"),
])
def test_compile_time_errors(nodes, inputs, inits, message):
    outs = tuple(nodes[0][2])
    with pytest.raises(KilnError, match=rf"{nodes[0][0]} node 'n0'.*{re.escape(message)}"):
        load_onnx(_model(nodes, inputs, outs, inits=inits))


@pytest.mark.parametrize("op, attrs, idx", [
    ("Gather", {"axis": 1}, np.array([0, 3], np.int64)),
    ("GatherElements", {"axis": 0}, np.array([[0, 0, -3]], np.int64)),
])
def test_gather_index_out_of_range_is_a_kiln_error(op, attrs, idx):
    m = _model([(op, ["x", "i"], ["y"], attrs)],
               {"x": (F, [2, 3]), "i": (TensorProto.INT64, list(idx.shape))})
    with pytest.raises(KilnError, match=f"{op} node 'n0'.*out of range"):
        _run(m, np.zeros((2, 3), np.float32), idx)


def test_reshape_runtime_element_count_mismatch():
    m = _model([("Reshape", ["x", "t"], ["y"], {})], {"x": (F, [2, 3]), "t": (TensorProto.INT64, [2])})
    with pytest.raises(KilnError, match=r"Reshape node 'n0'.*6 elements.*25 elements"):
        _run(m, np.zeros((2, 3), np.float32), np.array([5, 5], np.int64))
