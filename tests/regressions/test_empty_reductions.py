"""Found by the fuzzer's slow budget (seeds 100232, 101523, 102199): reductions over an empty axis.

A reduction with an identity (ReduceSum 0, ReduceMax -inf, ... as ONNX's Reduce* specs say)
gives it; the loop level now makes any reduction over a static empty range its combiner's
identity (seeds 101523, 102199: cpu refused LayerNorm and InstanceNorm over a dim of 0 with
"reduce_axis 'r0' has an empty range", the outputs being empty anyway). ArgMax/ArgMin and the
global pools have no value for an empty set (ONNX Runtime refuses them too): a KilnError naming
the node, op and shape, at compile time when the extent is static, at run time when it is a
symbol (seed 100232: the reference raised NumPy's bare "attempt to get argmax of an empty
sequence").
"""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.errors import KilnError
from kiln.testing.differential import check_case

F = TensorProto.FLOAT


def _model(nodes, x_shape, outs, inits=(), opset=18, out_type=F):
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", F, x_shape)],
                          [helper.make_tensor_value_info(o, out_type, None) for o in outs], list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8 if opset <= 18 else 10
    return m


def _c(name, arr, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(arr, dtype), name)


def _symbolic(shape):
    return [f"d{i}" for i in range(len(shape))]


# ---- no identity: a KilnError naming node, op, input shape

NO_IDENTITY = {
    "ArgMax": (helper.make_node("ArgMax", ["x"], ["y"], name="am", axis=1, keepdims=0), [3, 0], "axis 1"),
    "ArgMin": (helper.make_node("ArgMin", ["x"], ["y"], name="am", axis=-1, select_last_index=1), [2, 3, 0],
               "axis 2"),
    "GlobalMaxPool": (helper.make_node("GlobalMaxPool", ["x"], ["y"], name="gp"), [1, 2, 0, 4], "axis 2"),
    "GlobalAveragePool": (helper.make_node("GlobalAveragePool", ["x"], ["y"], name="gp"), [1, 2, 3, 0], "axis 3"),
    "GlobalLpPool": (helper.make_node("GlobalLpPool", ["x"], ["y"], name="gp"), [1, 2, 0], "axis 2"),
}


@pytest.mark.parametrize("target", ["interpreter", "cpu"])
@pytest.mark.parametrize("op", sorted(NO_IDENTITY))
def test_no_identity_static_extent_fails_at_compile_time(op, target):
    node, shape, axis = NO_IDENTITY[op]
    out = TensorProto.INT64 if op.startswith("Arg") else F
    with pytest.raises(KilnError) as e:
        kiln.compile(_model([node], shape, ["y"], out_type=out), target=target)
    msg = str(e.value)
    assert f"{op} node '{node.name}'" in msg and str(tuple(shape)) in msg and axis in msg, msg


@pytest.mark.parametrize("target", ["interpreter", "cpu"])
@pytest.mark.parametrize("op", sorted(NO_IDENTITY))
def test_no_identity_symbolic_extent_fails_at_run_time(op, target):
    node, shape, axis = NO_IDENTITY[op]
    out = TensorProto.INT64 if op.startswith("Arg") else F
    m = kiln.compile(_model([node], _symbolic(shape), ["y"], out_type=out), target=target)
    with pytest.raises(KilnError) as e:
        m.run({"x": np.zeros(shape, np.float32)})
    msg = str(e.value)
    assert f"{op} node '{node.name}'" in msg and str(tuple(shape)) in msg and axis in msg, msg
    # the same model still serves non-empty inputs
    ok = [d or 2 for d in shape]
    m.run({"x": np.random.default_rng(0).random(ok, dtype=np.float32)})


def test_argmax_of_an_empty_tensor_along_a_non_empty_axis_is_empty():
    """Only the reduced axis must be non-empty: (0, 5) along axis 1 is an empty result."""
    m = _model([helper.make_node("ArgMax", ["x"], ["y"], axis=1, keepdims=0)], [0, 5], ["y"],
               out_type=TensorProto.INT64)
    found = check_case(m.SerializeToString(), {"x": np.zeros((0, 5), np.float32)}, (0, 1, 2, 3), use_ort=False)
    assert not found, "\n".join(map(str, found))


# ---- an identity, or an empty output: cpu at every level agrees with the interpreter

def _ln(outs=("y",)):
    return [helper.make_node("LayerNormalization", ["x", "s", "b"], list(outs), axis=-1)]


