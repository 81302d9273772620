"""Convolution, pooling, normalization and resampling ops: naive-loop cross-checks and error paths.

The naive loops are deliberately the textbook definition (one output element at a
time), so they check the vectorized references' index arithmetic independently.
"""

import itertools

import numpy as np
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

import kiln
from kiln.errors import KilnError
from kiln.frontends.onnx import load_onnx

rng = np.random.default_rng(0)


def _model(op, inputs, n_out=1, opset=21, consts=(), **attrs):
    names = [n if x is not None else "" for n, x in inputs.items()]
    vi = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
          for n, x in inputs.items() if x is not None and n not in consts]
    inits = [helper.make_tensor(n, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape, x.ravel().tolist())
             for n, x in inputs.items() if n in consts]
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op, names, outs, name="n0", **attrs)
    graph = helper.make_graph([node], "g", vi, [helper.make_value_info(o, helper.TypeProto()) for o in outs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _run(op, inputs, n_out=1, opset=21, consts=(), **attrs):
    """Compile a one-node model on the interpreter and run it; returns a list of outputs."""
    model = _model(op, inputs, n_out, opset, consts, **attrs)
    feeds = [x for n, x in inputs.items() if x is not None and n not in consts]
    out = kiln.compile(model, target="interpreter")(*feeds)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _rand(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def naive_conv2d(x, w, b, group, strides, dil, pads):
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    xp = np.pad(x, [(0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])])
    oh = (xp.shape[2] - (kh - 1) * dil[0] - 1) // strides[0] + 1
    ow = (xp.shape[3] - (kw - 1) * dil[1] - 1) // strides[1] + 1
    y = np.zeros((n, m, oh, ow))
    mg = m // group
    for b_, o, i, j in itertools.product(range(n), range(m), range(oh), range(ow)):
        g = o // mg
        acc = b[o]
        for ci, ki, kj in itertools.product(range(cg), range(kh), range(kw)):
            acc += xp[b_, g * cg + ci, i * strides[0] + ki * dil[0], j * strides[1] + kj * dil[1]] * w[o, ci, ki, kj]
        y[b_, o, i, j] = acc
    return y


def test_grouped_strided_dilated_conv_matches_naive_loop():
    x, w, b = _rand(2, 6, 11, 9), _rand(4, 3, 3, 2), _rand(4)
    kw = dict(group=2, strides=[2, 1], dilations=[2, 3], pads=[1, 0, 2, 1])
    (y,) = _run("Conv", {"x": x, "w": w, "b": b}, **kw)
    ref = naive_conv2d(x, w, b, 2, kw["strides"], kw["dilations"], kw["pads"])
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


def test_conv_transpose_matches_naive_scatter():
    x, w = _rand(1, 4, 3, 4), _rand(4, 3, 3, 2)       # group 2: 6 output channels
    s, d, pads, opad = [2, 3], [1, 2], [1, 0, 0, 2], [1, 2]
    (y,) = _run("ConvTranspose", {"x": x, "w": w}, group=2, strides=s, dilations=d, pads=pads, output_padding=opad)
    full = np.zeros((1, 6, s[0] * 2 + 2 + 1 + opad[0], s[1] * 3 + 2 + 1 + opad[1]))
    for c, i, j, ki, kj, mo in itertools.product(range(4), range(3), range(4), range(3), range(2), range(3)):
        full[0, (c // 2) * 3 + mo, i * s[0] + ki * d[0], j * s[1] + kj * d[1]] += x[0, c, i, j] * w[c, mo, ki, kj]
    ref = full[:, :, pads[0]:full.shape[2] - pads[2], pads[1]:full.shape[3] - pads[3]]
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("storage_order", [0, 1])
def test_maxpool_indices_point_at_the_max(storage_order):
    x = _rand(2, 3, 7, 6)
    y, idx = _run("MaxPool", {"x": x}, n_out=2, opset=12, kernel_shape=[3, 2], strides=[2, 2],
                  pads=[1, 1, 1, 0], dilations=[1, 2] if not storage_order else [1, 1], storage_order=storage_order)
    flat = x.transpose(0, 1, 3, 2).ravel() if storage_order else x.ravel()
    np.testing.assert_array_equal(flat[idx], y)


@pytest.mark.parametrize("include", [0, 1])
def test_average_pool_ceil_mode_divisor(include):
    x = _rand(1, 1, 5, 5)
    (y,) = _run("AveragePool", {"x": x}, kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 0, 0],
                ceil_mode=1, count_include_pad=include)
    assert y.shape == (1, 1, 3, 3)
    xp = np.pad(x[0, 0], [(1, 0), (1, 0)], constant_values=np.nan)
    for i, j in itertools.product(range(3), range(3)):
        win = xp[2 * i:2 * i + 2, 2 * j:2 * j + 2]   # windows past the end are clipped (ceil overhang)
        count = win.size if include else np.count_nonzero(~np.isnan(win))
        assert np.isclose(y[0, 0, i, j], np.nansum(win) / count, atol=1e-6)


def test_group_norm_18_per_group_scale_equals_21_repeated():
    x, s, b = _rand(2, 6, 4), _rand(3), _rand(3)
    (y18,) = _run("GroupNormalization", {"x": x, "s": s, "b": b}, opset=18, num_groups=3)
    (y21,) = _run("GroupNormalization", {"x": x, "s": np.repeat(s, 2), "b": np.repeat(b, 2)}, opset=21, num_groups=3)
    np.testing.assert_allclose(y18, y21, rtol=1e-5, atol=1e-6)


def test_batchnorm_opset7_non_spatial():
    x = _rand(2, 3, 4)
    s, b, m, v = _rand(3, 4), _rand(3, 4), _rand(3, 4), np.abs(_rand(3, 4)) + 0.1
    (y,) = _run("BatchNormalization", {"x": x, "s": s, "b": b, "m": m, "v": v}, opset=7, spatial=0, epsilon=1e-3)
    np.testing.assert_allclose(y, (x - m) / np.sqrt(v + 1e-3) * s + b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode, ctm", [("linear", "half_pixel"), ("cubic", "align_corners"),
                                       ("nearest", "asymmetric"), ("linear", "pytorch_half_pixel")])
def test_resize_agrees_with_onnx_reference(mode, ctm):
    x = _rand(1, 2, 5, 6)
    inputs = {"x": x, "roi": None, "scales": None, "sizes": np.array([1, 2, 8, 4], np.int64)}
    (y,) = _run("Resize", inputs, consts=("sizes",), opset=19, mode=mode, coordinate_transformation_mode=ctm)
    model = _model("Resize", inputs, 1, 19, ("sizes",), mode=mode, coordinate_transformation_mode=ctm)
    np.testing.assert_allclose(y, ReferenceEvaluator(model).run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_symbolic_batch_flows_through_conv_and_pool():
    x = helper.make_tensor_value_info("x", 1, ["batch", 3, 16, 16])
    w = helper.make_tensor("w", 1, [8, 3, 3, 3], _rand(8, 3, 3, 3).ravel().tolist())
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("MaxPool", ["c"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    g = helper.make_graph(nodes, "g", [x], [helper.make_value_info("y", helper.TypeProto())], [w])
    graph = load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))
    assert graph.outputs[0].type.shape == ("batch", 8, 4, 4)


def test_conv_channel_mismatch_is_a_kiln_error():
    with pytest.raises(KilnError, match="channels"):
        _run("Conv", {"x": _rand(1, 4, 5, 5), "w": _rand(2, 3, 3, 3)})


def test_conv_kernel_larger_than_input_is_a_kiln_error():
    with pytest.raises(KilnError, match="exceeds"):
        _run("Conv", {"x": _rand(1, 1, 2, 2), "w": _rand(1, 1, 3, 3)})


def test_resize_sizes_of_wrong_length_is_a_kiln_error():
    with pytest.raises(KilnError, match="sizes has 2 entries, expected 4"):
        _run("Resize", {"x": _rand(1, 1, 2, 2), "roi": None, "scales": None, "sizes": np.array([4, 4], np.int64)},
             consts=("sizes",), opset=13)


def test_bad_auto_pad_is_a_kiln_error():
    with pytest.raises(KilnError, match="auto_pad"):
        _run("MaxPool", {"x": _rand(1, 1, 4, 4)}, kernel_shape=[2, 2], auto_pad="SAME")
