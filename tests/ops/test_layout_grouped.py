"""Grouped convolutions on the blocked layout (kiln.ops.layout.block_groups): channels per group
that are whole blocks, or divisors of a block (block-diagonal weights), through transform_layout
and the native ConvNCHWc kernel, against the NumPy reference of the original NCHW graph: odd
planes, strides, dilations, asymmetric pads, batch > 1, padded last blocks, a symbolic batch,
and the chooser's reason for every conv."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

import kiln
from kiln.interpreter import Interpreter
from kiln.ops.layout import (block_groups, pack_grouped_weight, pack_rotated_weight, rotated_from, rotated_lane,
                              unpack_rotated_weight)
from kiln.passes.layout import transform, worth_blocking
from tests.passes.util import graph, prog, random_inputs
from tests.helpers import examples

F = np.float32


def out_size(h, k, s, p0, p1, d):
    return (h + p0 + p1 - (k - 1) * d - 1) // s + 1


def grouped_graph(n, c, h, w, oc, group, k, s=1, d=1, pads=(0, 0, 0, 0), relu=False, bias=True, seed=0):
    """x -> Conv(group) -> [Relu] -> y as text IR with random weights (`n` may be a symbol)."""
    rng = np.random.default_rng(seed)
    oh, ow = out_size(h, k, s, pads[0], pads[2], d), out_size(w, k, s, pads[1], pads[3], d)
    consts = {"w": rng.standard_normal((oc, c // group, k, k)).astype(F)}
    ins = "%x, %w"
    if bias:
        consts["b"] = rng.standard_normal(oc).astype(F)
        ins += ", %b"
    shape = f"{n},{oc},{oh},{ow}"
    body = (f'  %c: float32[{shape}] = Conv({ins}) {{kernel_shape = [{k}, {k}], strides = [{s}, {s}], '
            f'pads = [{", ".join(map(str, pads))}], dilations = [{d}, {d}], group = {group}}} name "conv"\n')
    if relu:
        body += f'  %y: float32[{shape}] = Relu(%c) name "relu"'
    else:
        body = body.rstrip("\n").replace("%c:", "%y:")
    return graph(prog(f"(%x: float32[{n},{c},{h},{w}]) -> (%y)", body), **consts)


@pytest.mark.parametrize("c, oc, group, block, want", [
    (128, 128, 32, 16, 8),      # ResNeXt stage 1: 4 per group, 4 groups per block of 16
    (256, 256, 32, 16, 16),     # 8 per group
    (512, 512, 32, 16, 32),     # whole blocks
    (1024, 1024, 32, 16, 32),   # two blocks per group
    (24, 24, 6, 16, 2),         # 4 per group, the last block half full
    (32, 64, 2, 16, 2),         # 16 -> 32 per group
    (16, 32, 4, 16, None),      # 4 -> 8: a block's groups would differ in and out
    (12, 12, 4, 8, None),       # 3 per group: no divisor of 8
    (8, 8, 1, 8, None),         # not grouped
])
def test_block_groups(c, oc, group, block, want):
    assert block_groups(c, oc, group, block) == want


def test_packed_grouped_weights_are_the_block_diagonal_dense_ones():
    """Unpacked over the block groups, the weights are the grouped conv's dense form."""
    rng = np.random.default_rng(1)
    for c, group, block in [(32, 8, 8), (48, 3, 8), (24, 6, 16)]:
        w = rng.standard_normal((c, c // group, 3, 3)).astype(F)
        dense = np.zeros((c, c, 3, 3), F)
        cin = c // group
        for g in range(group):
            dense[g * cin:(g + 1) * cin, g * cin:(g + 1) * cin] = w[g * cin:(g + 1) * cin]
        wp = pack_grouped_weight(w, group, block)
        big = block_groups(c, c, group, block)
        ocb, icbg = wp.shape[:2]
        per = ocb // big
        full = np.zeros((ocb * block, icbg * big * block, 3, 3), F)
        for k in range(ocb):
            q = k // per
            blk = wp[k].transpose(4, 0, 3, 1, 2).reshape(block, icbg * block, 3, 3)
            full[k * block:(k + 1) * block, q * icbg * block:(q + 1) * icbg * block] = blk
        np.testing.assert_array_equal(full[:c, :c], dense)
        assert not full[c:].any() and not full[:, c:].any()


BLOCKS = [8, 16]
# (channels per group, groups): whole blocks of 8 or 16, divisors of them, a half-full last block
GROUPINGS = st.sampled_from([(4, 2), (4, 4), (4, 6), (2, 8), (8, 2), (8, 3), (16, 2), (32, 2), (16, 4)])


@examples(20, fast=5)
def test_grouped_blocked_conv_matches_reference(examples):
    settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])(
        given(n=st.integers(1, 2), grouping=GROUPINGS, mult=st.sampled_from([1, 2]), h=st.integers(1, 12),
              w=st.integers(1, 12), k=st.sampled_from([1, 3, 5]), s=st.integers(1, 2), d=st.integers(1, 2),
              pads=st.lists(st.integers(0, 2), min_size=4, max_size=4), relu=st.booleans(), bias=st.booleans(),
              block=st.sampled_from(BLOCKS), tile_pad=st.sampled_from([None, 0]),
              reg_w=st.sampled_from([None, 1, 2, 3]))(_grouped_matches_reference))()


