"""Control flow, sequences and RNNs: error paths and semantics the ONNX suite leaves untested."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.graph.types import TensorType

F, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _vi(name, t=F, shape=None):
    return helper.make_tensor_value_info(name, t, shape)


def _model(nodes, ins, outs, opset=17, inits=()):
    g = helper.make_graph(nodes, "g", ins, outs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _const(name, values, t=F, shape=None):
    values = np.asarray(values)
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(
        name + "_v", t, values.shape if shape is None else shape, values.ravel().tolist()))


def _branch(name, values):
    return helper.make_graph([_const(name, values)], name, [], [_vi(name)])


# ---- If ----

def test_if_branches_of_different_shapes_join_to_a_symbolic_type():
    node = helper.make_node("If", ["c"], ["y"], name="if0",
                            then_branch=_branch("t", [[1, 2], [3, 4]]),
                            else_branch=_branch("e", [[5, 6, 7], [8, 9, 0]]))
    model = _model([node], [_vi("c", BOOL, [])], [_vi("y")])
    g = kiln.load_onnx(model)
    (shape,) = [v.type.shape for v in g.outputs]
    assert shape[0] == 2 and isinstance(shape[1], str)
    m = kiln.compile(model, target="interpreter")
    assert m(np.array(True)).shape == (2, 2)
    assert m(np.array(False)).shape == (2, 3)


def test_if_condition_must_be_one_element():
    node = helper.make_node("If", ["c"], ["y"], name="if0", then_branch=_branch("t", [1]),
                            else_branch=_branch("e", [2]))
    with pytest.raises(kiln.KilnError, match="If node 'if0'.*single element"):
        kiln.compile(_model([node], [_vi("c", BOOL, [2])], [_vi("y")]), target="interpreter")


def test_if_branch_output_count_must_match_node():
    node = helper.make_node("If", ["c"], ["y", "z"], name="if0", then_branch=_branch("t", [1]),
                            else_branch=_branch("e", [2]))
    with pytest.raises(kiln.KilnError, match="then_branch outputs.*expected 2, given 1"):
        kiln.compile(_model([node], [_vi("c", BOOL, [])], [_vi("y"), _vi("z")]),
                     target="interpreter")


# ---- Loop ----

def _growing_loop(cond_in: bool):
    """v = concat(v, [i]) per iteration; body cond says stop once len(v) >= 3."""
    body = helper.make_graph([
        helper.make_node("Cast", ["i"], ["fi"], to=F),
        helper.make_node("Unsqueeze", ["fi", "zero"], ["fi1"]),
        helper.make_node("Concat", ["v", "fi1"], ["v2"], axis=0),
        helper.make_node("Size", ["v2"], ["n"]),
        helper.make_node("Less", ["n", "three"], ["c2"]),
        helper.make_node("Mul", ["fi", "fi"], ["sq"]),
    ], "body", [_vi("i", I64, []), _vi("c", BOOL, []), _vi("v", F, None)],
        [_vi("c2", BOOL, []), _vi("v2"), _vi("sq")])
    ins = ["M", "C" if cond_in else "", "v0"]
    node = helper.make_node("Loop", ins, ["V", "S"], name="loop0", body=body)
    inits = [helper.make_tensor("M", I64, [], [5]), helper.make_tensor("zero", I64, [1], [0]),
             helper.make_tensor("three", I64, [], [3])]
    vis = [_vi("C", BOOL, [])] if cond_in else []
    return _model([node], vis + [_vi("v0", F, [1])], [_vi("V"), _vi("S")], inits=inits)


def test_loop_carried_value_that_grows_gets_a_symbolic_dim():
    model = _growing_loop(cond_in=True)
    g = kiln.load_onnx(model)
    v, s = (o.type for o in g.outputs)
    assert isinstance(v.shape[0], str) and isinstance(s.shape[0], str)
    V, S = kiln.compile(model, target="interpreter")(np.array(True), np.array([7.0], np.float32))
    np.testing.assert_array_equal(V, [7, 0, 1])   # stopped by the body's cond
    np.testing.assert_array_equal(S, [0, 1])


def test_loop_without_cond_input_is_a_for_loop():
    """Spec: with M given and no cond input the body's cond is ignored; M is the static length."""
    model = _growing_loop(cond_in=False)
    assert kiln.load_onnx(model).outputs[1].type == TensorType(kiln.dtypes.DType.float32, (5,))
    V, S = kiln.compile(model, target="interpreter")(np.array([7.0], np.float32))
    np.testing.assert_array_equal(V, [7, 0, 1, 2, 3, 4])
    np.testing.assert_array_equal(S, [0, 1, 4, 9, 16])


def test_loop_body_input_count_is_checked():
    body = helper.make_graph([helper.make_node("Identity", ["c"], ["c2"])], "body",
                             [_vi("i", I64, []), _vi("c", BOOL, [])], [_vi("c2", BOOL, [])])
    node = helper.make_node("Loop", ["M", "", "v0"], ["V"], name="loop0", body=body)
    model = _model([node], [_vi("M", I64, []), _vi("v0", F, [1])], [_vi("V")])
    with pytest.raises(kiln.KilnError, match="Loop node 'loop0'.*body inputs.*expected 3, given 2"):
        kiln.compile(model, target="interpreter")


