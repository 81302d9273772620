"""A small two-input, two-output model with weights, for artifact and CLI tests.

y = Relu(x * w + s), z = x + b, with x, s: float32[batch, 4] — only ops the cpu
target lowers natively, so tests stay fast and independent of the big models.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

W = np.array([1.5, -2.0, 0.5, 3.0], np.float32)
B = np.array([0.25, 0.5, -1.0, 2.0], np.float32)


def elementwise_model(batch: int | str = "batch") -> onnx.ModelProto:
    nodes = [helper.make_node("Mul", ["x", "w"], ["a"], name="scale"),
             helper.make_node("Add", ["a", "s"], ["c"], name="shift"),
             helper.make_node("Relu", ["c"], ["y"], name="relu"),
             helper.make_node("Add", ["x", "b"], ["z"], name="bias")]
    io = lambda name: helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [batch, 4])  # noqa: E731
    graph = helper.make_graph(nodes, "elementwise", [io("x"), io("s")], [io("y"), io("z")],
                              [numpy_helper.from_array(W, "w"), numpy_helper.from_array(B, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="kiln-tests")
    model.ir_version = 8
    return model


def reference(x: np.ndarray, s: np.ndarray) -> dict[str, np.ndarray]:
    """What the model computes, in NumPy."""
    return {"y": np.maximum(x * W + s, 0), "z": x + B}


def inputs(batch: int = 2, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal((batch, 4)).astype(np.float32) for k in ("x", "s")}


def narrow_model() -> onnx.ModelProto:
    """Storage-only and half dtypes at the model's edge: y = Relu(x) in bfloat16,
    z = h + float16(x) in float16, with x: bfloat16[2, 4], h: float16[2, 4]."""
    T = onnx.TensorProto
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu"),
             helper.make_node("Cast", ["x"], ["xh"], name="cast", to=T.FLOAT16),
             helper.make_node("Add", ["h", "xh"], ["z"], name="add")]
    io = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "narrow", [io("x", T.BFLOAT16, [2, 4]), io("h", T.FLOAT16, [2, 4])],
                              [io("y", T.BFLOAT16, [2, 4]), io("z", T.FLOAT16, [2, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="kiln-tests")
    model.ir_version = 8
    return model


def narrow_inputs(seed: int = 0) -> dict[str, np.ndarray]:
    import ml_dtypes
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((2, 4)).astype(ml_dtypes.bfloat16),
            "h": rng.standard_normal((2, 4)).astype(np.float16)}


def narrow_reference(x: np.ndarray, h: np.ndarray) -> dict[str, np.ndarray]:
    return {"y": np.maximum(x, 0).astype(x.dtype), "z": h + x.astype(np.float16)}
