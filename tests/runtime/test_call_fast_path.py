"""The per-call fast path (validation cached by input shapes, shape-keyed dispatch, data pointers
read without ctypes helpers) refuses everything the full checks refuse and computes the same.

Each refusal is tried after the model has already run on valid inputs, so the cached paths are
the ones asked."""

from __future__ import annotations

import ctypes

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import kiln
from kiln import KilnError
from kiln.runtime import native
from tests.runtime.models import elementwise_model, inputs, reference


def four_input_model(dim="n") -> onnx.ModelProto:
    """out = ((a + b) * c) - d over float32[2, n] inputs, and int64 e's shape on its own."""
    nodes = [helper.make_node("Add", ["a", "b"], ["t1"]), helper.make_node("Mul", ["t1", "c"], ["t2"]),
             helper.make_node("Sub", ["t2", "d"], ["out"])]
    ins = [helper.make_tensor_value_info(x, TensorProto.FLOAT, [2, dim]) for x in "abcd"]
    g = helper.make_graph(nodes, "four", ins, [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, dim])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def feeds(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {x: rng.standard_normal((2, n)).astype(np.float32) for x in "abcd"}


def expected(f: dict) -> np.ndarray:
    return (f["a"] + f["b"]) * f["c"] - f["d"]


@pytest.fixture(scope="module")
def model():
    m = kiln.compile(four_input_model())
    for n in (3, 5):   # warm: these shapes are now on the fast paths
        f = feeds(n)
        np.testing.assert_allclose(m.run(f)["out"], expected(f), rtol=1e-6)
    return m


def test_wrong_dtype_is_refused_on_the_fast_path(model):
    for bad in (np.float64, np.int32, np.dtype(">f4")):
        f = feeds(3)
        f["c"] = f["c"].astype(bad)
        with pytest.raises(KilnError, match=r"input 'c': expected dtype float32, given"):
            model.run(f)


def test_wrong_shape_is_refused_on_the_fast_path(model):
    f = feeds(3)
    f["b"] = np.zeros((3, 3), np.float32)
    with pytest.raises(KilnError, match=r"input 'b': expected shape \(2, n\), given \(3, 3\)"):
        model.run(f)
    f["b"] = np.zeros((2, 3, 1), np.float32)
    with pytest.raises(KilnError, match=r"input 'b'.*rank 2"):
        model.run(f)


def test_inconsistent_symbols_are_refused_even_when_each_shape_was_seen(model):
    # n=3 and n=5 both ran; mixing them binds n twice
    f = feeds(3)
    f["d"] = feeds(5)["d"]
    with pytest.raises(KilnError, match=r"input 'd': dim 1 is symbol 'n' = 5, but input 'a' bound 'n' = 3"):
        model.run(f)


def test_non_arrays_and_missing_or_unknown_names_are_still_checked(model):
    f = feeds(3)
    f["a"] = f["a"].tolist()     # a nested list: converted, then checked (float64 is not float32)
    with pytest.raises(KilnError, match=r"input 'a': expected dtype float32, given float64"):
        model.run(f)
    f = feeds(3)
    del f["a"]
    with pytest.raises(KilnError, match="missing input"):
        model.run(f)
    f["z"] = np.zeros((2, 3), np.float32)
    with pytest.raises(KilnError, match="unknown input"):
        model.run(f)
    with pytest.raises(KilnError, match="expected a numpy array"):
        model.run({**feeds(3), "a": object()})


@pytest.mark.parametrize("layout", ["strided", "fortran", "offset", "broadcast"])
def test_non_contiguous_inputs_give_the_same_results(model, layout):
    f = feeds(5, seed=1)
    big = np.random.default_rng(2).standard_normal((4, 10)).astype(np.float32)
    odd = {"strided": big[::2, ::2], "fortran": np.asfortranarray(f["a"]), "offset": big[1:3, 3:8],
           "broadcast": np.broadcast_to(big[1, :5], (2, 5))}[layout]
    assert not odd.flags.c_contiguous or layout == "offset"
    g = dict(f, a=odd)
    want = expected({k: np.ascontiguousarray(v) for k, v in g.items()})
    np.testing.assert_allclose(model.run(g)["out"], want, rtol=1e-6)
    np.testing.assert_allclose(model.run(f)["out"], expected(f), rtol=1e-6)   # and back


def test_each_call_returns_fresh_outputs(model):
    f1, f2 = feeds(3, seed=3), feeds(3, seed=4)
    out1 = model.run(f1)["out"]
    keep = out1.copy()
    out2 = model.run(f2)["out"]
    assert out1 is not out2 and not np.shares_memory(out1, out2)
    np.testing.assert_array_equal(out1, keep)
    np.testing.assert_allclose(out2, expected(f2), rtol=1e-6)


def test_positional_call_and_inputs_kept_unchanged(model):
    f = feeds(5, seed=5)
    before = {k: v.copy() for k, v in f.items()}
    np.testing.assert_allclose(model(*f.values()), expected(f), rtol=1e-6)
    for k in f:
        np.testing.assert_array_equal(f[k], before[k])


def test_two_outputs_and_weights_on_the_fast_path():
    m = kiln.compile(elementwise_model())
    for seed in range(3):
        x = inputs(batch=3, seed=seed)
        got = m.run(x)
        for k, v in reference(**x).items():
            np.testing.assert_allclose(got[k], v, rtol=1e-6)


def test_data_pointer_is_the_arrays_data():
    base = np.random.default_rng(0).standard_normal(100)
    arrays = [base, base[7:], base[::3], base.reshape(10, 10).T, np.zeros(0, np.int8),
              np.empty((3, 0)), np.ones((), np.bool_), np.asfortranarray(base.reshape(4, 25))]
    for a, p in zip(arrays, native.data_pointers(arrays)):
        assert isinstance(p, ctypes.c_void_p)
        assert (p.value or 0) == a.ctypes.data