# ---- Scan ----

def test_scan9_axes_and_directions():
    body = helper.make_graph([helper.make_node("Add", ["s", "x"], ["s2"]),
                              helper.make_node("Identity", ["s2"], ["y"])], "body",
                             [_vi("s", F, [2]), _vi("x", F, [2])],
                             [_vi("s2", F, [2]), _vi("y", F, [2])])
    node = helper.make_node("Scan", ["s0", "X"], ["S", "Y"], body=body, num_scan_inputs=1,
                            scan_input_axes=[1], scan_input_directions=[1],
                            scan_output_axes=[-1], scan_output_directions=[1])
    model = _model([node], [_vi("s0", F, [2]), _vi("X", F, [2, 3])], [_vi("S"), _vi("Y")])
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    S, Y = kiln.compile(model, target="interpreter")(np.zeros(2, np.float32), x)
    cum = np.cumsum(x[:, ::-1], axis=1)      # reverse input: scan from the last column
    np.testing.assert_array_equal(S, cum[:, -1])
    np.testing.assert_array_equal(Y, cum[:, ::-1])  # reverse output: written back to front


# ---- sequences and optionals ----

def test_sequence_at_out_of_range_names_position_and_length():
    nodes = [helper.make_node("SequenceConstruct", ["a", "a"], ["s"]),
             helper.make_node("SequenceAt", ["s", "p"], ["y"], name="at0")]
    model = _model(nodes, [_vi("a", F, [2]), _vi("p", I64, [])], [_vi("y")])
    m = kiln.compile(model, target="interpreter")
    np.testing.assert_array_equal(m(np.ones(2, np.float32), np.array(-2)), [1, 1])
    with pytest.raises(kiln.KilnError, match="SequenceAt node 'at0'.*position 2.*length 2"):
        m(np.ones(2, np.float32), np.array(2))


def test_optional_get_element_of_empty_optional_fails():
    tp = helper.make_tensor_type_proto(F, [2])
    nodes = [helper.make_node("Optional", [], ["o"], type=tp),
             helper.make_node("OptionalHasElement", ["o"], ["h"]),
             helper.make_node("OptionalGetElement", ["o"], ["y"], name="get0")]
    model = _model(nodes, [], [_vi("h", BOOL), _vi("y")], opset=18)
    with pytest.raises(kiln.KilnError, match="OptionalGetElement node 'get0'.*empty"):
        kiln.compile(model, target="interpreter")()


# ---- RNNs ----

def _lstm(layout, lens):
    node = helper.make_node("LSTM", ["X", "W", "R", "", "L"], ["Y", "Yh", "Yc"], hidden_size=2,
                            layout=layout, direction="bidirectional")
    ins = [_vi("X"), _vi("W"), _vi("R"), _vi("L", TensorProto.INT32)]
    return kiln.compile(_model([node], ins, [_vi("Y"), _vi("Yh"), _vi("Yc")], opset=14),
                        target="interpreter")


def test_lstm_batch_major_layout_matches_time_major():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3, 5)).astype(np.float32)
    w, r = (rng.standard_normal(s).astype(np.float32) for s in ((2, 8, 5), (2, 8, 2)))
    lens = np.array([4, 1, 0], np.int32)
    y0, h0, c0 = _lstm(0, lens)(x, w, r, lens)
    y1, h1, c1 = _lstm(1, lens)(x.swapaxes(0, 1), w, r, lens)
    np.testing.assert_allclose(y1, y0.transpose(2, 0, 1, 3), rtol=1e-6)
    np.testing.assert_allclose(h1, h0.swapaxes(0, 1), rtol=1e-6)
    np.testing.assert_allclose(c1, c0.swapaxes(0, 1), rtol=1e-6)
    assert not y0[1:, :, 1].any() and not y0[:, :, 2].any()   # past each sequence's end: zeros
    assert not h0[:, 2].any()                                  # empty sequence: zero state (as ORT)
    # reverse direction of a length-1 sequence sees only its first step: both directions agree
    np.testing.assert_allclose(h0[0, 1], y0[0, 0, 1])
    np.testing.assert_allclose(h0[1, 1], y0[0, 1, 1])


def test_rnn_rejects_unknown_activation():
    node = helper.make_node("RNN", ["X", "W", "R"], ["Y"], name="rnn0", hidden_size=2,
                            activations=["Swish"])
    model = _model([node], [_vi("X", F, [1, 1, 3]), _vi("W", F, [1, 2, 3]), _vi("R", F, [1, 2, 2])],
                   [_vi("Y")], opset=14)
    with pytest.raises(kiln.KilnError, match="RNN node 'rnn0'.*unknown activation 'Swish'"):
        kiln.compile(model, target="interpreter")
