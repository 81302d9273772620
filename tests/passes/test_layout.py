"""Layout transformation (transform_layout): Convs with constant weights run blocked (NCHW[c]c),
elementwise ops between them follow, conversions only where NCHW is needed."""

import numpy as np
import pytest

from kiln.graph import print_graph
from kiln.interpreter import Interpreter
from kiln.ops.layout import from_blocked, pack_bias, pack_conv_weight, to_blocked, unpack_conv_weight
from kiln.passes import passes_for
from kiln.passes import layout
from kiln.passes.layout import transform, worth_blocking
from kiln.passes.layout_rules import narrow_output
from tests.passes.util import assert_equivalent, check, graph, prog, random_inputs, run_pass

F = np.float32
rng = np.random.default_rng(0)


def R(*shape):
    x = rng.standard_normal(shape).astype(F)
    x[x == 0] = 0.5
    return x


@pytest.fixture(autouse=True)
def block8(monkeypatch):
    """Block 8, every blockable conv (the selective default is tested on its own)."""
    monkeypatch.setenv("KILN_NCHWC", "8")
    monkeypatch.setattr(layout, "SELECTIVE", False)


def _ops(g):
    return [n.qualified_op for n in g.nodes]


def test_chain_before_after():
    """Conv -> Relu -> Conv -> Add(residual): one conversion in, one out per NCHW reader."""
    sig = "(%x: float32[1,8,6,6]) -> (%y, %p)"
    before = ('  %a: float32[1,8,6,6] = Conv(%x, %w1, %b1) {kernel_shape = [3, 3], pads = [1, 1, 1, 1]} name "c1"\n'
              '  %r: float32[1,8,6,6] = Relu(%a) name "relu"\n'
              '  %c: float32[1,8,6,6] = Conv(%r, %w2) {kernel_shape = [1, 1]} name "c2"\n'
              '  %y: float32[1,8,6,6] = Add(%c, %x) name "add"\n'
              '  %p: float32[1,8,3,3] = AveragePool(%r) {kernel_shape = [2, 2], strides = [2, 2]} name "pool"')
    after = (
        '  %x.nchwc: float32[1,1,6,6,8] = "kiln"::ToNCHWc(%x) {block = 8} name "x.to_nchwc"\n'
        '  %a.nchwc: float32[1,1,6,6,8] = "kiln"::ConvNCHWc(%x.nchwc, %w1.nchwc8, %c1.bias.nchwc8) '
        '{kernel_shape = [3, 3], strides = [1, 1], pads = [1, 1, 1, 1], dilations = [1, 1], depthwise = 0} name "c1"\n'
        '  %r.nchwc: float32[1,1,6,6,8] = Relu(%a.nchwc) name "relu"\n'
        '  %c.nchwc: float32[1,1,6,6,8] = "kiln"::ConvNCHWc(%r.nchwc, %w2.nchwc8) '
        '{kernel_shape = [1, 1], strides = [1, 1], pads = [0, 0, 0, 0], dilations = [1, 1], depthwise = 0} name "c2"\n'
        '  %y.nchwc: float32[1,1,6,6,8] = Add(%c.nchwc, %x.nchwc) name "add"\n'
        '  %r: float32[1,8,6,6] = "kiln"::FromNCHWc(%r.nchwc) {channels = 8} name "r.from_nchwc"\n'
        '  %p: float32[1,8,3,3] = AveragePool(%r) {kernel_shape = [2, 2], strides = [2, 2]} name "pool"\n'
        '  %y: float32[1,8,6,6] = "kiln"::FromNCHWc(%y.nchwc) {channels = 8} name "y.from_nchwc"')
    w1, b1, w2 = R(8, 8, 3, 3), R(8), R(8, 8, 1, 1)
    packed = {"w1.nchwc8": pack_conv_weight(w1, 8, False), "c1.bias.nchwc8": pack_bias(b1, 8, 8, F),
              "w2.nchwc8": pack_conv_weight(w2, 8, False)}
    before_g = graph(prog(sig, before), w1=w1, b1=b1, w2=w2)
    out, stats = run_pass("transform_layout", before_g)
    want = graph(prog(sig, after).replace('opsets {"": 17}', 'opsets {"": 17, "kiln": 1}'), **packed)
    assert print_graph(out) == print_graph(want)
    assert_equivalent(before_g, out, rtol=1e-4, atol=1e-5)
    assert stats.fired == {"Conv": 2, "elementwise": 2, "ToNCHWc": 1, "FromNCHWc": 2}