def _grouped_matches_reference(n, grouping, mult, h, w, k, s, d, pads, relu, bias, block, tile_pad, reg_w):
    cpg, group = grouping
    c, oc = cpg * group, cpg * group * mult
    assume(h + pads[0] + pads[2] >= (k - 1) * d + 1 and w + pads[1] + pads[3] >= (k - 1) * d + 1)
    big = block_groups(c, oc, group, block)
    assume(big is not None and worth_blocking(c, block) and worth_blocking(oc, block))
    g = grouped_graph(n, c, h, w, oc, group, k, s, d, pads, relu, bias)
    blocked = g.clone()
    fired = transform(blocked, block, selective=False, override="direct")
    assert fired.get("Conv") == 1, fired
    conv = next(x for x in blocked.nodes if x.op == "ConvNCHWc")
    if mult == 1 and cpg < block:       # a depthwise conv over cpg lane rotations
        assert conv.attrs["rotate"] == cpg and conv.attrs["depthwise"] == 1 and "groups" not in conv.attrs
    else:
        assert conv.attrs["groups"] == big
    xs = random_inputs(g, n)
    want = Interpreter(g).run(xs)[0]
    np.testing.assert_allclose(Interpreter(blocked).run(xs)[0], want, rtol=1e-4, atol=1e-4)
    # (the tile's columns and the padded copy: the whole input's, or each tile's window)
    dec = {k_: v for k_, v in (("nchwc.tile_pad", tile_pad), ("nchwc.reg_w", reg_w)) if v is not None}
    got = kiln.compile(blocked, target="cpu", opt_level=0, decisions=dec).run({"x": xs[0]})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("pads, reg_w", [((1, 1, 1, 1), None), ((1, 1, 1, 1), 2), ((0, 2, 1, 0), 3), ((2, 0, 0, 1), 1)])
def test_a_grouped_conv_copies_each_tiles_window(pads, reg_w):
    """A grouped conv with padding copies the padded window each register tile reads (a few KB on
    the stack, beside its accumulators) where it copied the whole padded input first (ResNeXt-50's
    512-channel 28x28 stride-2 conv: 6.9 MB at batch 4, to memory and back): tiles that split a row
    (their windows overlap), asymmetric pads and stride 2, against the reference, and the whole
    copy where nchwc.tile_pad=0 asks for it."""
    from kiln.export import c_source_of
    g = grouped_graph(2, 64, 9, 11, 64, 4, 3, s=2, pads=pads, relu=True)     # 16 channels a group
    blocked = g.clone()
    transform(blocked, 16, selective=False, override="direct")
    conv = next(x for x in blocked.nodes if x.op == "ConvNCHWc")
    assert conv.attrs["groups"] == 4 and not conv.attrs.get("depthwise")
    xs = random_inputs(g, 2)
    want = Interpreter(g).run(xs)[0]
    for tile_pad in (None, 0):
        dec = {k_: v for k_, v in (("nchwc.tile_pad", tile_pad), ("nchwc.reg_w", reg_w)) if v is not None}
        m = kiln.compile(blocked, target="cpu", opt_level=0, decisions=dec)
        np.testing.assert_allclose(m.run({"x": xs[0]})["y"], want, rtol=1e-4, atol=1e-4)
        (chosen,) = [d for d in m.build_info()["decisions"].values() if "nchwc.tile_pad" in d]
        assert chosen["nchwc.tile_pad"] == (1 if tile_pad is None else 0)
        src = c_source_of(m.program.runner_for([xs[0]]))
        per_tile = re.search(r"float b\d+_xpad\[\d+\]", src) is not None     # a local array in the tile's loop
        whole = re.search(r"b\d+_xpad = \(float\*\)kiln_alloc", src) is not None
        assert (per_tile, whole) == ((True, False) if tile_pad is None else (False, True))


