"""Small ONNX models for the tuner's tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

F = onnx.TensorProto.FLOAT


def matmul(m=48, k=96, n=80, trans_b=False, batch=()) -> onnx.ModelProto:
    """y = a @ b (or a @ b^T via Gemm), both inputs."""
    if trans_b:
        node = helper.make_node("Gemm", ["a", "b"], ["y"], transB=1, name="mm")
        shapes = ([m, k], [n, k], [m, n])
    else:
        node = helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")
        shapes = ([*batch, m, k], [*batch, k, n], [*batch, m, n])
    g = helper.make_graph([node], "mm", [helper.make_tensor_value_info("a", F, shapes[0]),
                                         helper.make_tensor_value_info("b", F, shapes[1])],
                          [helper.make_tensor_value_info("y", F, shapes[2])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def two_layers(m=32, k=64, seed=0) -> onnx.ModelProto:
    """Two identical Linear+Relu layers (other weights) then a different one: 2 tasks, weights 2 and 1."""
    rng = np.random.default_rng(seed)
    inits, nodes, x = [], [], "x"
    for i, n in enumerate((k, k, 16)):
        w = numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), f"w{i}")
        inits.append(w)
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"h{i}"]), helper.make_node("Relu", [f"h{i}"], [f"r{i}"])]
        x = f"r{i}"
    g = helper.make_graph(nodes, "layers", [helper.make_tensor_value_info("x", F, [m, k])],
                          [helper.make_tensor_value_info(x, F, [m, 16])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def conv_net(n=1, c=32, hw=12, seed=0) -> onnx.ModelProto:
    """3x3 conv + Relu, 1x1 conv, 3x3 stride-2 conv, 1x1 conv (channels c, c, c, 16): convs the
    chooser gives Winograd, blocked and NCHW direct convs, each with other legal algorithms."""
    rng = np.random.default_rng(seed)
    specs = [(c, c, 3, 1, 1, "Relu"), (c, c, 1, 1, 0, None), (c, c, 3, 2, 1, "Relu"), (c, 16, 1, 1, 0, None)]
    inits, nodes, x, size = [], [], "x", hw
    for i, (ci, co, k, s, p, act) in enumerate(specs):
        inits += [numpy_helper.from_array((rng.standard_normal((co, ci, k, k)) / np.sqrt(ci * k * k)).astype(np.float32),
                                          f"w{i}"),
                  numpy_helper.from_array(rng.standard_normal(co).astype(np.float32), f"b{i}")]
        out = f"c{i}" if act else f"y{i}"
        nodes.append(helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [out], name=f"conv{i}", kernel_shape=[k, k],
                                      strides=[s, s], pads=[p] * 4))
        if act:
            nodes.append(helper.make_node(act, [out], [f"y{i}"], name=f"act{i}"))
        x, size = f"y{i}", (size + 2 * p - k) // s + 1
    g = helper.make_graph(nodes, "convs", [helper.make_tensor_value_info("x", F, [n, c, hw, hw])],
                          [helper.make_tensor_value_info(x, F, [n, 16, size, size])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