def test_odd_grouped_conv_and_graph_input_weights_stay_nchw():
    """Groups of 3 channels neither fill nor divide a block of 8; weights that are a graph input
    cannot be packed. The chooser says so for each."""
    sig = "(%x: float32[1,12,8,8], %wi: float32[12,12,1,1]) -> (%y, %z)"
    body = ('  %b: float32[1,12,8,8] = Conv(%x, %wg) {kernel_shape = [1, 1], group = 4} name "grouped"\n'
            '  %y: float32[1,12,8,8] = Relu(%b) name "relu"\n'
            '  %z: float32[1,12,8,8] = Conv(%x, %wi) {kernel_shape = [1, 1]} name "input_weights"')
    check("transform_layout", prog(sig, body), None, wg=R(12, 3, 1, 1))
    findings = []
    transform(graph(prog(sig, body), wg=R(12, 3, 1, 1)), 8, findings=findings)
    reasons = {c.node: c.choice for c in findings}
    assert reasons["grouped"].algorithm == "direct-nchw" and "4 groups of 3 -> 3" in reasons["grouped"].reason
    assert "computed weights" in reasons["input_weights"].reason


def test_stem_conv_reads_its_few_channels_channels_last():
    """3 input channels would pad a block of 8 by more than a third: the stem conv reads its
    input as one block of 3 (N,1,H,W,3) instead, with weights packed (OCB, 1, KH, KW, 3, 8),
    and writes the usual blocks of 8. The conversion makes the conv's zero padding too (its
    `pads`; the conv's are then zero), as the conv is the input's only reader."""
    sig = "(%x: float32[1,3,8,8]) -> (%y)"
    body = ('  %a: float32[1,8,4,4] = Conv(%x, %w, %b) {kernel_shape = [3, 3], strides = [2, 2], pads = [1, 2, 1, 0]} name "stem"\n'
            '  %y: float32[1,8,4,4] = Relu(%a) name "relu"')
    after = ('  %x.nchw3c: float32[1,1,10,10,3] = "kiln"::ToNCHWc(%x) {block = 3, pads = [1, 2, 1, 0]} name "x.to_nchw3c"\n'
             '  %a.nchwc: float32[1,1,4,4,8] = "kiln"::ConvNCHWc(%x.nchw3c, %w.nchwc8, %stem.bias.nchwc8) '
             '{kernel_shape = [3, 3], strides = [2, 2], pads = [0, 0, 0, 0], dilations = [1, 1], depthwise = 0} name "stem"\n'
             '  %y.nchwc: float32[1,1,4,4,8] = Relu(%a.nchwc) name "relu"\n'
             '  %y: float32[1,8,4,4] = "kiln"::FromNCHWc(%y.nchwc) {channels = 8} name "y.from_nchwc"')
    w, b = R(8, 3, 3, 3), R(8)
    packed = pack_conv_weight(w, 8, False, 3)
    assert packed.shape == (1, 1, 3, 3, 3, 8)
    np.testing.assert_array_equal(unpack_conv_weight(packed, False), w)
    before_g = graph(prog(sig, body), w=w, b=b)
    out, stats = run_pass("transform_layout", before_g)
    want = graph(prog(sig, after).replace('opsets {"": 17}', 'opsets {"": 17, "kiln": 1}'),
                 **{"w.nchwc8": packed, "stem.bias.nchwc8": pack_bias(b, 8, 8, F)})
    assert print_graph(out) == print_graph(want)
    assert_equivalent(before_g, out, rtol=1e-4, atol=1e-5)
    assert stats.fired == {"Conv": 1, "elementwise": 1, "ToNCHWc": 1, "FromNCHWc": 1}