def test_only_grouped_convs_copy_per_tile():
    """A dense conv (every tile reads every input block: a per-tile copy would repeat once per
    output channel group) and an unpadded grouped conv (read in place) ask nothing."""
    for group, pads in ((1, (1, 1, 1, 1)), (4, (0, 0, 0, 0))):
        g = grouped_graph(1, 64, 9, 9, 64, group, 3, pads=pads)
        blocked = g.clone()
        transform(blocked, 16, selective=False, override="direct")
        m = kiln.compile(blocked, target="cpu", opt_level=0)
        m.run({"x": random_inputs(g, 1)[0]})
        assert not [d for d in m.build_info()["decisions"].values() if "nchwc.tile_pad" in d]


@pytest.mark.parametrize("cpg", [4, 16])
def test_grouped_chain_stays_blocked_with_a_symbolic_batch(cpg, monkeypatch):
    """ResNeXt's body (1x1 -> grouped 3x3 -> 1x1, residual Add) by the default, selective rule:
    every conv blocked, the only conversions at the ends; one compiled model at batch 1 and 3."""
    monkeypatch.setenv("KILN_NCHWC", "16")
    group, c = 4, 4 * cpg
    rng = np.random.default_rng(3)
    consts = {"w1": rng.standard_normal((c, 32, 1, 1)).astype(F),
              "wg": rng.standard_normal((c, cpg, 3, 3)).astype(F),
              "w2": rng.standard_normal((32, c, 1, 1)).astype(F)}
    body = (f'  %a: float32[N,{c},9,9] = Conv(%x, %w1) {{kernel_shape = [1, 1]}} name "reduce"\n'
            f'  %ar: float32[N,{c},9,9] = Relu(%a) name "relu1"\n'
            f'  %g: float32[N,{c},9,9] = Conv(%ar, %wg) {{kernel_shape = [3, 3], pads = [1, 1, 1, 1], '
            f'group = {group}}} name "grouped"\n'
            f'  %gr: float32[N,{c},9,9] = Relu(%g) name "relu2"\n'
            f'  %e: float32[N,32,9,9] = Conv(%gr, %w2) {{kernel_shape = [1, 1]}} name "expand"\n'
            f'  %s: float32[N,32,9,9] = Add(%e, %x) name "residual"\n'
            f'  %y: float32[N,32,9,9] = Relu(%s) name "relu3"')
    g = graph(prog("(%x: float32[N,32,9,9]) -> (%y)", body), **consts)
    m = kiln.compile(g, target="cpu", report=True)
    ref = Interpreter(g)
    for n in (1, 3):
        x = rng.standard_normal((n, 32, 9, 9)).astype(F)
        np.testing.assert_allclose(m.run({"x": x})["y"], ref.run([x])[0], rtol=1e-4, atol=1e-4)
    blocked = graph(prog("(%x: float32[2,32,9,9]) -> (%y)", body.replace("N,", "2,")), **consts)
    findings = []
    fired = transform(blocked, 16, findings=findings)
    assert fired["Conv"] == 3 and fired["ToNCHWc"] == 1 and fired["FromNCHWc"] == 1, fired
    why = {f.node: f.choice for f in findings}
    assert why["grouped"].algorithm == "direct-nchwc" and "grouped (4 groups of" in why["grouped"].reason
    assert why["reduce"].algorithm == "direct-nchwc" and why["reduce"].reason.startswith("pointwise")


