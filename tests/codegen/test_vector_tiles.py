"""A vectorized loop of one vector's lanes inside an unrolled loop (a register tile) is
emitted as GCC vector code (kiln.codegen.c, Emitter.vector_store): same numbers as NumPy,
including signed zeros, the lane-invariant selects of a zero border and float64; loops it
cannot write that way stay `#pragma omp simd` loops."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.codegen import build_c, emit_c
from kiln.dtypes import DType
from kiln.loops import LoopModule, Schedule, compute, const, lower, placeholder, select

rng = np.random.default_rng(5)


def tile(dtype: DType, lanes: int, fn, name="tile", unroll=True):
    """out[r, c, l] = fn(x, w, r, c, l) over 3 x 4 x lanes, (r, c) unrolled, l vectorized."""
    x = placeholder((3, 6, lanes), dtype, "x")
    w = placeholder((4, lanes), dtype, "w")
    out = compute((3, 4, lanes), lambda r, c, l: fn(x, w, r, c, l), "out", dtype)
    s = Schedule(out)
    r, c, l = s[out].axis
    if unroll:
        s[out].unroll(r)
        s[out].unroll(c)
    s[out].vectorize(l)
    return lower(s, [x, w, out], name)


def run(func, dtype, lanes, zeros=False):
    x = rng.standard_normal((3, 6, lanes)).astype(dtype.np)
    w = rng.standard_normal((4, lanes)).astype(dtype.np)
    if zeros:   # signed zeros must come through as they are
        x[0, :, :] = -0.0
        w[:] = np.where(w > 0, 0.0, -0.0)
    y = np.empty((3, 4, lanes), dtype.np)
    build_c(func)[func.name](x, w, y)
    return x, w, y


@pytest.mark.parametrize("dtype, lanes", [(DType.float32, 4), (DType.float32, 8), (DType.float32, 16),
                                          (DType.float64, 2), (DType.float64, 8)])
def test_tile_with_border_select_is_vector_code_and_matches_numpy(dtype, lanes):
    def fn(x, w, r, c, l):   # a shifted window with a zero border (a conv's padding), times a weight
        inside = (c + r - 1 >= 0) & (c + r - 1 < 6)
        return select(inside, x[(r, c + r - 1, l)], const(0, dtype)) * w[(c, l)] + x[(r, c, l)] / const(2, dtype)
    func = tile(dtype, lanes, fn)
    text = emit_c(LoopModule([func]))
    assert "kiln_vec_" in text and "omp simd" not in text
    x, w, y = run(func, dtype, lanes)
    want = np.zeros((3, 4, lanes), dtype.np)
    for r in range(3):
        for c in range(4):
            j = c + r - 1
            want[r, c] = (x[r, j] if 0 <= j < 6 else 0) * w[c] + x[r, c] / 2
    tol = 1e-6 if dtype is DType.float32 else 1e-13     # (a * b + c may run as one FMA)
    np.testing.assert_allclose(y, want, rtol=tol, atol=tol)


def test_broadcast_values_and_signed_zeros_are_exact():
    func = tile(DType.float32, 16, lambda x, w, r, c, l: x[(r, c, 0)] - w[(c, l)])   # x broadcast over lanes
    assert "kiln_vec_" in emit_c(LoopModule([func]))
    x, w, y = run(func, DType.float32, 16, zeros=True)
    want = x[:, :4, :1] - w[None]
    np.testing.assert_array_equal(y, want)
    np.testing.assert_array_equal(np.signbit(y), np.signbit(want))
    const_func = tile(DType.float32, 16, lambda x, w, r, c, l: const(-0.0, DType.float32), name="negzero")
    _, _, y = run(const_func, DType.float32, 16)
    assert np.all(y == 0) and np.all(np.signbit(y))


@pytest.mark.parametrize("case", ["strided", "not unrolled", "odd lanes", "call"])
def test_other_loops_stay_simd_loops(case):
    from kiln.loops import call
    if case == "strided":     # lanes read with a stride: no contiguous vector
        func = tile(DType.float32, 8, lambda x, w, r, c, l: x[(r, c, l // 2)] * w[(c, l)])
    elif case == "not unrolled":
        func = tile(DType.float32, 8, lambda x, w, r, c, l: x[(r, c, l)] * w[(c, l)], unroll=False)
    elif case == "odd lanes":
        func = tile(DType.float32, 5, lambda x, w, r, c, l: x[(r, c, l)] * w[(c, l)])
    else:
        func = tile(DType.float32, 8, lambda x, w, r, c, l: call("exp", x[(r, c, l)]))
    text = emit_c(LoopModule([func]))
    assert "kiln_vec_" not in text and "omp simd" in text