def test_depthwise_and_padded_channels():
    """MobileNet's block with 12 channels (padded to 16) and a depthwise conv; ReLU6 as Clip."""
    sig = "(%x: float32[1,12,9,9]) -> (%y)"
    body = ('  %e: float32[1,12,9,9] = Conv(%x, %we, %be) {kernel_shape = [1, 1]} name "expand"\n'
            '  %c: float32[1,12,9,9] = Clip(%e, %lo, %hi) name "relu6"\n'
            '  %d: float32[1,12,5,5] = Conv(%c, %wd) {kernel_shape = [3, 3], strides = [2, 2], '
            'pads = [1, 1, 1, 1], group = 12} name "dw"\n'
            '  %y: float32[1,12,5,5] = Add(%d, %s) name "shift"')
    g = graph(prog(sig, body), we=R(12, 12, 1, 1), be=R(12), lo=np.array(0, F), hi=np.array(6, F),
              wd=R(12, 1, 3, 3), s=R(1, 12, 1, 1))
    out, stats = run_pass("transform_layout", g)
    assert _ops(out) == ["kiln::ToNCHWc", "kiln::ConvNCHWc", "Clip", "kiln::ConvNCHWc", "Add", "kiln::FromNCHWc"]
    dw = out.nodes[3]
    assert dw.attrs["depthwise"] == 1 and dw.inputs[1].const.shape == (2, 1, 3, 3, 1, 8)
    assert out.nodes[4].inputs[1].const.shape == (1, 2, 1, 1, 8)     # per-channel constant packed
    assert out.nodes[2].inputs[1].const.shape == ()                  # scalar kept
    assert_equivalent(g, out, rtol=1e-4, atol=1e-5)


