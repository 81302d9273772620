"""kiln.onnx_backend follows onnx.backend.base and honours KILN_TARGET."""

import numpy as np
import onnx
import pytest
from onnx import helper

import kiln
from kiln import onnx_backend


def _model():
    g = helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "m",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_run_model_and_run_node():
    x = np.array([1.5, -2.0, 3.0], np.float32)
    (y,) = onnx_backend.run_model(_model(), [x], target="interpreter")
    np.testing.assert_array_equal(y, -x)
    (y,) = onnx_backend.run_node(helper.make_node("Neg", ["a"], ["b"]), [x], target="interpreter")
    np.testing.assert_array_equal(y, -x)


def test_supports_device():
    assert onnx_backend.supports_device("CPU")
    assert not onnx_backend.supports_device("CUDA")


def test_default_target_is_cpu_and_env_overrides(monkeypatch):
    monkeypatch.delenv("KILN_TARGET", raising=False)
    assert onnx_backend.default_target() == "cpu"
    monkeypatch.setenv("KILN_TARGET", "interpreter")
    rep = onnx_backend.prepare(_model())
    assert rep.compiled.target == "interpreter"
    monkeypatch.setenv("KILN_TARGET", "bogus")
    with pytest.raises(kiln.KilnError, match="unknown target 'bogus'"):
        onnx_backend.prepare(_model())
