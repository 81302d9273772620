"""The module cache's key: a sha256 of the graph's canonical form, exact for every byte."""

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import kiln
from kiln import KilnError
from kiln.graph.canonical import canonical_bytes
from kiln.targets.cache import graph_key
from kiln.targets.target import Target

HOST = Target.host()

F, I64, B = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64, onnx.TensorProto.BOOL


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))


def _label_encoder(value: float, where: int = 1500, n: int = 2000):
    """A LabelEncoder whose tensor attributes (> 1,000 elements: NumPy's repr elides them)
    differ only in values[where]."""
    values = np.zeros(n, np.float32)
    values[where] = value
    node = helper.make_node("LabelEncoder", ["x"], ["y"], domain="ai.onnx.ml",
                            keys_tensor=numpy_helper.from_array(np.arange(n, dtype=np.int64), "k"),
                            values_tensor=numpy_helper.from_array(values, "v"))
    g = helper.make_graph([node], "m", [helper.make_tensor_value_info("x", I64, [4])],
                          [helper.make_tensor_value_info("y", F, [4])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                               helper.make_opsetid("ai.onnx.ml", 4)])


def _if_with_constant(value: float, n: int = 1200):
    """An If whose then-branch holds a large Constant (a subgraph's constant) differing in one element."""
    c = np.zeros(n, np.float32)
    c[n - 7] = value
    then = helper.make_graph([helper.make_node("Constant", [], ["t"], value=numpy_helper.from_array(c, "c"))],
                             "then", [], [helper.make_tensor_value_info("t", F, [n])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", F, [n])])
    node = helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)
    g = helper.make_graph([node], "m", [helper.make_tensor_value_info("cond", B, []),
                                        helper.make_tensor_value_info("x", F, [n])],
                          [helper.make_tensor_value_info("y", F, [n])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_large_tensor_attributes_differing_in_one_element_compute_their_own_results():
    """The reproduction: before, the second model ran with the first's table (0.0, not 42.0)."""
    x = np.array([1500, 3, 1500, 7], np.int64)
    first = kiln.compile(_label_encoder(0.0)).run(x=x)["y"]
    second = kiln.compile(_label_encoder(42.0)).run(x=x)["y"]
    np.testing.assert_array_equal(first, [0, 0, 0, 0])
    np.testing.assert_array_equal(second, [42, 0, 42, 0])


def test_subgraph_constants_are_part_of_the_key():
    x = np.random.default_rng(0).standard_normal(1200).astype(np.float32)
    for value in (0.0, 42.0):
        got = kiln.compile(_if_with_constant(value)).run(cond=np.array(True), x=x)["y"]
        assert got[-7] == value and not got[:-7].any()


def test_keys_differ_by_one_element_and_repeat_exactly():
    a, b = kiln.load_onnx(_label_encoder(0.0)), kiln.load_onnx(_label_encoder(42.0))
    again = kiln.load_onnx(_label_encoder(0.0))          # fresh Values and ids, same model
    ka, kb = graph_key(a, {}, HOST), graph_key(b, {}, HOST)
    assert ka != kb and graph_key(again, {}, HOST) == ka and len(ka) == 64
    sa, sb = kiln.load_onnx(_if_with_constant(0.0)), kiln.load_onnx(_if_with_constant(42.0))
    assert graph_key(sa, {}, HOST) != graph_key(sb, {}, HOST)
    assert graph_key(sa, {}, HOST) == graph_key(kiln.load_onnx(_if_with_constant(0.0)), {}, HOST)


def test_known_values_are_part_of_the_key():
    g = kiln.load_onnx(_label_encoder(1.0))
    x = g.inputs[0]
    k1 = graph_key(g, {x.id: np.array([1, 2, 3, 4], np.int64)}, HOST)
    k2 = graph_key(g, {x.id: np.array([1, 2, 3, 5], np.int64)}, HOST)
    k3 = graph_key(g, {x.id: np.array([1, 2, 3, 4], np.int32)}, HOST)   # other dtype, same first bytes
    assert len({k1, k2, k3, graph_key(g, {}, HOST)}) == 4


def test_target_is_part_of_the_key():
    """A module built for another CPU (or with other cores: tiles per thread) is another entry."""
    g = kiln.load_onnx(_label_encoder(1.0))
    keys = {graph_key(g, {}, t) for t in (HOST, Target.named("x86-64-v3"), Target.named("x86-64-v4"),
                                           Target.named("x86-64-v4", cores=HOST.cores + 1))}
    assert len(keys) == 4


@pytest.mark.parametrize("a, b", [
    ([1, 2], (1, 2)), (["ab"], ["a", "b"]), ("1", 1), (1, 1.0), (1, True), (0.0, -0.0),
    (None, "N"), (b"x", "x"), ({"a": 1}, [("a", 1)]),
    (np.zeros(2, np.int32), np.zeros(1, np.int64)),                       # same bytes, other dtype/shape
    (np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32)),
    (np.zeros(2, ml_dtypes.bfloat16), np.zeros(2, np.float16)),         # same bits, other dtype
    (np.array(["a", "bc"], object), np.array(["ab", "c"], object)),
    (np.float32(1), 1.0),
])
def test_canonical_bytes_tell_values_apart(a, b):
    assert canonical_bytes(a) != canonical_bytes(b)
    assert canonical_bytes(a) == canonical_bytes(a)


def test_every_element_of_a_large_array_counts():
    big = np.arange(100_000, dtype=np.float64)
    other = big.copy()
    other[54_321] += 1e-9
    assert canonical_bytes(big) != canonical_bytes(other)
    strings = np.array([f"s{i}" for i in range(5000)], dtype=object)
    changed = strings.copy()
    changed[2500] = "x"
    assert canonical_bytes(strings) != canonical_bytes(changed)


def test_an_unknown_type_is_an_error_not_a_guess():
    with pytest.raises(KilnError, match="cannot serialise a .*object"):
        canonical_bytes([object()])


def test_kiln_variables_are_part_of_the_key(monkeypatch):
    """A per-shape or shape-generic module built under one KILN_ setting is not served under
    another (compile_key has them; graph_key, the key of those modules, must too), and the
    cache dir, the tier and the thread pool's run-time settings are no part of it."""
    g = kiln.load_onnx(_label_encoder(1.0))
    monkeypatch.delenv("KILN_STREAM_RATE_ALL", raising=False)
    base = graph_key(g, {}, HOST)
    monkeypatch.setenv("KILN_STREAM_RATE_ALL", "1000")
    assert graph_key(g, {}, HOST) != base
    monkeypatch.delenv("KILN_STREAM_RATE_ALL")
    monkeypatch.setenv("KILN_TIER", "full")
    monkeypatch.setenv("KILN_CACHE_DIR", "/elsewhere")
    assert graph_key(g, {}, HOST) == base
    monkeypatch.setenv("KILN_POOL_SPIN_US", "1000")   # the pool's, read as a loaded module starts it
    assert graph_key(g, {}, HOST) == base
