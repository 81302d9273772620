"""Reduce, linalg, attention, quant and loss ops: error paths, static shapes, tricky semantics vs numpy."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.errors import KilnError
from kiln.frontends.onnx import load_onnx

F, I32, I64 = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64
rng = np.random.default_rng(0)


def _model(op, inputs, attrs=None, opset=21, inits=(), outputs=("y",)):
    """One-node model; `inputs` maps name -> (elem type, shape), `inits` are (name, array) constants."""
    vi = [helper.make_tensor_value_info(n, t, s) for n, (t, s) in inputs.items()]
    names = list(inputs) + [n for n, _ in inits]
    node = helper.make_node(op, names, list(outputs), name="n0", **(attrs or {}))
    outs = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs]
    inits = [numpy_helper.from_array(np.asarray(v), n) for n, v in inits]
    return helper.make_model(helper.make_graph([node], "g", vi, outs, inits),
                             opset_imports=[helper.make_opsetid("", opset)])


def _run(model, *xs):
    return kiln.compile(model, target="interpreter")(*xs)


def _shapes(model):
    return [v.type.shape for v in load_onnx(model).outputs]


# ---- error paths ----

def test_matmul_inner_dimension_mismatch_names_node_and_shapes():
    with pytest.raises(KilnError, match=r"MatMul node 'n0'.*inner dimensions.*\(2, 3\).*\(4, 5\)"):
        load_onnx(_model("MatMul", {"a": (F, [2, 3]), "b": (F, [4, 5])}))


def test_gemm_transposed_mismatch_and_reduce_bad_axis_fail_cleanly():
    with pytest.raises(KilnError, match="inner dimensions"):
        load_onnx(_model("Gemm", {"a": (F, [2, 3]), "b": (F, [4, 3])}))
    load_onnx(_model("Gemm", {"a": (F, [2, 3]), "b": (F, [4, 3])}, {"transB": 1}))
    with pytest.raises(KilnError, match="axes 3 is out of range for rank 2"):
        load_onnx(_model("ReduceSum", {"x": (F, [2, 3])}, inits=[("axes", np.array([3]))]))


# ---- static shapes ----

def test_static_shapes_from_constant_axes_batch_broadcast_and_einsum():
    assert _shapes(_model("ReduceMean", {"x": (F, [2, 3, 4])}, {"keepdims": 0},
                          inits=[("axes", np.array([-1, 0]))])) == [(3,)]
    assert _shapes(_model("ReduceMax", {"x": (F, [2, 3])}, {"axes": [1]}, opset=13)) == [(2, 1)]
    runtime_axes = _model("ReduceSum", {"x": (F, ["n", 3, 4]), "a": (I64, [1])}, {"keepdims": 0})
    assert len(_shapes(runtime_axes)[0]) == 2  # axes unknown, but one of them
    assert _shapes(_model("MatMul", {"a": (F, ["n", 1, 2, 3]), "b": (F, [5, 3, 4])})) == [("n", 5, 2, 4)]
    assert _shapes(_model("MatMul", {"a": (F, [3]), "b": (F, [2, 3, 4])})) == [(2, 4)]
    assert _shapes(_model("Einsum", {"a": (F, [2, 5, 3, 3]), "b": (F, [3, 4])},
                          {"equation": "...ii,ij"})) == [(2, 5, 4)]


# ---- semantics vs numpy ----

def test_einsum_ellipsis_diagonal_implicit_output():
    a, b = rng.standard_normal((2, 5, 3, 3)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    y = _run(_model("Einsum", {"a": (F, a.shape), "b": (F, b.shape)}, {"equation": "...ii, ij"}), a, b)
    np.testing.assert_allclose(y, np.einsum("...ii,ij->...j", a, b), rtol=1e-5)


def test_reduce_identities_on_empty_sets_and_float64_accumulation():
    empty = np.zeros((2, 0, 3), np.float32)
    m = lambda op, t=F: _model(op, {"x": (t, [2, 0, 3])}, {"keepdims": 0}, opset=18,  # noqa: E731
                               inits=[("axes", np.array([1]))])
    np.testing.assert_array_equal(_run(m("ReduceLogSumExp"), empty), np.full((2, 3), -np.inf, np.float32))
    np.testing.assert_array_equal(_run(m("ReduceProd"), empty), np.ones((2, 3), np.float32))
    assert (_run(m("ReduceMin", I32), empty.astype(np.int32)) == np.iinfo(np.int32).max).all()
    x = (rng.standard_normal(1 << 16) + 1e4).astype(np.float32)
    y = _run(_model("ReduceSum", {"x": (F, x.shape)}, {"keepdims": 0}), x)
    assert y.dtype == np.float32 and y.shape == () and y == np.float32(x.astype(np.float64).sum())


def test_softmax_old_opset_coerces_to_2d_new_opset_uses_one_axis():
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    old = _run(_model("Softmax", {"x": (F, x.shape)}, {"axis": 1}, opset=11), x)
    flat = np.exp(x.reshape(2, 12)) / np.exp(x.reshape(2, 12)).sum(1, keepdims=True)
    np.testing.assert_allclose(old, flat.reshape(x.shape), rtol=1e-5)
    new = _run(_model("Softmax", {"x": (F, x.shape)}, {"axis": 1}, opset=13), x)
    np.testing.assert_allclose(new, np.exp(x) / np.exp(x).sum(1, keepdims=True), rtol=1e-5)


def test_argmax_select_last_index_and_cumsum_exclusive_reverse():
    x = np.array([[1, 5, 5], [7, 7, 2]], np.int32)
    y = _run(_model("ArgMax", {"x": (I32, x.shape)}, {"axis": 1, "select_last_index": 1, "keepdims": 0}), x)
    np.testing.assert_array_equal(y, [2, 1])
    v = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    y = _run(_model("CumSum", {"x": (F, [4])}, {"exclusive": 1, "reverse": 1}, inits=[("ax", np.array(0))]), v)
    np.testing.assert_array_equal(y, [9, 7, 4, 0])


def test_attention_3d_gqa_with_fully_masked_row_matches_numpy():
    b, s, hq, hkv, d = 2, 3, 4, 2, 8
    q, k, v = (rng.standard_normal((b, s, h * d)).astype(np.float32) for h in (hq, hkv, hkv))
    mask = np.ones((s, s), bool)
    mask[1] = False
    m = _model("Attention", {"q": (F, q.shape), "k": (F, k.shape), "v": (F, v.shape),
                             "m": (TensorProto.BOOL, mask.shape)}, {"q_num_heads": hq, "kv_num_heads": hkv}, opset=23)
    y = _run(m, q, k, v, mask)
    heads = lambda x, h: x.reshape(b, s, h, d).transpose(0, 2, 1, 3)  # noqa: E731
    kk, vv = np.repeat(heads(k, hkv), hq // hkv, 1), np.repeat(heads(v, hkv), hq // hkv, 1)
    sc = heads(q, hq) @ kk.transpose(0, 1, 3, 2) / np.sqrt(d) + np.where(mask, 0, -np.inf)
    with np.errstate(invalid="ignore"):
        e = np.exp(sc - sc.max(-1, keepdims=True))
        p = np.nan_to_num(e / e.sum(-1, keepdims=True))
    ref = (p @ vv).transpose(0, 2, 1, 3).reshape(b, s, hq * d)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-6)
    assert not y[:, 1].any()


def test_quantize_rounds_half_to_even_saturates_and_blocks():
    x = np.array([[0.5, 1.5, 2.5, -0.5, 300.0, -300.0]], np.float32)
    y = _run(_model("QuantizeLinear", {"x": (F, x.shape)}, inits=[("s", np.float32(1)), ("z", np.int8(0))]), x)
    np.testing.assert_array_equal(y, [[0, 2, 2, 0, 127, -128]])
    assert y.dtype == np.int8
    xb = np.arange(6, dtype=np.float32).reshape(1, 6)
    scales = np.array([[1.0, 2.0, 4.0]], np.float32)
    y = _run(_model("QuantizeLinear", {"x": (F, xb.shape)}, {"axis": 1, "block_size": 2},
                    inits=[("s", scales), ("z", np.zeros((1, 3), np.uint8))]), xb)
    np.testing.assert_array_equal(y, [[0, 1, 1, 2, 1, 1]])


def test_softmax_cross_entropy_negative_ignore_index_weighted_mean():
    x = rng.standard_normal((3, 4, 2)).astype(np.float32)
    t = np.array([[0, -1], [3, 2], [-1, 1]], np.int64)
    w = np.array([1.0, 2.0, 0.5, 3.0], np.float32)
    m = _model("SoftmaxCrossEntropyLoss", {"x": (F, x.shape), "t": (I64, t.shape), "w": (F, [4])},
               {"ignore_index": -1}, opset=13, outputs=("loss", "logp"))
    loss, logp = _run(m, x, t, w)
    lp = x - np.log(np.exp(x).sum(1, keepdims=True))
    keep = t != -1
    picked = np.take_along_axis(lp, np.where(keep, t, 0)[:, None], 1)[:, 0]
    wt = w[np.where(keep, t, 0)] * keep
    np.testing.assert_allclose(loss, -(picked * wt).sum() / wt.sum(), rtol=1e-5)
    np.testing.assert_allclose(logp, lp, rtol=1e-5, atol=1e-6)