def test_conversions_cancel_and_outputs_stay_nchw():
    """A value converted once is reused: a chain of blocked ops reading one graph input
    converts it once; a blocked value read twice in NCHW is converted back once."""
    sig = "(%x: float32[1,8,5,5]) -> (%y, %m)"
    body = ('  %a: float32[1,8,5,5] = Conv(%x, %w) {kernel_shape = [1, 1]} name "c1"\n'
            '  %b: float32[1,8,5,5] = Conv(%x, %w) {kernel_shape = [1, 1]} name "c2"\n'
            '  %s: float32[1,8,5,5] = Add(%a, %b) name "add"\n'
            '  %y: float32[1,8,5,5] = Relu(%s) name "relu"\n'
            '  %m: float32[1,8,1,1] = GlobalAveragePool(%s) name "gap"')
    g = graph(prog(sig, body), w=R(8, 8, 1, 1))
    out, stats = run_pass("transform_layout", g)
    assert _ops(out).count("kiln::ToNCHWc") == 1 and _ops(out).count("kiln::FromNCHWc") == 2
    assert [v.type.shape for v in out.outputs] == [(1, 8, 5, 5), (1, 8, 1, 1)]
    assert [v.name for v in out.outputs] == ["y", "m"]
    assert_equivalent(g, out, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("axes,blocked", [("[2, 3]", True), ("[-1, -2]", True), ("[1, 2]", False)])
def test_head_mean_without_keepdims(axes, blocked):
    """A classifier head's x.mean((2, 3)) (keepdims 0, N,C out) pools the blocked twin and
    converts only the pooled N,C,1,1 back; a mean over other axes reads the NCHW value."""
    sig = "(%x: float32[2,8,5,4]) -> (%y)"
    out_ty = "float32[2,8]" if blocked else "float32[2,4]"
    body = ('  %a: float32[2,8,5,4] = Conv(%x, %w) {kernel_shape = [1, 1]} name "c"\n'
            '  %r: float32[2,8,5,4] = Relu(%a) name "relu"\n'
            f'  %y: {out_ty} = ReduceMean(%r) {{axes = {axes}, keepdims = 0}} name "mean"')
    g = graph(prog(sig, body), w=R(8, 8, 1, 1))
    out, stats = run_pass("transform_layout", g)
    if blocked:
        assert _ops(out) == ["kiln::ToNCHWc", "kiln::ConvNCHWc", "Relu", "kiln::GlobalAveragePoolNCHWc",
                             "kiln::FromNCHWc", "Reshape"]
        assert out.nodes[4].outputs[0].type.shape == (2, 8, 1, 1)
        assert stats.fired["GlobalAveragePool"] == 1
    else:
        assert "kiln::GlobalAveragePoolNCHWc" not in _ops(out) and _ops(out)[-1] == "ReduceMean"
    assert out.outputs[0].type.shape == g.outputs[0].type.shape
    assert_equivalent(g, out, rtol=1e-4, atol=1e-5)


def test_block_16_and_a_symbolic_batch_blocked(monkeypatch):
    """A symbolic batch stays a symbol through the rewrite (the layout is per image): the conv
    on N images is blocked like the one on 1 (a shape-generic module runs it)."""
    monkeypatch.setenv("KILN_NCHWC", "16")
    sig = "(%x: float32[1,16,4,4], %z: float32[N,16,4,4]) -> (%y, %u)"
    body = ('  %y: float32[1,16,4,4] = Conv(%x, %w) {kernel_shape = [1, 1]} name "c"\n'
            '  %u: float32[N,16,4,4] = Conv(%z, %w) {kernel_shape = [1, 1]} name "dyn"')
    g = graph(prog(sig, body), w=R(16, 16, 1, 1))
    out, _ = run_pass("transform_layout", g)
    assert _ops(out).count("kiln::ConvNCHWc") == 2 and "Conv" not in _ops(out)
    shapes = {n.name: n.outputs[0].type.shape for n in out.nodes if n.op == "ConvNCHWc"}
    assert shapes == {"c": (1, 1, 4, 4, 16), "dyn": ("N", 1, 4, 4, 16)}
    assert_equivalent(g, out, rtol=1e-4, atol=1e-5)


def test_off_switch(monkeypatch):
    monkeypatch.setenv("KILN_NCHWC", "0")
    sig = "(%x: float32[1,8,4,4]) -> (%y)"
    check("transform_layout", prog(sig, '  %y: float32[1,8,4,4] = Conv(%x, %w) {kernel_shape = [1, 1]} name "c"'),
          None, w=R(8, 8, 1, 1))


def test_in_level3_after_batchnorm_folding():
    names = passes_for(3)
    assert names.index("fold_batchnorm") < names.index("transform_layout") < len(names) - 2
    assert "transform_layout" not in passes_for(2)


def test_worth_blocking():
    assert worth_blocking(24, 16) and worth_blocking(64, 16) and worth_blocking(8, 8)
    # a pointwise conv from whole blocks to fewer channels than a block: one padded output block
    assert narrow_output(32, 2, 16, (1, 1)) and narrow_output(64, 1, 8, (1,))
    assert not narrow_output(32, 2, 16, (3, 3)) and not narrow_output(3, 2, 16, (1, 1))
    assert not narrow_output(32, 2, 16, (1, 1), dense=False) and not narrow_output(32, 24, 16, (1, 1))
    assert not worth_blocking(3, 16) and not worth_blocking(3, 8) and not worth_blocking(20, 16)


@pytest.mark.parametrize("c,block", [(16, 16), (24, 16), (5, 8)])
def test_reference_layouts_round_trip(c, block):
    x = R(2, c, 3, 4)
    xb = to_blocked(x, block)
    assert xb.shape == (2, -(-c // block), 3, 4, block)
    assert np.array_equal(from_blocked(xb, c), x)
    assert not xb[:, -1, ..., c % block:].any() if c % block else True    # zero padding
    w = R(c + 1, c, 3, 3)
    wn = unpack_conv_weight(pack_conv_weight(w, block, False), False)
    assert np.array_equal(wn[:c + 1, :c], w) and not wn[c + 1:].any() and not wn[:, c:].any()


@pytest.mark.parametrize("oc,ic,block,in_block", [(32, 16, 16, None), (32, 24, 16, 8), (16, 5, 8, 4), (8, 8, 8, 4)])
def test_packed_weight_holds_each_element_where_the_layout_says(oc, ic, block, in_block):
    """packed[o // ob, i // ib, kh, kw, i % ib, o % ob] = w[o, i, kh, kw], zero past the channels,
    whether the channels fill whole blocks (packed straight from w) or not (a padded copy)."""
    w = R(oc, ic, 3, 2)
    p = pack_conv_weight(w, block, False, in_block)
    ib = in_block or block
    assert p.shape == (-(-oc // block), -(-ic // ib), 3, 2, ib, block) and p.flags.c_contiguous
    o, i = np.meshgrid(np.arange(oc), np.arange(ic), indexing="ij")
    assert np.array_equal(p[o // block, i // ib, :, :, i % ib, o % block], w)
    assert np.count_nonzero(p) == np.count_nonzero(w)


def test_reference_conv_matches_onnx_conv():
    """ConvNCHWc's NumPy reference (what the interpreter runs) against ONNX Conv directly."""
    sig = "(%x: float32[2,14,7,6]) -> (%y)"
    body = ('  %y: float32[2,12,4,3] = Conv(%x, %w, %b) {kernel_shape = [3, 2], strides = [2, 2], '
            'pads = [1, 0, 1, 1], dilations = [1, 2]} name "c"')
    g = graph(prog(sig, body), w=R(12, 14, 3, 2), b=R(12))
    out = g.clone()
    transform(out, 8)
    assert "kiln::ConvNCHWc" in _ops(out)
    xs = random_inputs(g, 3)
    np.testing.assert_allclose(Interpreter(out).run(xs)[0], Interpreter(g).run(xs)[0], rtol=1e-5, atol=1e-5)


def test_selective_default_blocks_pointwise_depthwise_chains_only(monkeypatch):
    """By default dense 3x3 stride-1 convs stay NCHW (no faster blocked), and so does a 1x1 conv
    with no blocked neighbour (an AveragePool runs NCHW); a 1x1 -> Clip -> depthwise chain runs
    blocked."""
    monkeypatch.setattr(layout, "SELECTIVE", True)
    sig = "(%x: float32[1,8,6,6]) -> (%y)"
    body = ('  %a: float32[1,8,6,6] = Conv(%x, %w3) {kernel_shape = [3, 3], pads = [1, 1, 1, 1]} name "dense"\n'
            '  %b: float32[1,8,6,6] = Conv(%a, %w1) {kernel_shape = [1, 1]} name "lone_pw"\n'
            '  %m: float32[1,8,3,3] = AveragePool(%b) {kernel_shape = [2, 2], strides = [2, 2]} name "pool"\n'
            '  %c: float32[1,8,3,3] = Conv(%m, %w1) {kernel_shape = [1, 1]} name "pw"\n'
            '  %r: float32[1,8,3,3] = Clip(%c, %lo, %hi) name "relu6"\n'
            '  %y: float32[1,8,3,3] = Conv(%r, %wd) {kernel_shape = [3, 3], pads = [1, 1, 1, 1], group = 8} name "dw"')
    g = graph(prog(sig, body), w3=R(8, 8, 3, 3), w1=R(8, 8, 1, 1), wd=R(8, 1, 3, 3),
              lo=np.array(0, F), hi=np.array(6, F))
    out, stats = run_pass("transform_layout", g)
    assert _ops(out) == ["Conv", "Conv", "AveragePool", "kiln::ToNCHWc", "kiln::ConvNCHWc", "Clip",
                         "kiln::ConvNCHWc", "kiln::FromNCHWc"]
    assert_equivalent(g, out, rtol=1e-4, atol=1e-5)


def test_selective_blocks_a_large_depthwise_conv_alone(monkeypatch):
    """ConvNeXt's 7x7 depthwise conv between Transposes (LayerNorm over channels runs NHWC) runs
    blocked with no blocked neighbour, its conversions next to the Transposes; a lone 3x3 one
    stays NCHW. The chooser says which."""
    monkeypatch.setattr(layout, "SELECTIVE", True)
    sig = "(%x: float32[1,8,9,9]) -> (%y, %z)"
    body = ('  %d: float32[1,8,9,9] = Conv(%x, %w7) {kernel_shape = [7, 7], pads = [3, 3, 3, 3], group = 8} name "dw7"\n'
            '  %y: float32[1,9,9,8] = Transpose(%d) {perm = [0, 2, 3, 1]} name "to_nhwc"\n'
            '  %e: float32[1,8,9,9] = Conv(%x, %w3) {kernel_shape = [3, 3], pads = [1, 1, 1, 1], group = 8} name "dw3"\n'
            '  %z: float32[1,9,9,8] = Transpose(%e) {perm = [0, 2, 3, 1]} name "to_nhwc3"')
    g = graph(prog(sig, body), w7=R(8, 1, 7, 7), w3=R(8, 1, 3, 3))
    findings = []
    out = g.clone()
    transform(out, 8, findings=findings)
    convs = {n.name: n.qualified_op for n in out.nodes if n.name in ("dw7", "dw3")}
    assert convs == {"dw7": "kiln::ConvNCHWc", "dw3": "Conv"}
    why = {f.node: f.choice for f in findings}
    assert why["dw7"].algorithm == "direct-nchwc" and "7x7 taps: blocked whatever its neighbours" in why["dw7"].reason
    assert why["dw3"].algorithm == "direct-nchw" and "no blocked neighbour" in why["dw3"].reason
    assert_equivalent(g, out, rtol=1e-4, atol=1e-5)


def test_selective_blocks_a_stem_next_to_a_blocked_conv_or_maxpool_only(monkeypatch):
    """A few-channel stem conv runs blocked by default when a blocked conv follows through unary
    ops (MobileNet: stem -> ReLU6 -> depthwise) or a MaxPool (ResNet: the pool runs blocked,
    its result converted once), not when an AveragePool follows."""
    monkeypatch.setattr(layout, "SELECTIVE", True)
    sig = "(%x: float32[1,3,8,8]) -> (%y, %p)"
    body = ('  %a: float32[1,8,4,4] = Conv(%x, %w) {kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1]} name "stem"\n'
            '  %r: float32[1,8,4,4] = Clip(%a, %lo, %hi) name "relu6"\n'
            '  %y: float32[1,8,4,4] = Conv(%r, %wd) {kernel_shape = [3, 3], pads = [1, 1, 1, 1], group = 8} name "dw"\n'
            '  %s: float32[1,8,4,4] = Conv(%x, %w) {kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1]} name "stem2"\n'
            '  %q: float32[1,8,4,4] = Relu(%s) name "relu"\n'
            '  %p: float32[1,8,2,2] = MaxPool(%q) {kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1]} name "pool"\n'
            '  %t: float32[1,8,4,4] = Conv(%x, %w) {kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1]} name "stem3"\n'
            '  %u: float32[1,8,4,4] = Relu(%t) name "relu3"\n'
            '  %z: float32[1,8,2,2] = AveragePool(%u) {kernel_shape = [2, 2], strides = [2, 2]} name "avg"')
    sig = "(%x: float32[1,3,8,8]) -> (%y, %p, %z)"
    g = graph(prog(sig, body), w=R(8, 3, 3, 3), wd=R(8, 1, 3, 3), lo=np.array(0, F), hi=np.array(6, F))
    out, stats = run_pass("transform_layout", g)
    assert _ops(out) == ["kiln::ToNCHWc", "kiln::ConvNCHWc", "Clip", "kiln::ConvNCHWc", "kiln::ConvNCHWc", "Relu",
                         "kiln::MaxPoolNCHWc", "Conv", "Relu", "AveragePool", "kiln::FromNCHWc", "kiln::FromNCHWc"]
    assert stats.fired["MaxPool"] == 1
    assert_equivalent(g, out, rtol=1e-4, atol=1e-5)


def test_selective_blocks_a_conv_after_a_blocked_residual_add_or_before_a_global_pool(monkeypatch):
    """MobileNetV3's head: project 1x1 -> residual Add -> 1x1 -> HardSwish -> global pool. The
    last 1x1 runs blocked (the Add's operands are both blocked, the pool runs blocked after it),
    its pooled N,C,1,1 result converted once. A lone 1x1 conv before a pool runs blocked too (its
    input converted in, the pooled pixel out); one after an Add of an NCHW operand stays NCHW,
    and so does one after an Add of two 1x1 convs that stay NCHW themselves (after a grouped conv
    that cannot run blocked: 2 -> 4 channels per group)."""
    monkeypatch.setattr(layout, "SELECTIVE", True)
    sig = "(%x: float32[1,8,6,6]) -> (%y, %z, %v, %u)"
    body = ('  %a: float32[1,8,6,6] = Conv(%x, %w1) {kernel_shape = [1, 1]} name "expand"\n'
            '  %r: float32[1,8,6,6] = Relu(%a) name "relu"\n'
            '  %j: float32[1,8,6,6] = Conv(%r, %w1) {kernel_shape = [1, 1]} name "project"\n'
            '  %s: float32[1,8,6,6] = Add(%j, %a) name "residual"\n'
            '  %h: float32[1,16,6,6] = Conv(%s, %w2) {kernel_shape = [1, 1]} name "head"\n'
            '  %hs: float32[1,16,6,6] = HardSwish(%h) name "hswish"\n'
            '  %y: float32[1,16,1,1] = GlobalAveragePool(%hs) name "pool"\n'
            '  %n: float32[1,8,6,6] = Neg(%x) name "neg"\n'
            '  %t: float32[1,8,6,6] = Add(%j, %n) name "add_nchw"\n'
            '  %z: float32[1,16,6,6] = Conv(%t, %w2) {kernel_shape = [1, 1]} name "after_nchw_add"\n'
            '  %l: float32[1,16,6,6] = Conv(%n, %w2) {kernel_shape = [1, 1]} name "lone"\n'
            '  %v: float32[1,16,1,1] = ReduceMean(%l) {axes = [2, 3], keepdims = 1} name "mean"\n'
            '  %g1: float32[1,16,6,6] = Conv(%x, %wg) {kernel_shape = [3, 3], pads = [1, 1, 1, 1], group = 4} name "grouped"\n'
            '  %q1: float32[1,8,6,6] = Conv(%g1, %w3) {kernel_shape = [1, 1]} name "pw1"\n'
            '  %q2: float32[1,8,6,6] = Conv(%g1, %w3) {kernel_shape = [1, 1]} name "pw2"\n'
            '  %s2: float32[1,8,6,6] = Add(%q1, %q2) name "add_of_nchw_convs"\n'
            '  %u: float32[1,16,6,6] = Conv(%s2, %w2) {kernel_shape = [1, 1]} name "after_nchw_convs"')
    g = graph(prog(sig, body, 17), w1=R(8, 8, 1, 1), w2=R(16, 8, 1, 1), wg=R(16, 2, 3, 3), w3=R(8, 16, 1, 1))
    out, stats = run_pass("transform_layout", g)
    names = ("head", "after_nchw_add", "lone", "pw1", "after_nchw_convs")
    convs = {n.name: n.qualified_op for n in out.nodes if n.name in names}
    assert convs == {"head": "kiln::ConvNCHWc", "after_nchw_add": "Conv", "lone": "kiln::ConvNCHWc",
                     "pw1": "Conv", "after_nchw_convs": "Conv"}
    assert stats.fired["GlobalAveragePool"] == 2
    assert_equivalent(g, out, rtol=1e-4, atol=1e-5)


def test_blocked_add_needs_both_operands_blocked():
    """A residual Add of a blocked value and a computed NCHW one stays NCHW (converting the NCHW
    operand in and the sum back out would cost more than the Add)."""
    sig = "(%x: float32[1,8,6,6]) -> (%y, %z)"
    body = ('  %a: float32[1,8,6,6] = Conv(%x, %w1) {kernel_shape = [1, 1]} name "pw"\n'
            '  %n: float32[1,8,6,6] = Neg(%x) name "neg"\n'
            '  %y: float32[1,8,6,6] = Add(%a, %n) name "add"\n'
            '  %z: float32[1,8,6,6] = Sub(%n, %a) name "sub"')
    g = graph(prog(sig, body), w1=R(8, 8, 1, 1))
    out, stats = run_pass("transform_layout", g)
    assert _ops(out) == ["kiln::ToNCHWc", "kiln::ConvNCHWc", "Neg", "kiln::FromNCHWc", "Add", "Sub"]
    assert_equivalent(g, out, rtol=1e-4, atol=1e-5)


def se_block(n=1, c=8, h=9, m=24, r=4, o=8, k=3, s=1, pool="GlobalAveragePool", act="HardSwish",
             gate="HardSigmoid", opset=17, outputs="%y"):
    """A MobileNetV3/EfficientNet inverted residual with squeeze-excite, NCHW: 1x1 expand (c -> m)
    -> act -> depthwise kxk stride s -> act -> pool -> 1x1 (m -> r) -> Relu -> 1x1 (r -> m)
    -> gate -> Mul -> 1x1 project (m -> o) [-> Add of the input when the shapes allow].
    `act` "SiLU" writes x * Sigmoid(x) out, as exporters do; `n` may be a symbol."""
    p = k // 2
    oh = (h + 2 * p - k) // s + 1

    def ty(ch, hw):
        return f"float32[{n},{ch},{hw},{hw}]"

    def activation(src, dst, hw):
        if act == "SiLU":
            return (f'  %{dst}_s: {ty(m, hw)} = Sigmoid(%{src}) name "{dst}_sig"\n'
                    f'  %{dst}: {ty(m, hw)} = Mul(%{src}, %{dst}_s) name "{dst}_mul"\n')
        return f'  %{dst}: {ty(m, hw)} = {act}(%{src}) name "{dst}_act"\n'
    if pool == "GlobalAveragePool":
        pooled = f'  %p: {ty(m, 1)} = GlobalAveragePool(%a2) name "pool"\n'
    elif opset >= 18:
        pooled = f'  %p: {ty(m, 1)} = ReduceMean(%a2, %axes) {{keepdims = 1}} name "pool"\n'
    else:
        pooled = f'  %p: {ty(m, 1)} = ReduceMean(%a2) {{axes = [-1, -2], keepdims = 1}} name "pool"\n'
    body = (f'  %e: {ty(m, h)} = Conv(%x, %we, %be) {{kernel_shape = [1, 1]}} name "expand"\n'
            + activation("e", "a1", h)
            + f'  %d: {ty(m, oh)} = Conv(%a1, %wd, %bd) {{kernel_shape = [{k}, {k}], strides = [{s}, {s}], '
            f'pads = [{p}, {p}, {p}, {p}], group = {m}}} name "dw"\n'
            + activation("d", "a2", oh)
            + pooled
            + f'  %q: {ty(r, 1)} = Conv(%p, %w1, %b1) {{kernel_shape = [1, 1]}} name "fc1"\n'
            f'  %qr: {ty(r, 1)} = Relu(%q) name "fc1_relu"\n'
            f'  %t: {ty(m, 1)} = Conv(%qr, %w2, %b2) {{kernel_shape = [1, 1]}} name "fc2"\n'
            f'  %g: {ty(m, 1)} = {gate}(%t) name "gate"\n'
            f'  %sc: {ty(m, oh)} = Mul(%a2, %g) name "scale"\n')
    residual = s == 1 and o == c
    body += f'  %{"j" if residual else "y"}: {ty(o, oh)} = Conv(%sc, %wp, %bp) {{kernel_shape = [1, 1]}} name "project"'
    if residual:
        body += f'\n  %y: {ty(o, oh)} = Add(%j, %x) name "residual"'
    consts = dict(we=R(m, c, 1, 1), be=R(m), wd=R(m, 1, k, k), bd=R(m), w1=R(r, m, 1, 1) * 0.3, b1=R(r),
                  w2=R(m, r, 1, 1) * 0.3, b2=R(m), wp=R(o, m, 1, 1) * 0.3, bp=R(o))
    if pool != "GlobalAveragePool" and opset >= 18:
        consts["axes"] = np.array([2, 3], np.int64)
    return graph(prog(f"(%x: {ty(c, h)}) -> ({outputs})", body, opset), **consts)


@pytest.mark.parametrize("pool,opset", [("GlobalAveragePool", 17), ("ReduceMean", 13), ("ReduceMean", 18)])
def test_squeeze_excite_stays_blocked(pool, opset, monkeypatch):
    """Pool, the two 1x1 convs on the pooled pixel (4 hidden channels padded to 8 all the same),
    the gate and the scale run blocked; the scale folds into the project conv (no Mul kernel):
    one conversion in, one out. Also by the selective default."""
    monkeypatch.setattr(layout, "SELECTIVE", True)
    g = se_block(pool=pool, opset=opset)
    out, stats = run_pass("transform_layout", g)
    assert _ops(out) == ["kiln::ToNCHWc", "kiln::ConvNCHWc", "HardSwish", "kiln::ConvNCHWc", "HardSwish",
                         "kiln::GlobalAveragePoolNCHWc", "kiln::ConvNCHWc", "Relu", "kiln::ConvNCHWc",
                         "HardSigmoid", "kiln::ConvNCHWc", "Add", "kiln::FromNCHWc"]
    project = out.nodes[10]
    assert len(project.inputs) == 4 and project.inputs[3].type.shape == (1, 3, 1, 1, 8)
    assert stats.fired["scale"] == 1 and stats.fired["GlobalAveragePool"] == 1
    assert_equivalent(g, out, rtol=1e-4, atol=1e-5)


def test_per_channel_gate_read_twice_is_a_blocked_mul():
    """A gated value read by something else too keeps its (blocked, broadcasting) Mul."""
    g2 = se_block(s=2, o=16, outputs="%y, %sc")
    out, stats = run_pass("transform_layout", g2)
    muls = [n for n in out.nodes if n.op == "Mul"]
    assert len(muls) == 1 and muls[0].inputs[1].type.shape == (1, 3, 1, 1, 8)
    assert "scale" not in stats.fired
    assert_equivalent(g2, out, rtol=1e-4, atol=1e-5)
