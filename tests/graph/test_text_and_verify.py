"""The graph text form round-trips; the verifier rejects broken graphs by name."""

import numpy as np
import pytest

import kiln
from kiln.graph import Graph, Value, const_value, parse_graph, print_graph, tensor, verify
from kiln.graph.ir import Node
from kiln.graph.types import SequenceType
from kiln.interpreter import Interpreter
from tests.helpers import small_cnn_model


def _mul_relu():
    x = Value("x", tensor("float32", (1, "n")))
    w = const_value("w", np.array([1.5, -2.0], np.float32))
    t = Value("t", tensor("float32", (1, "n")))
    y = Value("y", tensor("float32", (1, "n")))
    nodes = [Node("Mul", [x, w], [t], {"f": -np.inf, "l": [1, 2], "s": 'q"uote'}, "mul 0"),
             Node("Relu", [t], [y], {}, "relu0")]
    return Graph("main", [x], [y], nodes, {"": 21})


def test_round_trip_is_exact():
    g = _mul_relu()
    text = print_graph(g)
    assert print_graph(parse_graph(text)) == text
    assert '"mul 0"' in text and "n" in text


def test_round_trip_of_imported_model_keeps_numbers():
    g = kiln.load_onnx(small_cnn_model())
    g2 = parse_graph(print_graph(g))
    assert print_graph(g2) == print_graph(g)
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    np.testing.assert_array_equal(Interpreter(g).run([x])[0], Interpreter(g2).run([x])[0])


def test_round_trip_with_subgraph_and_sequence_types():
    import onnx
    from onnx import helper
    then_g = helper.make_graph([helper.make_node("Identity", ["a"], ["o1"])], "then", [],
                               [helper.make_tensor_value_info("o1", onnx.TensorProto.FLOAT, [2])])
    else_g = helper.make_graph([helper.make_node("Neg", ["a"], ["o2"])], "else", [],
                               [helper.make_tensor_value_info("o2", onnx.TensorProto.FLOAT, [2])])
    g = helper.make_graph([helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)],
                          "m", [helper.make_tensor_value_info("c", onnx.TensorProto.BOOL, []),
                                helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])])
    graph = kiln.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    text = print_graph(graph)
    assert print_graph(parse_graph(text)) == text
    assert SequenceType(tensor("int64", None)) == parse_graph(
        'graph "s" (%q: seq<int64[*]>) -> (%q)\n{\n}\n').inputs[0].type


def test_verify_accepts_good_graph():
    verify(_mul_relu())


def test_verify_rejects_dangling_value():
    g = _mul_relu()
    g.nodes.reverse()  # relu now reads %t before mul defines it
    with pytest.raises(kiln.KilnError, match=r"relu0.*not defined before"):
        verify(g)


def test_verify_rejects_cycle():
    g = _mul_relu()
    g.nodes[0].inputs[0] = g.nodes[1].outputs[0]  # mul reads relu's output: a cycle
    with pytest.raises(kiln.KilnError, match="mul 0"):
        verify(g)


def test_verify_rejects_type_mismatch():
    from kiln.ops.verify import verify as verify_types
    g = _mul_relu()
    g.nodes[1].outputs[0].type = tensor("int64", (1, "n"))
    verify(g)  # structurally sound
    with pytest.raises(kiln.KilnError, match=r"Relu node 'relu0'.*int64"):
        verify_types(g)


def test_verify_rejects_double_definition():
    g = _mul_relu()
    g.nodes[1].outputs[0] = g.nodes[0].outputs[0]
    with pytest.raises(kiln.KilnError, match="more than once"):
        verify(g)


def test_parse_error_names_the_offset():
    with pytest.raises(kiln.KilnError, match="offset"):
        parse_graph('graph "m" (%x: float32[2]) -> (%x) {\n %y: float32[2] = Relu(%x name "r"\n}')
