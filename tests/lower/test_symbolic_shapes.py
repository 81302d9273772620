"""kiln.lower.symbolic_shapes: sizes computed in the graph carried as polynomials of the
input symbols, so a shape-generic module needs no size "known only from data"."""

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from kiln.compiler import frontend
from kiln.lower.symbolic_shapes import Poly, Undecided, resolve

F = onnx.TensorProto.FLOAT


def test_poly_arithmetic_names_and_exact_division():
    b, s = Poly.sym("batch"), Poly.sym("seq")
    bs = b * s
    assert str(bs) == "batch*seq" and str(s * b) == "batch*seq" and s * b == bs
    assert str(2 * s + 1) == "2*seq+1" and str(s - 3) == "seq-3"
    assert (bs * 768) // 768 == bs and (bs * 768) // (b * 768) == s
    assert bs.exact_div(Poly.of(5)) is None
    with pytest.raises(Undecided):
        (s + 1) // b
    assert (s + 1).compare(s) == 1 and s.compare(s) == 0
    with pytest.raises(Undecided):
        s.compare(b)
    assert (bs + s).evaluate({"batch": 3, "seq": 7}) == 28


def test_lower_bound_with_negative_terms_shifts_the_symbols():
    """batch*next + batch*seq - batch (a KV cache's rows, past = next - 1) is >= 1 for symbols
    >= 1: written with s = 1 + s' its coefficients are all positive. seq - 1 is >= 0; seq -
    batch has no bound."""
    b, n, s = Poly.sym("batch"), Poly.sym("next"), Poly.sym("seq")
    assert (b * n + b * s - b).lower_bound() == 1
    assert (n + s - 1).compare(0) == 1
    assert (s - 1).lower_bound() == 0 and (s + 2).lower_bound() == 3
    assert (s - b).lower_bound() is None and (b * s - 2 * b).lower_bound() is None


def _graph(nodes, inputs, inits=()):
    g = helper.make_graph(nodes, "m", inputs, [helper.make_tensor_value_info(nodes[-1].output[0], F, None)],
                          list(inits))
    return frontend(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


def test_a_reshape_chain_from_shape_values_gets_polynomial_sizes():
    """Reshape(x, Concat(Gather(Shape(x), 0) * Gather(Shape(x), 1), [-1])) of a [batch, seq, 8]
    tensor is [batch*seq, 8], and a Range to seq is seq long."""
    I = numpy_helper.from_array
    inits = [I(np.array(0, np.int64), "i0"), I(np.array(1, np.int64), "i1"), I(np.array([0], np.int64), "ax0"),
             I(np.array([-1], np.int64), "m1"), I(np.array(0, np.int64), "zero"), I(np.array(1, np.int64), "one")]
    nodes = [helper.make_node("Shape", ["x"], ["sh"]),
             helper.make_node("Gather", ["sh", "i0"], ["b"]), helper.make_node("Gather", ["sh", "i1"], ["s"]),
             helper.make_node("Mul", ["b", "s"], ["bs"]), helper.make_node("Unsqueeze", ["bs", "ax0"], ["bs1"]),
             helper.make_node("Concat", ["bs1", "m1"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["rows"]),
             helper.make_node("Range", ["zero", "s", "one"], ["pos"]),
             helper.make_node("Cast", ["pos"], ["posf"], to=F),
             helper.make_node("Unsqueeze", ["posf", "ax0"], ["posf1"]),
             helper.make_node("Add", ["rows", "posf1"], ["y"])]
    g = _graph(nodes, [helper.make_tensor_value_info("x", F, ["batch", "seq", 8])], inits)
    res = resolve(g, ["batch", "seq"])
    types = {v.name: v.type.shape for n in res.graph.nodes for v in n.outputs}
    assert types["rows"] == ("batch*seq", 8)
    assert types["pos"] == ("seq",)
    assert res.derived == {"batch*seq": Poly.sym("batch") * Poly.sym("seq")} and res.guards == []
    # y = rows [batch*seq, 8] + posf [1, seq]: 8 against seq cannot broadcast generically
    assert types["y"][0] == "batch*seq"


def test_a_slice_of_a_static_axis_up_to_a_symbol_is_guarded():
    I = numpy_helper.from_array
    inits = [I(np.ones((16, 4), np.float32), "table"), I(np.array([0], np.int64), "ax0"),
             I(np.array([0], np.int64), "st")]
    nodes = [helper.make_node("Shape", ["x"], ["sh"]),
             helper.make_node("Gather", ["sh", "ax0"], ["n"]),
             helper.make_node("Slice", ["table", "st", "n", "ax0"], ["rows"]),
             helper.make_node("Add", ["x", "rows"], ["y"])]
    g = _graph(nodes, [helper.make_tensor_value_info("x", F, ["n", 4])], inits)
    res = resolve(g, ["n"])
    assert {v.name: v.type.shape for nd in res.graph.nodes for v in nd.outputs}["rows"] == ("n", 4)
    (guard,) = res.guards
    assert guard.size == Poly.sym("n") and guard.bound == 16
