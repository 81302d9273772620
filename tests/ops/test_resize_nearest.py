"""Nearest Resize's native gather (kiln.lower.image._nearest_body) against the reference, on random
ranks, sizes, scales (up and down, per axis), nearest modes and coordinate modes (hypothesis)."""

import numpy as np
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import kiln

MODES = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
CTMS = ["asymmetric", "half_pixel", "align_corners", "pytorch_half_pixel", "tf_half_pixel_for_nn"]


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck),
          phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(shape=st.lists(st.integers(1, 7), min_size=1, max_size=4),
       factors=st.lists(st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0]), min_size=4, max_size=4),
       nm=st.sampled_from(MODES), ctm=st.sampled_from(CTMS), by_sizes=st.booleans(),
       dtype=st.sampled_from([np.float32, np.int64]))
def test_nearest_matches_reference(shape, factors, nm, ctm, by_sizes, dtype):
    r = len(shape)
    scales = np.array(factors[:r], np.float32)
    sizes = np.maximum(1, np.floor(np.array(shape) * scales)).astype(np.int64)
    inits = [numpy_helper.from_array(np.zeros(0, np.float32), "roi")]
    if by_sizes:
        inits += [numpy_helper.from_array(np.zeros(0, np.float32), "sc"), numpy_helper.from_array(sizes, "sz")]
        ins = ["x", "roi", "sc", "sz"]
    else:
        inits.append(numpy_helper.from_array(scales, "sc"))
        ins = ["x", "roi", "sc"]
    et = TensorProto.FLOAT if dtype == np.float32 else TensorProto.INT64
    node = helper.make_node("Resize", ins, ["y"], mode="nearest", nearest_mode=nm,
                            coordinate_transformation_mode=ctm)
    g = helper.make_graph([node], "r", [helper.make_tensor_value_info("x", et, shape)],
                          [helper.make_tensor_value_info("y", et, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 100).astype(dtype)
    want = kiln.compile(model, "interpreter", opt_level=0)(x)
    got = kiln.compile(model)(x)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
