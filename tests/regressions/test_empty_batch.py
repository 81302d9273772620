"""Found by the fuzzer: empty tensors. An empty batch (N = 0) made the NumPy references of Conv, ConvTranspose,
MaxPool and GroupNormalization fail (`reshape(..., -1)` cannot infer -1 from 0 elements).
Every op here is checked on N = 0 at every -O level, cpu against the interpreter."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from kiln.testing.differential import check_case

F = TensorProto.FLOAT


def _model(node, x_shape, y_shape, inits=(), opset=18):
    g = helper.make_graph([node], "m", [helper.make_tensor_value_info("x", F, x_shape)],
                          [helper.make_tensor_value_info("y", F, y_shape)], list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _c(name, arr):
    return numpy_helper.from_array(np.asarray(arr, np.float32), name)


rng = np.random.default_rng(0)
CASES = {
    "Conv": (helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]), [0, 3, 5, 5], [0, 4, 5, 5],
             [_c("w", rng.standard_normal((4, 3, 3, 3)))]),
    "Conv1d_grouped": (helper.make_node("Conv", ["x", "w"], ["y"], group=2), [0, 4, 6], [0, 2, 4],
                       [_c("w", rng.standard_normal((2, 2, 3)))]),
    "ConvTranspose": (helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2]), [0, 3, 4, 4],
                      [0, 2, 9, 9], [_c("w", rng.standard_normal((3, 2, 3, 3)))]),
    "MaxPool": (helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2]), [0, 2, 4, 4], [0, 2, 3, 3], []),
    "AveragePool": (helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2]), [0, 2, 4, 4],
                    [0, 2, 3, 3], []),
    "GroupNormalization": (helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2),
                           [0, 4, 3, 3], [0, 4, 3, 3], [_c("s", np.ones(2)), _c("b", np.zeros(2))]),
    "InstanceNormalization": (helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"]), [0, 2, 3, 3],
                              [0, 2, 3, 3], [_c("s", np.ones(2)), _c("b", np.zeros(2))]),
    "Resize": (helper.make_node("Resize", ["x", "", "sc"], ["y"], mode="linear"), [0, 2, 3, 3], [0, 2, 6, 6],
               [_c("sc", [1, 1, 2, 2])]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_empty_batch(name):
    node, xs, ys, inits = CASES[name]
    m = _model(node, xs, ys, inits)
    found = check_case(m.SerializeToString(), {"x": np.zeros(xs, np.float32)}, (0, 1, 2, 3), use_ort=False)
    assert not found, "\n".join(map(str, found))


@pytest.mark.parametrize("mode", ["reflect", "edge"])
def test_pad_empty_tensor_along_other_axes(mode):
    """Found by the fuzzer: reflect/edge Pad of a (3, 2, 0) tensor along axis 1 was refused
    ('cannot reflect-pad an empty tensor'); only padding the empty axis itself has nothing to
    mirror (ONNX Runtime refuses that too)."""
    pads = numpy_helper.from_array(np.array([1, 1, 0, 0, 1, 0]), "p")
    m = _model(helper.make_node("Pad", ["x", "p"], ["y"], mode=mode), [3, 2, 0], [4, 4, 0], [pads])
    found = check_case(m.SerializeToString(), {"x": np.zeros((3, 2, 0), np.float32)}, (0, 1, 2, 3))
    assert not found, "\n".join(map(str, found))
    bad = numpy_helper.from_array(np.array([0, 0, 1, 0, 0, 0]), "p")
    m = _model(helper.make_node("Pad", ["x", "p"], ["y"], mode=mode), [3, 2, 0], [3, 2, 1], [bad])
    (f,) = check_case(m.SerializeToString(), {"x": np.zeros((3, 2, 0), np.float32)}, (0,), use_ort=False)
    assert f.kind == "error" and f"cannot {mode}-pad axis 2" in f.message


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("opset,axis,shape", [(13, -1, [3, 0]), (13, 0, [0, 4]), (11, 1, [2, 0, 3]), (11, 0, [0, 3])])
def test_normalizations_of_empty_tensors(op, opset, axis, shape):
    """Found by the fuzzer: LogSoftmax (and Softmax) of an empty tensor failed in the reference
    (np.max of a zero-size slice; opset < 13's 2-D coercion reshaped with -1)."""
    m = _model(helper.make_node(op, ["x"], ["y"], axis=axis), shape, shape, opset=opset)
    found = check_case(m.SerializeToString(), {"x": np.zeros(shape, np.float32)}, (0, 1, 2, 3), use_ort=False)
    assert not found, "\n".join(map(str, found))


def test_squeeze_of_empty_tensor_simplified_to_reshape():
    """Found by the fuzzer: -O2's simplify_algebra turned Squeeze(1, 0, 5) into Reshape to [0, 5],
    where ONNX's 0 means 'copy the input's dim' (1): 'cannot reshape (1, 0, 5) to [0, 5]'. The
    rewrite now sets allowzero when the static shape holds an empty dim."""
    axes = numpy_helper.from_array(np.array([0]), "a")
    g = helper.make_graph([helper.make_node("Squeeze", ["x", "a"], ["y"]), helper.make_node("Relu", ["y"], ["z"])],
                          "m", [helper.make_tensor_value_info("x", F, [1, 0, 5])],
                          [helper.make_tensor_value_info("z", F, [0, 5])], [axes])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    found = check_case(m.SerializeToString(), {"x": np.zeros((1, 0, 5), np.float32)}, (0, 1, 2, 3), use_ort=False)
    assert not found, "\n".join(map(str, found))


@pytest.mark.parametrize("a,b", [((0, 7, 3), (3, 2)), ((0, 7, 3), (1, 3, 2)), ((1, 7, 3), (0, 3, 2)),
                                 ((2, 0, 7, 3), (1, 1, 3, 2)), ((7, 3), (0, 3, 2))])
def test_matmul_with_an_empty_batch(a, b):
    """Found by the fuzzer: the GEMM lowering broadcast batch dims with max(), so an empty batch
    against 1 (or a missing dim) gave 1: 'lowering of output 0 gives float32[1, 7, 2],
    inference says float32[0,7,2]'."""
    w = numpy_helper.from_array(np.ones(b, np.float32), "w")
    m = _model(helper.make_node("MatMul", ["x", "w"], ["y"]), list(a), None, [w])
    found = check_case(m.SerializeToString(), {"x": np.zeros(a, np.float32)}, (0, 1, 2, 3), use_ort=False)
    assert not found, "\n".join(map(str, found))
