"""Elementwise ops: error paths and the semantics numpy gets 'wrong' for ONNX."""

import math

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.ops.elementwise import _erf


def _run(op, inputs, opset=21, out_type=None, **attrs):
    """Compile a one-node model on the interpreter and run it on `inputs` (name -> array)."""
    names = list(inputs)
    vi = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
          for n, x in inputs.items()]
    node = helper.make_node(op, names, ["y"], name="n0", **attrs)
    out = helper.make_tensor_value_info("y", out_type or vi[0].type.tensor_type.elem_type, None)
    model = helper.make_model(helper.make_graph([node], "g", vi, [out]),
                              opset_imports=[helper.make_opsetid("", opset)])
    return kiln.compile(model, target="interpreter")(*inputs.values())


def _nonzero(rng, shape, dtype):
    x = rng.integers(-50, 50, shape).astype(dtype)
    return np.where(x == 0, 3, x).astype(dtype)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
def test_integer_div_truncates_toward_zero(dtype):
    rng = np.random.default_rng(0)
    a, b = _nonzero(rng, (4, 5), dtype), _nonzero(rng, (5,), dtype)
    want = (np.trunc(a.astype(np.float64) / b)).astype(dtype)
    np.testing.assert_array_equal(_run("Div", {"a": a, "b": b}), want)


def test_integer_mod_sign_follows_divisor_or_dividend():
    rng = np.random.default_rng(1)
    a, b = _nonzero(rng, (3, 4), np.int32), _nonzero(rng, (3, 1), np.int32)
    got0 = _run("Mod", {"a": a, "b": b}, fmod=0)
    got1 = _run("Mod", {"a": a, "b": b}, fmod=1)
    py = np.vectorize(lambda p, q: p % q)(a, b)             # Python: sign of divisor
    c = np.vectorize(lambda p, q: int(math.fmod(p, q)))(a, b)  # C: sign of dividend
    np.testing.assert_array_equal(got0, py)
    np.testing.assert_array_equal(got1, c)
    assert got0.dtype == got1.dtype == np.int32


def test_pow_keeps_base_dtype_with_integer_exponent():
    x = np.array([1.5, -2.0, 3.0], np.float32)
    e = np.array([2, 3, -1], np.int64)
    y = _run("Pow", {"x": x, "e": e})
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, x.astype(np.float64) ** e, rtol=1e-6)


def test_bitshift_out_of_range_amounts():
    x = np.array([-8, 8, -1, 5], np.int8)
    s = np.array([1, 9, -1, 8], np.int8)
    np.testing.assert_array_equal(_run("BitShift", {"x": x, "s": s}, direction="RIGHT"),
                                  np.array([-4, 0, -1, 0], np.int8))
    np.testing.assert_array_equal(_run("BitShift", {"x": x, "s": s}, direction="LEFT"),
                                  np.array([-16, 0, 0, 0], np.int8))


def test_variadic_mean_broadcasts():
    rng = np.random.default_rng(2)
    xs = {"a": rng.standard_normal((2, 1, 4)).astype(np.float32),
          "b": rng.standard_normal((3, 1)).astype(np.float32),
          "c": rng.standard_normal((4,)).astype(np.float32)}
    y = _run("Mean", xs)
    assert y.shape == (2, 3, 4) and y.dtype == np.float32
    np.testing.assert_allclose(y, (xs["a"] + xs["b"] + xs["c"]) / 3, rtol=1e-6)


def test_legacy_broadcast_axis_opset6():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    b = np.array([10, 20, 30], np.float32)
    y = _run("Add", {"a": a, "b": b}, opset=6, broadcast=1, axis=1)
    np.testing.assert_array_equal(y, a + b[:, None])


def test_erf_matches_math_erf():
    x = np.concatenate([np.linspace(-7, 7, 20001), np.logspace(-300, 0.7, 500)])
    want = np.array([math.erf(v) for v in x])
    np.testing.assert_allclose(_erf(x), want, rtol=1e-13, atol=0)
    assert np.isnan(_erf(np.array([np.nan])))[0] and _erf(np.array([-np.inf]))[0] == -1


