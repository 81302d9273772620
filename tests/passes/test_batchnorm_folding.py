"""BatchNorm folding into Conv / Gemm / MatMul(+Add): the BN disappears, the numbers stay."""

import numpy as np
import pytest

from tests.passes.util import check, graph, prog, run_pass

F = np.float32
rng = np.random.default_rng(0)
C = 4
BN = dict(scale=rng.uniform(0.5, 1.5, C).astype(F), bias=rng.normal(0, 0.1, C).astype(F),
          mean=rng.normal(0, 0.1, C).astype(F), var=rng.uniform(0.5, 2, C).astype(F))
EPS = 1e-3


def _s_t():
    s = BN["scale"].astype(np.float64) / np.sqrt(BN["var"].astype(np.float64) + EPS)
    return s, BN["bias"] - BN["mean"] * s


def _bn(x, y, shape):
    return (f'  %{y}: float32[{shape}] = BatchNormalization(%{x}, %scale, %bias, %mean, %var) '
            f'{{epsilon = {EPS}}} name "bn"')


@pytest.mark.parametrize("with_bias", [False, True])
def test_conv_bn(with_bias):
    sig = "(%x: float32[1,3,6,6]) -> (%y)"
    w = rng.normal(0, 0.3, (C, 3, 3, 3)).astype(F)
    b = rng.normal(0, 0.1, C).astype(F)
    ins = "%x, %w, %b" if with_bias else "%x, %w"
    before = (f'  %c: float32[1,4,4,4] = Conv({ins}) {{kernel_shape = [3, 3]}} name "conv"\n'
              + _bn("c", "y", "1,4,4,4"))
    s, t = _s_t()
    w2 = (w * s[:, None, None, None]).astype(F)
    b2 = ((b if with_bias else 0) * s + t).astype(F)
    after = '  %y: float32[1,4,4,4] = Conv(%x, %w.bn, %conv.bias) {kernel_shape = [3, 3]} name "conv"'
    _, stats = check("fold_batchnorm", prog(sig, before), prog(sig, after), rtol=1e-4, atol=1e-5,
                     w=w, b=b, **BN, **{"w.bn": w2, "conv.bias": b2})
    assert stats.removed == 2 and stats.added == 1 and stats.fired == {"Conv+BN": 1}


@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_bn(trans_b):
    sig = "(%x: float32[5,3]) -> (%y)"
    w = rng.normal(0, 0.5, (C, 3) if trans_b else (3, C)).astype(F)
    c = rng.normal(0, 0.1, C).astype(F)
    before = (f'  %g: float32[5,4] = Gemm(%x, %w, %c) {{beta = 0.5, transB = {trans_b}}} name "gemm"\n'
              + _bn("g", "y", "5,4"))
    s, t = _s_t()
    w2 = (w * (s[:, None] if trans_b else s[None, :])).astype(F)
    c2 = (0.5 * c * s + t).astype(F)
    after = (f'  %y: float32[5,4] = Gemm(%x, %w.bn, %gemm.bias) {{beta = 1.0, transB = {trans_b}}} '
             'name "gemm"')
    check("fold_batchnorm", prog(sig, before), prog(sig, after), rtol=1e-4, atol=1e-5,
          w=w, c=c, **BN, **{"w.bn": w2, "gemm.bias": c2})


@pytest.mark.parametrize("with_add", [False, True])
def test_matmul_bn(with_add):
    sig = "(%x: float32[5,3]) -> (%y)"
    w = rng.normal(0, 0.5, (3, C)).astype(F)
    c = rng.normal(0, 0.1, C).astype(F)
    before = '  %m: float32[5,4] = MatMul(%x, %w) name "mm"\n'
    if with_add:
        before += '  %a: float32[5,4] = Add(%c, %m) name "add"\n'
    before += _bn("a" if with_add else "m", "y", "5,4")
    s, t = _s_t()
    after = ('  %mm_0: float32[5,4] = MatMul(%x, %w.bn) name "mm"\n'
             '  %y: float32[5,4] = Add(%mm_0, %mm.bias) name "bn.Add"')
    check("fold_batchnorm", prog(sig, before), prog(sig, after), rtol=1e-4, atol=1e-5, w=w, c=c,
          **BN, **{"w.bn": (w * s).astype(F), "mm.bias": ((c if with_add else 0) * s + t).astype(F)})


def test_conv_read_elsewhere_is_not_folded():
    sig = "(%x: float32[1,3,6,6]) -> (%y, %c)"
    before = ('  %c: float32[1,4,4,4] = Conv(%x, %w) {kernel_shape = [3, 3]} name "conv"\n'
              + _bn("c", "y", "1,4,4,4"))
    check("fold_batchnorm", prog(sig, before), None, w=rng.normal(0, 0.3, (C, 3, 3, 3)).astype(F),
          **BN)


def test_training_mode_bn_is_not_folded():
    sig = "(%x: float32[1,3,6,6]) -> (%y)"
    before = ('  %c: float32[1,4,4,4] = Conv(%x, %w) {kernel_shape = [3, 3]} name "conv"\n'
              '  %y: float32[1,4,4,4] = BatchNormalization(%c, %scale, %bias, %mean, %var) '
              '{training_mode = 1} name "bn"')
    g = graph(prog(sig, before), w=rng.normal(0, 0.3, (C, 3, 3, 3)).astype(F), **BN)
    out, stats = run_pass("fold_batchnorm", g)
    assert not stats.changed