def test_rotations_are_vector_shuffles():
    """The rotated lanes are one vector load and a shuffle each (kiln.codegen.c's permuted loads),
    not a per-lane gather: groups of 4 at a block of 16 take 3 shuffles per output vector (of its
    rotations' accumulators, kiln.lower.nchwc)."""
    from kiln.compiler import run_stages
    g = grouped_graph(1, 64, 9, 9, 64, 16, 3, 1, 1, (1, 1, 1, 1), True, True)
    blocked = g.clone()
    transform(blocked, 16, selective=False, override="direct")
    text = run_stages(blocked, "c", opt_level=0).source.text
    assert "KILN_PERMUTE(" in text and "{1, 2, 3, 0, 5, 6, 7, 4, 9, 10, 11, 8, 13, 14, 15, 12}" not in text
    assert "1, 2, 3, 0, 5, 6, 7, 4, 9, 10, 11, 8, 13, 14, 15, 12" in text


def test_rotated_weights_are_packed_by_input_lane():
    """pack_rotated_weight's [k, j, ..., i] is the weight input lane i of block k carries at
    rotation j to output lane rotated_from(i, j, r), whose lane read at j is i; unpacking
    inverts it (the padding channels zero)."""
    rng = np.random.default_rng(5)
    for c, r, block in [(32, 4, 16), (24, 4, 16), (16, 8, 8), (12, 2, 8)]:
        w = rng.standard_normal((c, r, 3, 3)).astype(F)
        wp = pack_rotated_weight(w, block)
        assert wp.shape == (-(-c // block), r, 3, 3, 1, block)
        for k, j, i in [(0, 0, 0), (0, r - 1, 1), (wp.shape[0] - 1, 1, block - 1)]:
            o = rotated_from(i, j, r)
            assert rotated_lane(o, j, r) == i and o // r == i // r
            ch = k * block + o
            want = w[ch, i % r] if ch < c else np.zeros((3, 3), F)
            np.testing.assert_array_equal(wp[k, j, :, :, 0, i], want)
        back = unpack_rotated_weight(wp)
        np.testing.assert_array_equal(back[:c], w)
        assert not back[c:].any()


def rotated_graph(n, c, h, w, r, k, s, d, pads, scale: bool, block: int, seed: int = 0):
    """A blocked rotated ConvNCHWc (`r` channels per group) + Relu, optionally with a per-image,
    per-channel `scale` input (a squeeze-excite gate folded into the conv), and its weights."""
    rng = np.random.default_rng(seed)
    cb = -(-c // block)
    oh, ow = out_size(h, k, s, pads[0], pads[2], d), out_size(w, k, s, pads[1], pads[3], d)
    consts = {"w": pack_rotated_weight(rng.standard_normal((c, r, k, k)).astype(F), block),
              "b": rng.standard_normal((cb, block)).astype(F)}
    ins = "%x, %w, %b" + (", %s" if scale else "")
    head = f"(%x: float32[{n},{cb},{h},{w},{block}]" + (f", %s: float32[{n},{cb},1,1,{block}]" if scale else "")
    body = (f'  %c: float32[{n},{cb},{oh},{ow},{block}] = "kiln"::ConvNCHWc({ins}) {{kernel_shape = [{k}, {k}], '
            f'strides = [{s}, {s}], pads = [{", ".join(map(str, pads))}], dilations = [{d}, {d}], depthwise = 1, '
            f'rotate = {r}}} name "conv"\n'
            f'  %y: float32[{n},{cb},{oh},{ow},{block}] = Relu(%c) name "relu"')
    text = prog(head + ") -> (%y)", body).replace('opsets {"": 17}', 'opsets {"": 17, "kiln": 1}')
    return graph(text, **consts)


@examples(24, fast=6)
def test_rotated_conv_tiles_match_reference(examples):
    """The rotated kernel (an accumulator per rotation, their shuffled sum) against the NumPy
    reference at any register tile (columns, taps unrolled), stride, dilation, padding, batch,
    a half-full last block, and with a squeeze-excite scale (scaled weights or input)."""
    settings(max_examples=examples, deadline=None)(
        given(n=st.integers(1, 2), r=st.sampled_from([2, 4, 8]), blocks=st.integers(1, 2), half=st.booleans(),
              h=st.integers(1, 9), w=st.integers(1, 11), k=st.sampled_from([1, 3]), s=st.integers(1, 2),
              d=st.integers(1, 2), pads=st.lists(st.integers(0, 1), min_size=4, max_size=4),
              scale=st.booleans(), reg_w=st.sampled_from([None, 1, 2, 3, 5]),
              unroll=st.sampled_from([None, 0, 1, 2]))(_rotated_matches_reference))()


def _rotated_matches_reference(n, r, blocks, half, h, w, k, s, d, pads, scale, reg_w, unroll):
    block = 16
    c = blocks * block - (block // 2 if half and blocks > 1 else 0)
    assume(h + pads[0] + pads[2] >= (k - 1) * d + 1 and w + pads[1] + pads[3] >= (k - 1) * d + 1)
    g = rotated_graph(n, c, h, w, r, k, s, d, pads, scale, block)
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal(tuple(v.type.shape)).astype(F) for v in g.inputs]
    xs[0][:, -1, ..., c % block or block:] = 0      # the padding channels are zero
    want = Interpreter(g).run(xs)[0]
    dec = {k_: v for k_, v in (("nchwc.reg_w", reg_w), ("nchwc.unroll_taps", unroll)) if v is not None}
    m = kiln.compile(g, target="cpu", opt_level=0, decisions=dec)
    got = m.run(dict(zip(("x", "s"), xs)))["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cpg, hw", [(4, 3), (8, 9)])
def test_gated_rotated_conv_matches_reference(cpg, hw, monkeypatch):
    """A squeeze-excite gate in front of a rotated grouped conv (SE-ResNeXt's order) folds into
    the conv as its scale (on a large plane into the weights, on a small one into what it reads), with a
    symbolic batch: against the reference at batch 1 and 2."""
    monkeypatch.setenv("KILN_NCHWC", "16")
    c = 16 * cpg // 2
    rng = np.random.default_rng(11)
    consts = {"w1": rng.standard_normal((c, 16, 1, 1)).astype(F), "wq": rng.standard_normal((8, c, 1, 1)).astype(F),
              "wt": rng.standard_normal((c, 8, 1, 1)).astype(F), "wg": rng.standard_normal((c, cpg, 3, 3)).astype(F),
              "w2": rng.standard_normal((16, c, 1, 1)).astype(F)}
    t = f"float32[N,{c},{hw},{hw}]"
    body = (f'  %a: {t} = Conv(%x, %w1) {{kernel_shape = [1, 1]}} name "reduce"\n'
            f'  %ar: {t} = Relu(%a) name "relu1"\n'
            f'  %p: float32[N,{c},1,1] = GlobalAveragePool(%ar) name "pool"\n'
            f'  %q: float32[N,8,1,1] = Conv(%p, %wq) {{kernel_shape = [1, 1]}} name "fc1"\n'
            f'  %qr: float32[N,8,1,1] = Relu(%q) name "fc1_relu"\n'
            f'  %e: float32[N,{c},1,1] = Conv(%qr, %wt) {{kernel_shape = [1, 1]}} name "fc2"\n'
            f'  %gate: float32[N,{c},1,1] = Sigmoid(%e) name "gate"\n'
            f'  %sc: {t} = Mul(%ar, %gate) name "scale"\n'
            f'  %g: {t} = Conv(%sc, %wg) {{kernel_shape = [3, 3], pads = [1, 1, 1, 1], group = {c // cpg}}} '
            f'name "grouped"\n'
            f'  %gr: {t} = Relu(%g) name "relu2"\n'
            f'  %y: float32[N,16,{hw},{hw}] = Conv(%gr, %w2) {{kernel_shape = [1, 1]}} name "expand"')
    g = graph(prog(f"(%x: float32[N,16,{hw},{hw}]) -> (%y)", body), **consts)
    m = kiln.compile(g, target="cpu")
    ref = Interpreter(g)
    for n in (1, 2):
        x = rng.standard_normal((n, 16, hw, hw)).astype(F)
        np.testing.assert_allclose(m.run({"x": x})["y"], ref.run([x])[0], rtol=1e-4, atol=1e-3)
    blocked = graph(prog(f"(%x: float32[2,16,{hw},{hw}]) -> (%y)", body.replace("N,", "2,")), **consts)
    fired = transform(blocked, 16)
    conv = next(x for x in blocked.nodes if x.op == "ConvNCHWc" and x.attrs.get("rotate"))
    assert fired["scale"] == 1 and len(conv.inputs) == 4 and conv.inputs[3] is not None
