"""Attention is found and reported (Softmax(Q·K^T·scale + mask)·V), never rewritten."""

import numpy as np

from kiln.passes import AttentionGroup
from tests.passes.util import graph, prog, run_pass

F = np.float32
SIG = "(%q: float32[1,2,4,8], %k: float32[1,2,8,4], %v: float32[1,2,4,8], %mask: float32[1,1,1,4]) -> (%y)"


def _attention(scale_op="Div", mask_line='  %m: float32[1,2,4,4] = Add(%s, %mask) name "mask"'):
    return prog(SIG, "\n".join([
        '  %qk: float32[1,2,4,4] = MatMul(%q, %k) name "qk"',
        f'  %s: float32[1,2,4,4] = {scale_op}(%qk, %c) name "scale"',
        mask_line,
        '  %p: float32[1,2,4,4] = Softmax(%m) {axis = -1} name "softmax"',
        '  %y: float32[1,2,4,8] = MatMul(%p, %v) name "pv"']))


def test_scaled_masked_attention_is_reported():
    g = graph(_attention(), c=F(2.0))
    out, stats = run_pass("find_attention", g)
    assert not stats.changed
    assert stats.findings == [AttentionGroup(("qk", "scale", "mask", "softmax", "pv"), 0.5, "additive")]
    assert "attention (qk, scale, mask, softmax, pv) scale 0.5, mask additive" in str(stats)


def test_where_mask_and_multiplied_scale():
    where = '  %m: float32[1,2,4,4] = Where(%b, %s, %neg) name "mask"'
    text = _attention("Mul", where).replace("%mask: float32[1,1,1,4]", "%b: bool[1,1,4,4]")
    out, stats = run_pass("find_attention", graph(text, c=F(0.25), neg=F(-1e4)))
    assert stats.findings == [AttentionGroup(("qk", "scale", "mask", "softmax", "pv"), 0.25, "where")]


def test_softmax_not_followed_by_matmul_is_not_attention():
    text = prog("(%x: float32[2,4]) -> (%y)", '  %y: float32[2,4] = Softmax(%x) {axis = -1} name "sm"')
    out, stats = run_pass("find_attention", graph(text))
    assert stats.findings == []
