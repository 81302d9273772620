"""ONNX Attention with nonpad_kv_seqlen (a static cache's valid lengths) on the fused kernel:
the keys past each batch entry's length are never read (they hold NaN here), the causal
offset counts from the valid length's end, lengths 0 (a zero row, ONNX's rule), 1 and
the full capacity, against the NumPy reference."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import kiln


def _model(b, hq, hkv, sq, cap, d, causal):
    f = TensorProto.FLOAT
    ins = [helper.make_tensor_value_info("q", f, [b, hq, sq, d]),
           helper.make_tensor_value_info("k", f, [b, hkv, cap, d]),
           helper.make_tensor_value_info("v", f, [b, hkv, cap, d]),
           helper.make_tensor_value_info("n", TensorProto.INT64, [b])]
    node = helper.make_node("Attention", ["q", "k", "v", "", "", "", "n"], ["y"], is_causal=int(causal))
    g = helper.make_graph([node], "a", ins, [helper.make_tensor_value_info("y", f, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 24)])


@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("b,hq,hkv,sq,cap,d,lens", [
    (4, 4, 2, 1, 40, 16, [0, 1, 17, 40]),      # one query per step: decoding
    (2, 2, 1, 5, 70, 8, [5, 66]),              # a prompt of 5 into a cache, two blocks of keys
    (3, 3, 3, 3, 19, 12, [3, 19, 4]),
])
def test_nonpad_matches_reference(b, hq, hkv, sq, cap, d, lens, causal):
    m = _model(b, hq, hkv, sq, cap, d, causal)
    rng = np.random.default_rng(len(lens) + cap)
    feeds = {"q": rng.standard_normal((b, hq, sq, d)).astype(np.float32),
             "k": rng.standard_normal((b, hkv, cap, d)).astype(np.float32),
             "v": rng.standard_normal((b, hkv, cap, d)).astype(np.float32),
             "n": np.array(lens, np.int64)}
    want = kiln.compile(m, target="interpreter").run(feeds)["y"]
    for i, n in enumerate(lens):   # the unused capacity: never read by the fused kernel
        feeds["k"][i, :, n:] = np.nan
        feeds["v"][i, :, n:] = np.nan
    got = kiln.compile(m).run(feeds)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    if 0 in lens:
        assert np.all(got[lens.index(0)] == 0)
