"""Regressions from issue 10, each from a minimal graph, at every -O level against the interpreter.

1. An anchor (Conv, MatMul) whose fused epilogue ends in an activation written with `_let`
   stages (Sigmoid, Softplus, Elu, ...) failed to schedule: the `_let` stage stayed a separate
   reader of the anchor's accumulator, so the anchor's `compute_at` found a use outside its loop.
2. A declared dim of -1 ("any size" in old exporters) was kept as the literal size -1, and
   every real input was refused.
"""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln

F = TensorProto.FLOAT
LEVELS = (0, 1, 2, 3)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "m", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _check_all_levels(model, feeds, rtol=1e-4, atol=1e-5):
    want = kiln.compile(model, target="interpreter", opt_level=0).run(feeds)
    for level in LEVELS:
        got = kiln.compile(model, target="cpu", opt_level=level).run(feeds)
        for name, ref in want.items():
            np.testing.assert_allclose(got[name], ref, rtol=rtol, atol=atol,
                                       err_msg=f"output {name} at -O{level}")


def _conv_epilogue(cout, nd, tail, rng):
    x = helper.make_tensor_value_info("x", F, [1, 3] + [7] * nd)
    w = numpy_helper.from_array(rng.standard_normal((cout, 3) + (3,) * nd).astype(np.float32), "w")
    nodes, prev = [helper.make_node("Conv", ["x", "w"], ["c"])], "c"
    for k, op in enumerate(tail):
        nodes.append(helper.make_node(op, [prev], [f"t{k}"]))
        prev = f"t{k}"
    return _model(nodes, [x], [helper.make_tensor_value_info(prev, F, None)], [w])


@pytest.mark.parametrize("cout", [1, 2, 4])
@pytest.mark.parametrize("nd", [1, 2])
def test_conv_sigmoid_epilogue(cout, nd):
    rng = np.random.default_rng(cout * 10 + nd)
    m = _conv_epilogue(cout, nd, ["Sigmoid"], rng)
    _check_all_levels(m, {"x": rng.standard_normal((1, 3) + (7,) * nd).astype(np.float32)})


@pytest.mark.parametrize("tail", [["Sigmoid", "Relu"], ["Softplus"], ["Elu"], ["Relu", "Sigmoid"]])
def test_conv_let_activation_chains(tail):
    rng = np.random.default_rng(len(tail))
    m = _conv_epilogue(4, 2, tail, rng)
    _check_all_levels(m, {"x": rng.standard_normal((1, 3, 7, 7)).astype(np.float32)})


@pytest.mark.parametrize("op", ["Sigmoid", "Celu"])
def test_matmul_let_epilogue(op):
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((5, 6)).astype(np.float32), "w")
    m = _model([helper.make_node("MatMul", ["x", "w"], ["c"]), helper.make_node(op, ["c"], ["y"])],
               [helper.make_tensor_value_info("x", F, [4, 5])],
               [helper.make_tensor_value_info("y", F, None)], [w])
    _check_all_levels(m, {"x": rng.standard_normal((4, 5)).astype(np.float32)})


def test_conv1d_sigmoid_inside_if_branch():
    rng = np.random.default_rng(2)
    w = numpy_helper.from_array(rng.standard_normal((2, 3, 3)).astype(np.float32), "w")
    then = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"]),
                              helper.make_node("Sigmoid", ["c"], ["ty"])], "then", [],
                             [helper.make_tensor_value_info("ty", F, None)], [w])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["ey"])], "else", [],
                              [helper.make_tensor_value_info("ey", F, None)])
    m = _model([helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)],
               [helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
                helper.make_tensor_value_info("x", F, [1, 3, 9])],
               [helper.make_tensor_value_info("y", F, None)])
    x = rng.standard_normal((1, 3, 9)).astype(np.float32)
    _check_all_levels(m, {"cond": np.array(True), "x": x})


def test_minus_one_dims_are_fresh_symbols():
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((3, 3, 3, 3)).astype(np.float32), "w")
    m = _model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                helper.make_node("Relu", ["c"], ["y"])],
               [helper.make_tensor_value_info("x", F, [-1, 3, -1, -1])],
               [helper.make_tensor_value_info("y", F, [-1, 3, -1, -1])], [w])
    g = kiln.load_onnx(m)
    shape = g.inputs[0].type.shape
    assert shape[1] == 3 and all(isinstance(d, str) for d in (shape[0], shape[2], shape[3]))
    assert len({shape[0], shape[2], shape[3]}) == 3        # independent sizes, not one symbol
    for target in ("interpreter", "cpu"):
        cm = kiln.compile(m, target=target)
        for dims in [(1, 3, 48, 192), (2, 3, 5, 7)]:
            x = rng.standard_normal(dims).astype(np.float32)
            assert cm(x).shape == dims
    _check_all_levels(m, {"x": rng.standard_normal((1, 3, 6, 5)).astype(np.float32)})