IDENTITY = {
    # seed 101523's pattern: LayerNorm over a last dim of 0 (ORT refuses it; the output is empty)
    "LayerNormalization": (_ln(), [3, 0], ["y"], [_c("s", np.ones(0)), _c("b", np.zeros(0))], 18),
    # its Mean and InvStdDev are not empty: the mean of nothing (NaN, as ReduceMean's NumPy)
    "LayerNormalization_stats": (_ln(("y", "m", "r")), [3, 0], ["y", "m", "r"],
                                 [_c("s", np.ones(0)), _c("b", np.zeros(0))], 18),
    # seed 102199's pattern: InstanceNorm over a spatial dim of 0
    "InstanceNormalization": ([helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"])], [4, 4, 2, 0],
                              ["y"], [_c("s", np.ones(4)), _c("b", np.zeros(4))], 18),
    "GroupNormalization": ([helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2)],
                           [2, 4, 0], ["y"], [_c("s", np.ones(4)), _c("b", np.zeros(4))], 21),
    "MeanVarianceNormalization": ([helper.make_node("MeanVarianceNormalization", ["x"], ["y"])], [2, 3, 0, 4],
                                  ["y"], [], 18),
    "LpNormalization": ([helper.make_node("LpNormalization", ["x"], ["y"], axis=1)], [3, 0], ["y"], [], 18),
    # no input channels: the output is the bias (an empty sum plus b)
    "Conv": ([helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
             [1, 0, 6, 6], ["y"], [_c("w", np.ones((16, 0, 3, 3))), _c("b", np.arange(16))], 18),
    "ConvTranspose": ([helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], kernel_shape=[1, 1])],
                      [1, 0, 3, 3], ["y"], [_c("w", np.ones((0, 2, 1, 1))), _c("b", [1, 2])], 18),
    # no channel: the reference's sliding window over channels failed (NumPy's "window shape
    # cannot be larger than input array shape")
    "LRN": ([helper.make_node("LRN", ["x"], ["y"], size=3)], [1, 0, 3, 3], ["y"], [], 18),
    # an empty normalization read by a reduction: the sum of nothing
    "LayerNormalization_then_ReduceSum": (_ln(("t",)) + [helper.make_node("ReduceSum", ["t"], ["y"], keepdims=1)],
                                          [3, 0], ["y"], [_c("s", np.ones(0)), _c("b", np.zeros(0))], 18),
}


@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic"])
@pytest.mark.parametrize("name", sorted(IDENTITY))
def test_empty_reduction_matches_the_reference(name, symbolic):
    nodes, shape, outs, inits, opset = IDENTITY[name]
    m = _model(nodes, _symbolic(shape) if symbolic else shape, outs, inits, opset)
    found = check_case(m.SerializeToString(), {"x": np.zeros(shape, np.float32)}, (0, 1, 2, 3), use_ort=False)
    assert not found, "\n".join(map(str, found))


SPEC_IDENTITY = {"ReduceSum": 0.0, "ReduceProd": 1.0, "ReduceMax": -np.inf, "ReduceMin": np.inf,
                 "ReduceL1": 0.0, "ReduceL2": 0.0, "ReduceSumSquare": 0.0, "ReduceLogSum": -np.inf,
                 "ReduceLogSumExp": -np.inf}


@pytest.mark.parametrize("op", sorted(SPEC_IDENTITY))
def test_reduce_over_an_empty_axis_gives_the_spec_identity(op):
    m = _model([helper.make_node(op, ["x", "axes"], ["y"], keepdims=1)], [3, 0], ["y"],
               [_c("axes", [1], np.int64)])
    for target in ("interpreter", "cpu"):
        y = kiln.compile(m, target=target).run({"x": np.zeros((3, 0), np.float32)})["y"]
        assert y.shape == (3, 1) and (y == SPEC_IDENTITY[op]).all(), (target, y)


def test_conv_without_input_channels_is_its_bias():
    nodes, shape, outs, inits, opset = IDENTITY["Conv"]
    y = kiln.compile(_model(nodes, shape, outs, inits, opset), target="cpu").run(
        {"x": np.zeros(shape, np.float32)})["y"]
    assert y.shape == (1, 16, 6, 6) and (y == np.arange(16, dtype=np.float32)[None, :, None, None]).all()


@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic"])
@pytest.mark.parametrize("target", ["interpreter", "cpu"])
def test_attention_over_no_key_is_refused_by_name(target, symbolic):
    """Softmax over an empty key sequence: ORT and kiln's native kernels refuse it; the
    reference failed on NumPy's "zero-size array to reduction operation maximum"."""
    shapes = {"q": [1, 2, 3, 4], "k": [1, 2, 0, 4], "v": [1, 2, 0, 4]}
    ins = [helper.make_tensor_value_info(n, F, [f"{n}{d}" for d in range(4)] if symbolic else s)
           for n, s in shapes.items()]
    g = helper.make_graph([helper.make_node("Attention", ["q", "k", "v"], ["y"], name="att")], "m", ins,
                          [helper.make_tensor_value_info("y", F, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)])
    m.ir_version = 10
    feeds = {n: np.zeros(s, np.float32) for n, s in shapes.items()}
    with pytest.raises(KilnError, match="Attention node 'att': attention over an empty key sequence.*0 keys"):
        kiln.compile(m, target=target).run(feeds)
