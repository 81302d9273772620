"""A Slice whose result is one contiguous run of its input is a view at an offset (no kernel):
random slices against NumPy, read by a kernel, as a graph output, of a graph input, chained
with Squeeze, and the unbind of a packed QKV."""

from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.ops.tensor import _clamped, contiguous_slice_offset


def _slice_model(shape, starts, ends, axes, steps, *, relu_first: bool, squeeze: bool, direct_out: bool):
    """x -> [Relu] -> Slice -> [Squeeze axis 0 when it is 1] -> (y = that) or (y = 2 * that)."""
    inits = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
             (("starts", starts), ("ends", ends), ("axes", axes), ("steps", steps))]
    nodes, src = [], "x"
    if relu_first:
        nodes.append(helper.make_node("Relu", ["x"], ["r"]))
        src = "r"
    nodes.append(helper.make_node("Slice", [src, "starts", "ends", "axes", "steps"], ["s"]))
    last = "s"
    if squeeze:
        inits.append(numpy_helper.from_array(np.array([0], np.int64), "sq_axes"))
        nodes.append(helper.make_node("Squeeze", ["s", "sq_axes"], ["q"]))
        last = "q"
    if not direct_out:
        inits.append(numpy_helper.from_array(np.array(2, np.float32), "two"))
        nodes.append(helper.make_node("Mul", [last, "two"], ["y"]))
    else:
        nodes.append(helper.make_node("Identity", [last], ["y"]))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _reference(x, starts, ends, axes, steps, relu_first, squeeze, direct_out):
    sl = [slice(None)] * x.ndim
    for a, b, e, st in zip(axes, starts, ends, steps):
        sl[a] = _clamped(x.shape[a], slice(b, e, st))
    y = (np.maximum(x, 0) if relu_first else x)[tuple(sl)]
    if squeeze:
        y = y[0]
    return y if direct_out else 2 * y


@pytest.mark.parametrize("seed", range(12))
def test_random_slices_match_numpy_and_contiguous_ones_run_no_kernel(seed):
    rng = np.random.default_rng(seed)
    rank = int(rng.integers(2, 5))
    shape = tuple(int(v) for v in rng.integers(1, 6, rank))
    k = int(rng.integers(1, rank + 1))
    axes = [int(a) for a in rng.permutation(rank)[:k]]
    starts = [int(rng.integers(-shape[a], shape[a])) for a in axes]
    ends = [int(s_ % shape[a] + rng.integers(1, shape[a] + 1)) for s_, a in zip(starts, axes)]
    steps = [int(rng.choice([1, 1, 1, 2])) for _ in axes]
    relu_first, direct_out = bool(seed % 2), bool(seed % 3 == 0)
    contiguous = contiguous_slice_offset(shape, starts, ends, axes, steps) is not None
    sl_shape = _reference(np.zeros(shape, np.float32), starts, ends, axes, steps, False, False, True).shape
    squeeze = sl_shape[0] == 1 and len(sl_shape) > 1 and bool(seed % 4 < 2)
    x = rng.standard_normal(shape).astype(np.float32)
    m = kiln.compile(_slice_model(shape, starts, ends, axes, steps, relu_first=relu_first, squeeze=squeeze,
                                  direct_out=direct_out))
    want = _reference(x, starts, ends, axes, steps, relu_first, squeeze, direct_out)
    np.testing.assert_allclose(m.run({"x": x})["y"], want, rtol=1e-6, atol=1e-6)
    kernels = [re.findall(r"(\w+) node", what) for what, _ in m.profile({"x": x}, runs=1)]
    if contiguous:   # no kernel only copies the slice (a reader may still read through it)
        assert not any(ops and set(ops) <= {"Slice", "Squeeze"} for ops in kernels), \
            (shape, starts, ends, axes, steps, kernels)


def test_packed_qkv_unbind_is_three_views():
    """[b, s, 3, h, d] -> Transpose(2, 0, 3, 1, 4) -> three Slice/Squeeze on the first axis (how
    torch exports `qkv.unbind(0)`): one Transpose kernel, then q, k and v read in place."""
    b, s, h, d = 2, 5, 3, 4
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[2, 0, 3, 1, 4])]
    inits = [numpy_helper.from_array(np.array([0], np.int64), "zero")]
    for i, n in enumerate("qkv"):
        inits += [numpy_helper.from_array(np.array([i], np.int64), f"s{i}"),
                  numpy_helper.from_array(np.array([i + 1], np.int64), f"e{i}")]
        nodes += [helper.make_node("Slice", ["t", f"s{i}", f"e{i}", "zero"], [f"{n}1"]),
                  helper.make_node("Squeeze", [f"{n}1", "zero"], [n])]
    nodes += [helper.make_node("Mul", ["q", "k"], ["qk"]), helper.make_node("Sub", ["qk", "v"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [b, s, 3, h, d])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [b, h, s, d])], inits)
    m = kiln.compile(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))
    x = np.random.default_rng(0).standard_normal((b, s, 3, h, d)).astype(np.float32)
    t = x.transpose(2, 0, 3, 1, 4)
    np.testing.assert_allclose(m.run({"x": x})["y"], t[0] * t[1] - t[2], rtol=1e-6)
    kernels = [what for what, _ in m.profile({"x": x}, runs=1)]
    assert not any("Slice" in k or "Squeeze" in k for k in kernels), kernels
