"""kiln's inline float32 erfc (kiln/codegen/c_src/kiln_erfc.h), through exact GELU, its user:
0.5 x erfc(-x / sqrt 2) against the same formula in float64 on float32's own argument, over
a dense sweep, the tails (where erfc is tiny or near 2) and the special values."""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto, helper

import kiln

F = np.float32


def gelu_model(n: int):
    g = helper.make_graph([helper.make_node("Gelu", ["x"], ["y"])], "gelu",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)], ir_version=9)


def reference(x: np.ndarray) -> np.ndarray:
    """0.5 x erfc(z) in float64 with z rounded as the kernel rounds it, fl(-x * fl(1/sqrt 2))."""
    z = (-x).astype(F) * F(1 / math.sqrt(2))
    erfc = np.array([math.erfc(v) for v in z.astype(np.float64)])
    return 0.5 * x.astype(np.float64) * erfc


def test_gelu_erfc_within_a_few_ulp_everywhere():
    rng = np.random.default_rng(0)
    x = np.concatenate([np.linspace(-14, 14, 200_001, dtype=F),            # both tails: erfc -> 0 and -> 2
                        rng.standard_normal(50_000).astype(F) * 3,
                        np.linspace(-1e-3, 1e-3, 2001, dtype=F),            # erfc near 1
                        F([0.5, -0.5, 1e-30, -1e-30, 13.1, -13.1])]).astype(F)
    m = kiln.compile(gelu_model(x.size))
    got = m.run({"x": x})["y"].astype(np.float64)
    want = reference(x)
    tiny = np.abs(want) < 1e-35         # float32 subnormal territory: an absolute bound
    ulp = np.spacing(np.abs(want).astype(F)).astype(np.float64)
    err = np.abs(got - want) / ulp
    assert err[~tiny].max() <= 6, (x[~tiny][err[~tiny].argmax()], err[~tiny].max())
    assert np.abs(got - want)[tiny].max() <= 1e-37


def test_gelu_erfc_special_values():
    x = F([np.nan, np.inf, -np.inf, 0.0, -0.0, 9.25, -9.25, 3e38, -3e38, 1e-45])
    y = kiln.compile(gelu_model(x.size)).run({"x": x})["y"]
    assert np.isnan(y[0]) and y[1] == np.inf and np.isnan(y[2])   # -inf * erfc(inf) = -inf * 0
    assert y[3] == 0 and y[4] == 0 and y[5] == F(9.25)
    assert abs(y[6] - reference(x[6:7])[0]) <= 6 * np.spacing(abs(y[6]))     # -1.04e-19
    assert y[7] == F(3e38) and y[8] == 0 and 0 <= y[9] <= F(1e-45)
