"""Build the bundled example model: a small CNN classifier with seeded random weights.

Nothing is downloaded: the model is made here with onnx.helper.
Usage: python examples/build_example.py [OUT.onnx]
"""

from __future__ import annotations

import sys

import numpy as np
import onnx
from onnx import helper, numpy_helper


def build_small_cnn(seed: int = 0, batch: int | str = 1) -> onnx.ModelProto:
    """Conv-BN-ReLU-Pool ×2, then Flatten-Gemm-Softmax over a 1×3×32×32 image."""
    rng = np.random.default_rng(seed)

    def w(name, *shape, scale=0.1):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    inits = [
        w("c1_w", 16, 3, 3, 3), w("c1_b", 16),
        numpy_helper.from_array((1 + 0.1 * rng.standard_normal(16)).astype(np.float32), "bn_s"),
        w("bn_b", 16), w("bn_m", 16),
        numpy_helper.from_array((1 + rng.random(16)).astype(np.float32), "bn_v"),
        w("c2_w", 32, 16, 3, 3), w("c2_b", 32),
        w("fc_w", 10, 32 * 8 * 8, scale=0.02), w("fc_b", 10),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "c1_w", "c1_b"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("BatchNormalization", ["c1", "bn_s", "bn_b", "bn_m", "bn_v"], ["bn1"], name="bn1"),
        helper.make_node("Relu", ["bn1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="pool1"),
        helper.make_node("Conv", ["p1", "c2_w", "c2_b"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("MaxPool", ["r2"], ["p2"], kernel_shape=[2, 2], strides=[2, 2], name="pool2"),
        helper.make_node("Flatten", ["p2"], ["f"], axis=1, name="flatten"),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["logits"], transB=1, name="fc"),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=1, name="softmax"),
    ]
    graph = helper.make_graph(
        nodes, "small_cnn",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [batch, 3, 32, 32])],
        [helper.make_tensor_value_info("probs", onnx.TensorProto.FLOAT, [batch, 10])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="kiln-examples")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "small_cnn.onnx"
    onnx.save(build_small_cnn(), out)
    print(f"wrote {out}")
