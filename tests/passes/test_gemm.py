"""MatMul + Add(bias) → Gemm for matrices; N-D MatMuls keep their Add."""

import numpy as np
import pytest

from tests.passes.util import check, prog

F = np.float32


@pytest.mark.parametrize("bias_shape", [(4,), (1, 4), (5, 1), ()])
def test_matmul_add_is_gemm(bias_shape):
    sig = "(%x: float32[5,3], %w: float32[3,4]) -> (%y)"
    before = ('  %m: float32[5,4] = MatMul(%x, %w) name "mm"\n'
              '  %y: float32[5,4] = Add(%b, %m) name "add"')
    after = '  %y: float32[5,4] = Gemm(%x, %w, %b) name "mm"'
    check("matmul_add_to_gemm", prog(sig, before), prog(sig, after),
          b=np.arange(1, 1 + np.prod(bias_shape, dtype=int), dtype=F).reshape(bias_shape))


def test_nd_matmul_and_growing_bias_stay():
    sig = "(%x: float32[2,5,3], %w: float32[3,4], %v: float32[5,1], %u: float32[1,3]) -> (%y, %z)"
    before = ('  %m: float32[2,5,4] = MatMul(%x, %w) name "mm"\n'
              '  %y: float32[2,5,4] = Add(%m, %b) name "add"\n'
              '  %n: float32[5,3] = MatMul(%v, %u) name "mm2"\n'
              '  %z: float32[2,5,3] = Add(%n, %c) name "add2"')
    check("matmul_add_to_gemm", prog(sig, before), None, b=np.ones(4, F),
          c=np.ones((2, 1, 1), F))


def test_matmul_read_elsewhere_stays():
    sig = "(%x: float32[5,3], %w: float32[3,4]) -> (%y, %m)"
    before = ('  %m: float32[5,4] = MatMul(%x, %w) name "mm"\n'
              '  %y: float32[5,4] = Add(%m, %b) name "add"')
    check("matmul_add_to_gemm", prog(sig, before), None, b=np.ones(4, F))
