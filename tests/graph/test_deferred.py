"""Constant data made when first read (kiln.graph.deferred): Winograd's transformed weights
are made part by part where the weights blob is written, never whole on the compile's path,
and equal bit for bit to the array made at once; a compile that writes them into the module
cache never makes them whole, and still computes the convolution."""

import pickle

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.compiler import run_stages
from kiln.graph.deferred import Deferred, byte_parts
from kiln.graph.ir import Value, const_value
from kiln.lower.module import in_memory
from kiln.ops import winograd
from kiln.ops.winograd import deferred_weight, matrices, transform_weight


def counted(data: np.ndarray, step: int, calls: list) -> Deferred:
    def parts():
        calls.append(1)
        flat = data.reshape(-1)
        for k in reversed(range(0, flat.size, step)):   # (any order)
            yield k, flat[k:k + step].copy()
    return Deferred(data.shape, data.dtype, parts)


def test_a_deferred_is_made_once_from_its_parts_and_read_through_value_const():
    data = np.random.default_rng(0).standard_normal((3, 5, 7)).astype(np.float32)
    calls = []
    d = counted(data, 8, calls)
    v = const_value("u", d)
    assert v.is_const and v.deferred is d and calls == []        # asking whether it is one makes nothing
    assert v.type.shape == (3, 5, 7) and d.nbytes == data.nbytes
    np.testing.assert_array_equal(v.const, data)
    assert calls == [1] and v.deferred is None and v.const is d.made
    np.testing.assert_array_equal(v.const, data)
    assert calls == [1]
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(Value("p", v.type, counted(data, 4, [])))).const, data)


def test_a_part_that_does_not_fit_is_refused():
    d = Deferred((4,), np.float32, lambda: iter([(2, np.ones(3, np.float32))]))
    with pytest.raises(ValueError, match="does not fit"):
        d.value()
    d = Deferred((4,), np.float32, lambda: iter([(0, np.ones(4, np.float64))]))
    with pytest.raises(ValueError, match="does not fit"):
        d.value()


def test_a_blob_made_from_deferred_pieces_holds_their_bytes_and_is_then_read_by_them():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal(10).astype(np.float32), rng.standard_normal((6, 4)).astype(np.float32)
    calls = []
    d = counted(b, 5, calls)
    blob = in_memory(256, [(0, a.view(np.uint8)), (64, d)])
    assert calls == [1]
    np.testing.assert_array_equal(blob[:40].view(np.float32), a)
    np.testing.assert_array_equal(blob[64:160].view(np.float32).reshape(6, 4), b)
    assert not blob[40:64].any() and not blob[160:].any()
    assert np.shares_memory(d.value(), blob) and calls == [1]     # settled: read from the blob
    assert [(k, p.size) for k, p in byte_parts(d)] == [(0, 96)]


def reference_u(w: np.ndarray, block: int, m: int = 4) -> np.ndarray:
    """G w G^T per (o, i) in float64 (einsum), laid out as transform_weight's U, padded with zeros."""
    _, g, _ = matrices(m)
    oc, ic = w.shape[:2]
    ocp, icp = -(-oc // block) * block, -(-ic // block) * block
    wp = np.zeros((ocp, icp, 3, 3))
    wp[:oc, :ic] = w
    u = np.einsum("ar,oirs,bs->aboi", g, wp, g)                   # t_row, t_col, O, I
    n = m + 2
    return u.reshape(n * n, ocp // block, block, icp).transpose(0, 1, 3, 2)


@pytest.mark.parametrize("part_bytes", [1, 4096, winograd.PART_BYTES])   # a block, some, all per part
@pytest.mark.parametrize("oc,ic,block", [(16, 16, 16), (20, 7, 8), (3, 5, 4), (40, 33, 16), (70, 24, 8)])
def test_winograd_weights_are_rounded_once_from_float64_and_equal_made_or_streamed(oc, ic, block, part_bytes,
                                                                                     monkeypatch):
    monkeypatch.setattr(winograd, "PART_BYTES", part_bytes)
    w = np.random.default_rng(oc * ic).standard_normal((oc, ic, 3, 3)).astype(np.float32)
    want = reference_u(w.astype(np.float64), block)
    made = transform_weight(w, block)
    assert made.dtype == np.float32 and made.shape == want.shape
    # within half a float32 ulp of the float64 value (+ float64's own rounding): the transform
    # is computed in float64 and rounded once (float32 arithmetic would miss this where its
    # nine-term sums cancel)
    np.testing.assert_allclose(made, want, rtol=2.0 ** -24, atol=np.abs(want).max() * 1e-14)
    streamed = np.full(made.size, np.nan, np.float32)
    for offset, part in deferred_weight(w, block).parts():
        assert np.isnan(streamed[offset:offset + part.size]).all()  # each element once
        streamed[offset:offset + part.size] = part
    np.testing.assert_array_equal(streamed.reshape(made.shape), made)


def winograd_model(seed: int = 0):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((32, 32, 3, 3)) / 17).astype(np.float32)
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                           helper.make_node("Relu", ["c"], ["y"])], "wino",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 14, 14])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 14, 14])],
                          [numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_a_cold_compile_writes_winograd_weights_without_making_them_whole(tmp_path, monkeypatch):
    """The whole static model's blob is written into the module cache by a thread that makes U
    part by part: nothing on the compile's path makes it whole (counted), and the module it
    returns, and the one a warm compile loads, compute the convolution."""
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    made = []
    value = Deferred.value
    monkeypatch.setattr(Deferred, "value", lambda self: made.append(self.made is None) or value(self))
    x = {"x": np.random.default_rng(5).standard_normal((1, 32, 14, 14)).astype(np.float32)}
    model = winograd_model()
    graph = run_stages(model, "optimized", decisions={"conv.algorithm": "winograd"}).optimized.graph
    assert [n.inputs[1].deferred is not None for n in graph.nodes if n.op == "ConvWinograd"] == [True]
    cold = kiln.compile(model, decisions={"conv.algorithm": "winograd"})
    got = cold.run(x)["y"]
    assert True not in made
    want = kiln.compile(model, "interpreter").run(x)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    warm = kiln.compile(model, decisions={"conv.algorithm": "winograd"})
    np.testing.assert_array_equal(warm.run(x)["y"], got)
    report = kiln.compile(model, decisions={"conv.algorithm": "winograd"}, report=True)   # (U made: keyed)
    np.testing.assert_array_equal(report.run(x)["y"], got)


def test_the_weights_file_written_from_deferred_parts_holds_their_bytes_and_checksum(tmp_path, monkeypatch):
    """kiln.targets.cache.WeightsFile makes a Deferred piece part by part into the file, sums
    the parts as it writes them (pieces at any byte offset: the sum of the blob's words), and
    then reads the piece from the file's mapping."""
    from kiln.targets.cache import WeightsFile, checksum
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    (tmp_path / "modules").mkdir(mode=0o700)
    rng = np.random.default_rng(2)
    b = rng.standard_normal((5, 3)).astype(np.float32)
    calls = []
    d = counted(b, 4, calls)
    pieces = [(3, rng.integers(1, 256, 13, dtype=np.uint8)), (21, d), (83, rng.integers(1, 256, 9, dtype=np.uint8))]
    want = in_memory(100, [(3, pieces[0][1]), (21, b.view(np.uint8).reshape(-1)), (83, pieces[2][1])])
    with WeightsFile("ab" * 32) as f:
        blob = f.place(100, pieces)
        assert f.written() == checksum(want)
        np.testing.assert_array_equal(blob, want)
    assert calls == [1] and np.shares_memory(d.value(), blob) and calls == [1]