def test_cast_saturates_float8_and_parses_strings():
    x = np.array([1e6, -1e6, 0.5, np.inf], np.float32)
    y = _run("Cast", {"x": x}, to=TensorProto.FLOAT8E4M3FN, out_type=TensorProto.FLOAT8E4M3FN)
    np.testing.assert_array_equal(y.astype(np.float32), [448, -448, 0.5, 448])
    y = _run("Cast", {"x": x}, to=TensorProto.FLOAT8E4M3FN, saturate=0,
             out_type=TensorProto.FLOAT8E4M3FN)
    assert np.isnan(y.astype(np.float32)[[0, 1, 3]]).all()
    s = np.array(["1.5", "-INF", "nan", "1e-5"], dtype=object)
    f = _run("Cast", {"s": s}, to=TensorProto.FLOAT, out_type=TensorProto.FLOAT)
    np.testing.assert_array_equal(f, np.array([1.5, -np.inf, np.nan, 1e-5], np.float32))
    back = _run("Cast", {"x": np.array([1.5, -2.0], np.float32)}, to=TensorProto.STRING,
                out_type=TensorProto.STRING)
    assert back.dtype == object and list(back) == ["1.5", "-2"]  # as ONNX Runtime prints them


def test_cast_bfloat16_rounds_to_nearest_even():
    x = np.array([1.00390625, 1.01171875], np.float32)  # exactly halfway between bfloat16 neighbours
    y = _run("Cast", {"x": x}, to=TensorProto.BFLOAT16, out_type=TensorProto.BFLOAT16)
    assert y.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(y.astype(np.float32), [1.0, 1.015625])


def test_dropout_training_mask_and_scale():
    x = np.ones((50, 40), np.float32)
    node = helper.make_node("Dropout", ["x", "r", "t"], ["y", "m"], seed=3)
    g = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("m", TensorProto.BOOL, None)],
        [helper.make_tensor("r", TensorProto.FLOAT, [], [0.25]),
         helper.make_tensor("t", TensorProto.BOOL, [], [True])])
    y, m = kiln.compile(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]),
                        target="interpreter")(x)
    assert m.dtype == np.bool_ and 0.65 < m.mean() < 0.85
    np.testing.assert_allclose(y, np.where(m, 1 / 0.75, 0), rtol=1e-6)


@pytest.mark.parametrize("op, inputs, attrs, match", [
    ("Add", {"a": np.ones(3, np.float32), "b": np.ones(3, np.int32)}, {}, "share one element type"),
    ("Add", {"a": np.ones(3, np.float32), "b": np.ones(4, np.float32)}, {}, "cannot broadcast"),
    ("Sin", {"x": np.ones(3, np.int32)}, {}, "must be a float tensor"),
    ("And", {"a": np.ones(3, np.int32), "b": np.ones(3, np.int32)}, {}, "must be a bool tensor"),
    ("Mod", {"a": np.ones(3, np.int32), "b": np.ones(3, np.int32)}, {"fmod": 2}, "fmod must be"),
    ("BitShift", {"a": np.ones(3, np.uint8), "b": np.ones(3, np.uint8)}, {"direction": "UP"},
     "direction must be"),
    ("Gelu", {"x": np.ones(3, np.float32)}, {"approximate": "erf"}, "approximate must be"),
    ("SwiGLU", {"a": np.ones((2, 3), np.float32), "b": np.ones((1, 3), np.float32)}, {},
     "identical shapes"),
    ("BitCast", {"x": np.ones(3, np.float32)}, {"to": TensorProto.INT64}, "equal bit width"),
])
def test_bad_nodes_fail_naming_the_node(op, inputs, attrs, match):
    opset = 28 if op == "SwiGLU" else 26 if op == "BitCast" else 21
    with pytest.raises(kiln.KilnError, match=match) as e:
        _run(op, inputs, opset=opset, **attrs)
    assert "n0" in str(e.value) and op in str(e.value)


def test_old_forms_cast1_string_to_and_dropout7_mask():
    x = np.array([1.5, -2.0], np.float32)
    y = _run("Cast", {"x": x}, opset=1, to="DOUBLE", out_type=TensorProto.DOUBLE)
    assert y.dtype == np.float64 and list(y) == [1.5, -2.0]
    node = helper.make_node("Dropout", ["x"], ["y", "m"], ratio=0.3)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                           helper.make_tensor_value_info("m", TensorProto.FLOAT, None)])
    y, m = kiln.compile(helper.make_model(g, opset_imports=[helper.make_opsetid("", 7)]),
                        target="interpreter")(x)
    np.testing.assert_array_equal(y, x)
    assert m.dtype == np.float32 and (m == 1).all()
