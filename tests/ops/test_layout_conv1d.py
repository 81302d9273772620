"""1-D convolutions (and their pools) on the blocked layout: transform_layout runs an N,C,L conv as
the 2-D ConvNCHWc of N,C,1,L (a 1xK window), with the conversions through free Reshapes; the
native kernels against the NumPy reference of the original NCL graph, on odd lengths, strides,
dilations, asymmetric pads, few-channel stems, depthwise convs, batch > 1 and fused epilogues."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import kiln
from kiln.interpreter import Interpreter
from kiln.passes.layout import transform
from kiln.passes.layout_rules import blockable_channels
from tests.passes.util import graph, prog, random_inputs

F = np.float32


def out_len(length, k, s, pads, d):
    return (length + pads[0] + pads[1] - (k - 1) * d - 1) // s + 1


def conv1d_graph(n, c, length, oc, k, s=1, d=1, pads=(0, 0), dw=False, epilogue=None, bias=True,
                 pool=None, seed=0):
    """x -> Conv1d -> [epilogue] -> [MaxPool1d (k, s, pads)] -> y, as text IR with random weights."""
    rng = np.random.default_rng(seed)
    group = c if dw else 1
    o = out_len(length, k, s, pads, d)
    consts = {"w": rng.standard_normal((oc, c // group, k)).astype(F)}
    ins = "%x, %w"
    if bias:
        consts["b"] = rng.standard_normal(oc).astype(F)
        ins += ", %b"
    shape = f"{n},{oc},{o}"
    body = (f'  %c: float32[{shape}] = Conv({ins}) {{kernel_shape = [{k}], strides = [{s}], '
            f'pads = [{pads[0]}, {pads[1]}], dilations = [{d}], group = {group}}} name "conv"\n')
    last = "c"
    if epilogue == "relu":
        body += f'  %e: float32[{shape}] = Relu(%c) name "relu"\n'
        last = "e"
    elif epilogue == "swish":
        body += f'  %e: float32[{shape}] = Swish(%c) name "swish"\n'
        last = "e"
    elif epilogue == "scale":       # a per-channel constant (1, C, 1), packed for the blocked Mul
        consts["sc"] = rng.standard_normal((1, oc, 1)).astype(F)
        body += f'  %e: float32[{shape}] = Mul(%c, %sc) name "scale"\n'
        last = "e"
    if pool is not None:
        pk, ps, pp = pool
        po = out_len(o, pk, ps, pp, 1)
        body += (f'  %p: float32[{n},{oc},{po}] = MaxPool(%{last}) {{kernel_shape = [{pk}], strides = [{ps}], '
                 f'pads = [{pp[0]}, {pp[1]}]}} name "pool"\n')
        last = "p"
    body = body.rstrip("\n").replace(f"%{last}:", "%y:")
    return graph(prog(f"(%x: float32[{n},{c},{length}]) -> (%y)", body), **consts)


CASES = {
    "stem_1ch_k10_s5": dict(n=1, c=1, length=203, oc=16, k=10, s=5, epilogue="relu"),
    "k8_s4_batch2": dict(n=2, c=16, length=97, oc=16, k=8, s=4, bias=False),
    "k3_dilated4_relu": dict(n=1, c=16, length=61, oc=32, k=3, d=4, pads=(4, 4), epilogue="relu"),
    "k3_asymmetric_pads_swish": dict(n=3, c=8, length=29, oc=24, k=3, pads=(2, 0), epilogue="swish"),
    "k4_s2_odd_scale": dict(n=1, c=32, length=41, oc=16, k=4, s=2, pads=(1, 2), epilogue="scale"),
    "pointwise_prime_length": dict(n=1, c=32, length=13, oc=16, k=1),
    "pointwise_few_outputs": dict(n=2, c=16, length=21, oc=3, k=1, epilogue="relu"),
    "channels_not_multiple": dict(n=2, c=12, length=19, oc=20, k=3, pads=(1, 1)),
    "depthwise_k5_s2": dict(n=2, c=24, length=37, oc=24, k=5, s=2, pads=(2, 1), dw=True),
    "maxpool_after": dict(n=1, c=16, length=50, oc=16, k=3, pads=(1, 1), epilogue="relu",
                          pool=(3, 2, (1, 0))),
}


def _expect_blocked(cfg, block) -> bool:
    c, dw = cfg["c"], cfg.get("dw", False)
    return blockable_channels(c, cfg["oc"], block, (cfg["k"],), dw)


def _check_blocked(g, block, seed=1, pool=False):
    blocked = g.clone()
    # the direct kernel (3-tap convs by Winograd: tests/lower/test_winograd1d.py)
    fired = transform(blocked, block, selective=False, override="direct")
    assert fired.get("Conv") == 1, fired
    if pool:
        assert fired.get("MaxPool") == 1, fired
    ops = {n.qualified_op for n in blocked.nodes}
    assert "Conv" not in ops and "kiln::ConvNCHWc" in ops
    xs = random_inputs(g, seed)
    want = Interpreter(g).run(xs)[0]
    np.testing.assert_allclose(Interpreter(blocked).run(xs)[0], want, rtol=1e-4, atol=1e-4)
    got = kiln.compile(blocked, target="cpu", opt_level=0).run({"x": xs[0]})["y"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("block", [8, 16])
@pytest.mark.parametrize("case", list(CASES))
def test_blocked_conv1d_matches_reference(case, block):
    cfg = CASES[case]
    g = conv1d_graph(**cfg)
    if not _expect_blocked(cfg, block):
        assert not transform(g.clone(), block, selective=False).get("Conv")
        return
    _check_blocked(g, block, pool="pool" in cfg)


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 3), c=st.sampled_from([1, 2, 8, 16, 24]), length=st.integers(5, 90),
       oc=st.sampled_from([8, 16, 24]), k=st.integers(1, 9), s=st.integers(1, 5), d=st.integers(1, 4),
       pads=st.tuples(st.integers(0, 4), st.integers(0, 4)), epilogue=st.sampled_from([None, "relu", "swish"]),
       block=st.sampled_from([8, 16]), seed=st.integers(0, 1000))
def test_random_blocked_conv1d_matches_reference(n, c, length, oc, k, s, d, pads, epilogue, block, seed):
    if out_len(length, k, s, pads, d) < 1:
        return
    cfg = dict(c=c, oc=oc, k=k)
    if not _expect_blocked(cfg, block):
        return
    _check_blocked(conv1d_graph(n, c, length, oc, k, s, d, pads, epilogue=epilogue, seed=seed), block, seed)


def test_conv1d_net_at_O3_with_symbolic_batch():
    """A strided, dilated 1-D conv net with a residual Add and a symbolic batch: compiled at -O3
    (specialised per batch) against the interpreter at batch 1 and 3."""
    rng = np.random.default_rng(5)
    body = ('  %a: float32[N,16,40] = Conv(%x, %w1, %b1) {kernel_shape = [4], strides = [2], pads = [1, 1]} name "c1"\n'
            '  %r: float32[N,16,40] = Relu(%a) name "r1"\n'
            '  %h: float32[N,16,40] = Conv(%r, %w2, %b2) {kernel_shape = [3], pads = [2, 2], dilations = [2]} name "c2"\n'
            '  %q: float32[N,16,40] = Relu(%h) name "r2"\n'
            '  %p: float32[N,16,40] = Conv(%q, %w3, %b3) {kernel_shape = [1]} name "c3"\n'
            '  %s: float32[N,16,40] = Add(%r, %p) name "res"\n'
            '  %y: float32[N,16,40] = Relu(%s) name "r3"')
    g = graph(prog("(%x: float32[N,1,80]) -> (%y)", body),
              w1=rng.standard_normal((16, 1, 4)).astype(F), b1=rng.standard_normal(16).astype(F),
              w2=rng.standard_normal((16, 16, 3)).astype(F) / 4, b2=rng.standard_normal(16).astype(F),
              w3=rng.standard_normal((16, 16, 1)).astype(F) / 4, b3=rng.standard_normal(16).astype(F))
    m = kiln.compile(g, target="cpu", opt_level=3)
    for batch in (1, 3):
        x = rng.standard_normal((batch, 1, 80)).astype(F)
        want = Interpreter(g).run([x])[0]
        np.testing.assert_allclose(m.run({"x": x})["y"], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("block", [8, 16])
def test_long_rows_of_many_channels_run_in_column_chunks(block):
    """A conv reading 16+ input rows per output row whose row input exceeds a quarter of L2
    (here a target with a 64 KiB L2, not the host's) runs its row's register tiles in chunks, every channel
    block over a chunk; odd lengths leave thrown-away tiles in the last chunk."""
    import dataclasses

    from kiln.lower.nchwc import column_chunk
    from kiln.ops.layout import BlockedGeom
    from kiln.targets.target import Target
    small = dataclasses.replace(Target.host(), l2_bytes=64 * 1024)
    c = 16 * block
    g = conv1d_graph(1, c, 301, 16, 3, s=2, pads=(1, 0), epilogue="relu", seed=4)
    geom = BlockedGeom(1, c // block, 1, 301, block, 16 // block, c // block, [1, 3], block, [1, 2], [1, 1],
                       [0, 1], [1, 150], False)
    assert column_chunk(geom, 7, 4, small) is not None
    blocked = g.clone()
    assert transform(blocked, block, selective=False).get("Conv") == 1
    xs = random_inputs(g, 2)
    want = Interpreter(g).run(xs)[0]
    got = kiln.compile(blocked, target="cpu", cpu=small, opt_level=0).run({"x": xs[0]})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("length, k, s", [(1203, 3, 1), (2411, 8, 4)])
def test_one_row_cut_into_parallel_parts(length, k, s):
    """A 1-D conv at batch 1 is one output row with few channel blocks: its row's register tiles
    run as several parallel tasks (row_parts), equal parts whose last extra tiles are computed
    and thrown away; the result still matches the reference."""
    from kiln.lower.nchwc import ROW_PART_MIN_TILES, row_parts
    from kiln.ops.layout import BlockedGeom
    from kiln.targets.target import Target
    import dataclasses
    block = Target.host().vector_lanes(4)
    two = dataclasses.replace(Target.host(), cores=2)
    out = out_len(length, k, s, (1, 1), 1)
    geom = BlockedGeom(1, 2, 1, length, block, 2, 2, [1, k], block, [1, s], [1, 1], [0, 1], [1, out], False)
    parts = row_parts(geom, 7, 2, two)
    tiles = -(-out // 7)
    assert parts is not None and 2 <= parts and -(-tiles // parts) >= ROW_PART_MIN_TILES
    g = conv1d_graph(1, 2 * block, length, 2 * block, k, s=s, pads=(1, 1), epilogue="relu", seed=k)
    blocked = g.clone()
    assert transform(blocked, block, selective=False, override="direct").get("Conv") == 1
    xs = random_inputs(g, 3)
    want = Interpreter(g).run(xs)[0]
    got = kiln.compile(blocked, target="cpu", cpu=two, opt_level=0).run({"x": xs[0]})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
