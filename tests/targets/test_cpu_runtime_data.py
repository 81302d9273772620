"""target="cpu": ops whose behaviour depends on input data known only at run time —
Dropout's training_mode and ratio, Range's bfloat16 bounds — against the interpreter."""

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import helper

import kiln

F, B, BF16 = onnx.TensorProto.FLOAT, onnx.TensorProto.BOOL, onnx.TensorProto.BFLOAT16


def _model(nodes, inputs, outputs, opset=17):
    g = helper.make_graph(nodes, "m", inputs, outputs)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _dropout(seed=None, dtype=F, mask=True):
    attrs = {} if seed is None else {"seed": seed}
    outs = ["y", "z"] if mask else ["y"]
    return _model([helper.make_node("Dropout", ["x", "r", "t"], outs, **attrs)],
                  [_vi("x", dtype, [4, 33]), _vi("r", F, []), _vi("t", B, [])],
                  [_vi("y", dtype, [4, 33])] + ([_vi("z", B, [4, 33])] if mask else []))


def _feeds(ratio, training, dtype=np.float32):
    x = np.random.default_rng(1).standard_normal((4, 33)).astype(dtype)
    return {"x": x, "r": np.array(ratio, np.float32), "t": np.array(training)}


@pytest.mark.parametrize("ratio, training", [(0.75, True), (0.3, True), (0.0, True), (0.5, False)])
def test_dropout_training_mode_read_at_run_time_matches_the_reference(ratio, training):
    """A seeded node draws the reference's mask (NumPy's legacy MT19937) on every call;
    training_mode false or ratio 0 is the identity with a mask of ones."""
    native = kiln.compile(_dropout(seed=7), target="cpu")
    ref = kiln.compile(_dropout(seed=7), target="interpreter")
    feeds = _feeds(ratio, training)
    want = ref.run(feeds)
    for _ in range(2):
        got = native.run(feeds)
        np.testing.assert_array_equal(got["z"], want["z"])
        np.testing.assert_allclose(got["y"], want["y"], rtol=1e-6)
    if training and ratio:
        assert 0 < want["z"].mean() < 1  # some dropped, some kept


def test_one_dropout_module_serves_both_modes_and_float64():
    m = _dropout(seed=3, dtype=onnx.TensorProto.DOUBLE, mask=False)
    native, ref = kiln.compile(m, target="cpu"), kiln.compile(m, target="interpreter")
    for training in (True, False, True):
        feeds = _feeds(0.4, training, np.float64)
        np.testing.assert_allclose(native.run(feeds)["y"], ref.run(feeds)["y"], rtol=1e-12)


def test_unseeded_dropout_draws_a_fresh_mask_and_scales_what_it_keeps():
    native = kiln.compile(_dropout(), target="cpu")
    feeds = _feeds(0.5, True)
    a, b = native.run(feeds), native.run(feeds)
    assert not np.array_equal(a["z"], b["z"])
    for out in (a, b):
        np.testing.assert_allclose(out["y"], np.where(out["z"], feeds["x"] * 2, 0), rtol=1e-6)
        assert 0.2 < out["z"].mean() < 0.8


def test_dropout_ratio_out_of_range_is_a_clear_error():
    native = kiln.compile(_dropout(seed=0), target="cpu")
    with pytest.raises(kiln.KilnError, match="Dropout"):
        native.run(_feeds(1.0, True))


def test_range_with_bfloat16_bounds_given_at_run_time():
    m = _model([helper.make_node("Range", ["s", "l", "d"], ["y"])],
               [_vi(n, BF16, []) for n in "sld"], [_vi("y", BF16, None)], opset=11)
    native, ref = kiln.compile(m, target="cpu"), kiln.compile(m, target="interpreter")
    for s, lim, d in [(1.5, 9.0, 0.75), (10.0, -3.0, -2.5), (2.0, 2.0, 1.0)]:
        feeds = {k: np.array(v, ml_dtypes.bfloat16) for k, v in zip("sld", (s, lim, d))}
        got, want = native.run(feeds)["y"], ref.run(feeds)["y"]
        assert got.dtype == ml_dtypes.bfloat16 and got.shape == want.shape
        np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))


def test_dropout_without_ratio_uses_one_half():
    m = _model([helper.make_node("Dropout", ["x", "", "t"], ["y", "z"], seed=11)],
               [_vi("x", F, [4, 33]), _vi("t", B, [])], [_vi("y", F, [4, 33]), _vi("z", B, [4, 33])])
    feeds = _feeds(0.5, True)
    del feeds["r"]
    got, want = kiln.compile(m, target="cpu").run(feeds), kiln.compile(m, target="interpreter").run(feeds)
    np.testing.assert_array_equal(got["z"], want["z"])
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-6)
