"""Inputs that ONNX requires to share an element type (one type variable of the op's schema)
but do not are refused before any work, every one of them at once, each named by node, op,
input and expected vs given dtype (kiln.ops.type_constraints). A float64 initializer beside a
float32 activation used to be accepted by MatMul, Gemm and Conv and computed in float32."""

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import kiln

F, D = onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE


def _model(nodes, inputs, inits, opset=17):
    g = helper.make_graph(nodes, "m", inputs, [helper.make_tensor_value_info("y", F, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


CASES = {   # op: (x shape, weight shape, attrs)
    "MatMul": ([3, 4], (4, 5), {}),
    "Gemm": ([3, 4], (4, 5), {}),
    "Conv": ([1, 2, 5, 5], (3, 2, 3, 3), {}),
    "Add": ([3, 4], (3, 4), {}),
}


@pytest.mark.parametrize("op", sorted(CASES))
@pytest.mark.parametrize("target", ["interpreter", "cpu"])
def test_a_float64_initializer_into_a_float32_op_is_refused(op, target):
    xs, ws, attrs = CASES[op]
    w = np.random.default_rng(0).standard_normal(ws)       # float64
    m = _model([helper.make_node(op, ["x", "w"], ["y"], name="n0", **attrs)],
               [helper.make_tensor_value_info("x", F, xs)], [numpy_helper.from_array(w, "w")])
    with pytest.raises(kiln.DTypeMismatchError) as e:
        kiln.compile(m, target=target)
    assert isinstance(e.value, kiln.KilnError) and (e.value.node, e.value.op) == ("n0", op)
    assert f"{op} node 'n0': input 1 ('w') is float64, expected float32 (type T, as input 0 ('x'))" in str(e.value)
    # the same model with the weight in float32 compiles and computes what the reference does
    m.graph.initializer[0].CopyFrom(numpy_helper.from_array(w.astype(np.float32), "w"))
    x = np.random.default_rng(1).standard_normal(xs).astype(np.float32)
    got = kiln.compile(m, target=target).run({"x": x})["y"]
    want = kiln.compile(m, target="interpreter").run({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_every_mismatch_is_listed_at_once_and_the_optional_bias_too():
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Gemm", ["r", "w2", "c"], ["y"], name="gemm")]
    inits = [numpy_helper.from_array(rng.standard_normal((4, 4)), "w"),                   # float64
             numpy_helper.from_array(rng.standard_normal((4, 2)).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.standard_normal(2).astype(np.float16), "c")]     # float16 bias
    with pytest.raises(kiln.DTypeMismatchError) as e:
        kiln.load_onnx(_model(nodes, [helper.make_tensor_value_info("x", F, [3, 4])], inits))
    msg = str(e.value)
    assert msg.startswith("[infer] 2 input(s) of the wrong element type")
    assert "MatMul node 'mm': input 1 ('w') is float64, expected float32" in msg
    assert "Gemm node 'gemm': input 2 ('c') is float16, expected float32 (type T, as input 0 ('r'))" in msg
    assert [p[:3] for p in e.value.problems] == [("mm", "MatMul", 1), ("gemm", "Gemm", 2)]


def test_a_mismatch_an_ops_own_inference_refuses_is_still_listed_with_the_others():
    """Add's inference refuses mixed types itself; the mismatch before it is named too."""
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Add", ["h", "b"], ["y"], name="add")]
    inits = [numpy_helper.from_array(rng.standard_normal((4, 4)), "w"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.int64), "b")]
    with pytest.raises(kiln.DTypeMismatchError) as e:
        kiln.load_onnx(_model(nodes, [helper.make_tensor_value_info("x", F, [3, 4])], inits))
    assert [p[:3] for p in e.value.problems] == [("mm", "MatMul", 1), ("add", "Add", 1)]


def test_separate_type_variables_and_heterogeneous_variadics_may_differ():
    """Pow(T, T1), Where(B, T, T), Loop's state (V, heterogeneous) mix element types legally."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    nodes = [helper.make_node("Pow", ["x", "e"], ["p"], name="pow"),
             helper.make_node("Greater", ["x", "z"], ["c"], name="gt"),
             helper.make_node("Where", ["c", "p", "x"], ["y"], name="where")]
    inits = [numpy_helper.from_array(np.array(2, np.int64), "e"), numpy_helper.from_array(np.float32(0), "z")]
    m = _model(nodes, [helper.make_tensor_value_info("x", F, [2, 3])], inits)
    got = kiln.compile(m, target="interpreter").run({"x": x})["y"]
    np.testing.assert_allclose(got, np.where(x > 0, x ** 2, x), rtol=1e-6)
