"""The shrinker: delta debugging keeps the failure and the data that triggered it, drops the
rest; regression files round-trip."""

import numpy as np
import onnx
from onnx import TensorProto, helper

from kiln.testing.fuzz_graphs import generate
from kiln.testing.shrink import intermediate_values, load_regression, save_regression, shrink


def _chain_model():
    """x -> Abs -> Add(c) -> Sigmoid -> Mul(x) -> Neg -> Tanh -> y, and an extra output."""
    c = helper.make_tensor("c", TensorProto.FLOAT, [4], [0.5, 1.0, 1.5, 2.0])
    nodes = [helper.make_node("Abs", ["x"], ["a"]), helper.make_node("Add", ["a", "c"], ["b"]),
             helper.make_node("Sigmoid", ["b"], ["s"]), helper.make_node("Mul", ["s", "x"], ["m"]),
             helper.make_node("Neg", ["m"], ["n"]), helper.make_node("Tanh", ["n"], ["y"]),
             helper.make_node("Exp", ["a"], ["z"])]
    io = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [3, 4])  # noqa: E731
    g = helper.make_graph(nodes, "m", [io("x")], [io("y"), io("z")], [c])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_shrinks_to_the_failing_node_with_its_data():
    m = _chain_model()
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    calls = []

    def fails(model, feeds):   # "the bug": any Sigmoid
        calls.append(len(model.graph.node))
        return any(n.op_type == "Sigmoid" for n in model.graph.node)
    small, feeds = shrink(m, {"x": x}, fails)
    assert [n.op_type for n in small.graph.node] == ["Sigmoid"]
    onnx.checker.check_model(small, full_check=True)
    (name,) = feeds
    want = np.abs(x) + np.array([0.5, 1.0, 1.5, 2.0], np.float32)
    np.testing.assert_allclose(feeds[name], want, rtol=1e-6)   # the value Sigmoid saw
    assert len(calls) < 60


def test_bypass_keeps_a_node_whose_input_matters():
    m = _chain_model()
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)

    def fails(model, feeds):   # a Neg reading a Mul
        prod = {o: n.op_type for n in model.graph.node for o in n.output}
        return any(n.op_type == "Neg" and prod.get(n.input[0]) == "Mul" for n in model.graph.node)
    small, feeds = shrink(m, {"x": x}, fails)
    assert sorted(n.op_type for n in small.graph.node) == ["Mul", "Neg"]


def test_intermediate_values_match_the_reference():
    case = generate(3)
    vals = intermediate_values(case.model, case.feeds)
    assert set(o for n in case.model.graph.node for o in n.output if o) <= set(vals)


def test_regression_file_round_trip(tmp_path):
    m = _chain_model()
    x = np.ones((3, 4), np.float32)
    p = save_regression(m, {"x": x}, str(tmp_path), signature="mismatch|cpu||output #", message="why",
                        seed=12, levels=(2,), xfail="a known bug")
    m2, feeds, meta = load_regression(p)
    assert [n.op_type for n in m2.graph.node] == [n.op_type for n in m.graph.node]
    np.testing.assert_array_equal(feeds["x"], x)
    assert meta["kiln.fuzz.seed"] == "12" and meta["kiln.fuzz.levels"] == "2"
    assert meta["kiln.fuzz.xfail"] == "a known bug" and meta["kiln.fuzz.signature"].startswith("mismatch|cpu")
