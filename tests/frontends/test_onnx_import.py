"""ONNX import: good models load with kiln's own types; bad ones give a KilnError saying what and where."""

import os

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import kiln
from kiln.graph.types import TensorType
from tests.helpers import small_cnn_model

F = onnx.TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "m", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _relu_model():
    return _model([helper.make_node("Relu", ["x"], ["y"], name="r")],
                  [helper.make_tensor_value_info("x", F, ["batch", 4])],
                  [helper.make_tensor_value_info("y", F, ["batch", 4])])


def test_symbols_and_inferred_types():
    g = kiln.load_onnx(_relu_model())
    assert g.inputs[0].type == TensorType(kiln.dtypes.DType.float32, ("batch", 4))
    assert g.outputs[0].type.shape == ("batch", 4)
    m = kiln.compile(_relu_model(), target="interpreter")
    assert m.inputs[0].shape == ("batch", 4) and m.outputs[0].dtype == "float32"
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_array_equal(m(x), np.maximum(x, 0))


def test_initializer_listed_as_input_is_a_constant(tmp_path):
    w = numpy_helper.from_array(np.arange(4, dtype=np.float32) + 1, "w")
    m = _model([helper.make_node("Mul", ["x", "w"], ["y"])],
               [helper.make_tensor_value_info("x", F, [4]), helper.make_tensor_value_info("w", F, [4])],
               [helper.make_tensor_value_info("y", F, [4])], [w])
    g = kiln.load_onnx(m)
    assert [v.name for v in g.inputs] == ["x"]
    assert g.nodes[0].inputs[1].is_const


def test_declared_shape_contradicting_initializer():
    w = numpy_helper.from_array(np.ones(4, np.float32), "w")
    m = _model([helper.make_node("Mul", ["x", "w"], ["y"])],
               [helper.make_tensor_value_info("x", F, [4]), helper.make_tensor_value_info("w", F, [5])],
               [helper.make_tensor_value_info("y", F, [4])], [w])
    with pytest.raises(kiln.KilnError, match=r"'w' is declared as float32\[5\].*float32\[4\]"):
        kiln.load_onnx(m)


def test_truncated_file(tmp_path):
    data = small_cnn_model().SerializeToString()
    p = tmp_path / "cut.onnx"
    p.write_bytes(data[: len(data) // 3])
    with pytest.raises(kiln.KilnError, match="not a valid ONNX model"):
        kiln.load_onnx(str(p))


def test_not_an_onnx_file(tmp_path):
    p = tmp_path / "x.onnx"
    p.write_text("this is plainly not a protobuf\n" * 10)
    with pytest.raises(kiln.KilnError, match="not a valid ONNX model"):
        kiln.compile(str(p), target="interpreter")


def test_missing_file():
    with pytest.raises(kiln.KilnError, match="not found"):
        kiln.load_onnx("/nonexistent/model.onnx")


def test_unknown_ops_listed_all_at_once():
    m = _model([helper.make_node("FancyOp", ["x"], ["a"], name="first"),
                helper.make_node("Relu", ["a"], ["b"], name="ok"),
                helper.make_node("Frobnicate", ["b"], ["y"], name="second", domain="com.acme")],
               [helper.make_tensor_value_info("x", F, [2])],
               [helper.make_tensor_value_info("y", F, [2])])
    m.opset_import.append(helper.make_opsetid("com.acme", 1))
    with pytest.raises(kiln.UnsupportedOpsError) as e:
        kiln.load_onnx(m)
    msg = str(e.value)
    assert "2 unsupported" in msg and "'first'" in msg and "'second'" in msg
    assert "com.acme::Frobnicate" in msg and "ok" not in msg.replace("unsupported", "")


def test_undefined_node_input():
    m = _model([helper.make_node("Relu", ["nope"], ["y"], name="r")],
               [helper.make_tensor_value_info("x", F, [2])],
               [helper.make_tensor_value_info("y", F, [2])])
    with pytest.raises(kiln.KilnError, match=r"Relu node 'r'.*'nope'"):
        kiln.load_onnx(m)


def _external_model(tmp_path, location):
    w = numpy_helper.from_array(np.arange(4, dtype=np.float32), "w")
    w.data_location = onnx.TensorProto.EXTERNAL
    w.ClearField("raw_data")
    for k, v in (("location", location), ("offset", "0"), ("length", "16")):
        e = w.external_data.add()
        e.key, e.value = k, v
    m = _model([helper.make_node("Add", ["x", "w"], ["y"])],
               [helper.make_tensor_value_info("x", F, [4])],
               [helper.make_tensor_value_info("y", F, [4])], [w])
    path = tmp_path / "model.onnx"
    path.write_bytes(m.SerializeToString())
    return path


def test_external_data_loads(tmp_path):
    (tmp_path / "weights.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes() * 2)
    path = _external_model(tmp_path, "weights.bin")
    g = kiln.load_onnx(str(path))
    np.testing.assert_array_equal(g.nodes[0].inputs[1].const, np.arange(4, dtype=np.float32))


def test_external_data_cannot_escape_model_folder(tmp_path):
    inner = tmp_path / "model_dir"
    inner.mkdir()
    (tmp_path / "secret.bin").write_bytes(b"\0" * 16)
    path = _external_model(inner, "../secret.bin")
    with pytest.raises(kiln.KilnError, match="escapes the model folder"):
        kiln.load_onnx(str(path))
    path = _external_model(inner, os.path.abspath(tmp_path / "secret.bin"))
    with pytest.raises(kiln.KilnError, match="escapes the model folder"):
        kiln.load_onnx(str(path))


def test_unknown_target_and_option():
    with pytest.raises(kiln.KilnError, match="unknown target"):
        kiln.compile(_relu_model(), target="tpu")
    with pytest.raises(kiln.KilnError, match="unknown compile option"):
        kiln.compile(_relu_model(), target="interpreter", frobs=1)


@pytest.mark.parametrize("feeds, match", [
    ({"q": np.zeros((1, 4), np.float32)}, r"unknown input name.*\['q'\]"),
    ({"x": np.zeros((1, 4), np.float64)}, r"input 'x': expected dtype float32, given float64"),
    ({"x": np.zeros((2, 5), np.float32)}, r"input 'x': expected shape \(batch, 4\), given \(2, 5\)"),
    ({"x": np.zeros((4,), np.float32)}, r"rank 2"),
    ({}, r"missing input"),
])
def test_run_time_input_validation(feeds, match):
    m = kiln.compile(_relu_model(), target="interpreter")
    with pytest.raises(kiln.KilnError, match=match):
        m.run(feeds)


def test_symbol_bound_consistently_across_inputs():
    m = _model([helper.make_node("Add", ["a", "b"], ["y"])],
               [helper.make_tensor_value_info("a", F, ["n"]), helper.make_tensor_value_info("b", F, ["n"])],
               [helper.make_tensor_value_info("y", F, ["n"])])
    cm = kiln.compile(m, target="interpreter")
    with pytest.raises(kiln.KilnError, match="symbol 'n'"):
        cm.run({"a": np.ones(3, np.float32), "b": np.ones(4, np.float32)})
