"""Native lowerings of kiln's blocked-layout ops (ToNCHWc, FromNCHWc, ConvNCHWc) against the
NumPy references: NCHW graphs are rewritten by transform_layout, compiled for the cpu target
without further passes, and compared with the interpreter on the original NCHW graph."""

from __future__ import annotations

import re

import numpy as np
import pytest

import kiln
from kiln.interpreter import Interpreter
from kiln.lower.nchwc import plan_tile
from kiln.ops.layout import BlockedGeom
from kiln.passes import layout
from kiln.passes.layout import transform, worth_blocking
from kiln.passes.layout_rules import blockable_channels
from tests.passes.test_layout import R
from tests.passes.util import graph, prog, random_inputs

F = np.float32


def conv_text(x, y, c, oc, k, s=1, p=0, group=1, d=1, name="conv", bias=True):
    attrs = (f"kernel_shape = [{k}, {k}], strides = [{s}, {s}], pads = [{p}, {p}, {p}, {p}], "
             f"dilations = [{d}, {d}], group = {group}")
    return f'  %{y}: float32[{{{y}}}] = Conv(%{x}, %w_{name}{", %b_" + name if bias else ""}) {{{attrs}}} name "{name}"\n'


def out_hw(h, k, s, p, d=1):
    return (h + 2 * p - (k - 1) * d - 1) // s + 1


def conv_case(n, c, h, oc, k, s=1, p=0, dw=False, d=1, epilogue=None, bias=True):
    """One conv (dense, or depthwise when dw) on an NCHW input, with an optional fused epilogue."""
    o = out_hw(h, k, s, p, d)
    group = c if dw else 1
    consts = {"w_conv": R(oc, c // group, k, k)}
    if bias:
        consts["b_conv"] = R(oc)
    body = conv_text("x", "c", c, oc, k, s, p, group, d, bias=bias)
    last, shape = "c", f"{n},{oc},{o},{o}"
    if epilogue == "relu":
        body += f'  %r: float32[{shape}] = Relu(%c) name "relu"\n'
        last = "r"
    elif epilogue == "clip":
        consts.update(lo=np.array(0, F), hi=np.array(0.5, F))
        body += f'  %r: float32[{shape}] = Clip(%c, %lo, %hi) name "clip"\n'
        last = "r"
    elif epilogue == "residual":   # Add of two blocked tensors, then ReLU: resnet's block end
        consts.update(w_side=R(oc, c, 1, 1))
        body += conv_text("x", "e", c, oc, 1, s, 0, name="side", bias=False).replace("{e}", "{c}")
        body += f'  %a: float32[{shape}] = Add(%c, %e) name "add"\n  %r: float32[{shape}] = Relu(%a) name "relu"\n'
        last = "r"
    body = body.replace("{c}", shape).rstrip("\n").replace(f"%{last}:", "%y:").replace(f"%{last})", "%y)")
    return graph(prog(f"(%x: float32[{n},{c},{h},{h}]) -> (%y)", body.replace(f"(%{last},", "(%y,")), **consts)


CASES = {
    "1x1": dict(n=1, c=16, h=7, oc=32, k=1),
    "1x1_stride2_nobias": dict(n=1, c=16, h=9, oc=16, k=1, s=2, bias=False),
    "3x3_pad_relu": dict(n=2, c=16, h=10, oc=16, k=3, p=1, epilogue="relu"),
    "3x3_stride2_residual": dict(n=1, c=16, h=11, oc=32, k=3, s=2, p=1, epilogue="residual"),
    "3x3_dilated_clip": dict(n=1, c=8, h=12, oc=24, k=3, p=2, d=2, epilogue="clip"),
    "channels_not_multiple": dict(n=1, c=12, h=6, oc=20, k=3, p=1),      # 12 -> 16, 20 -> 24 (block 8)
    "5x5_valid": dict(n=1, c=16, h=9, oc=8, k=5),
    # a last input block at most half used: the 1x1 conv sums over the used lanes only
    "1x1_narrow_relu": dict(n=2, c=24, h=7, oc=32, k=1, epilogue="relu"),
    "1x1_narrow_stride2": dict(n=1, c=12, h=9, oc=16, k=1, s=2),
    "1x1_narrow_40": dict(n=1, c=40, h=5, oc=48, k=1, epilogue="clip"),
    "depthwise_3x3_clip": dict(n=1, c=24, h=13, oc=24, k=3, p=1, dw=True, epilogue="clip"),
    "depthwise_stride2_pad": dict(n=2, c=12, h=10, oc=12, k=3, s=2, p=1, dw=True),
    # few input channels: read channels-last (one block of all c), written in blocks
    "stem_3ch_stride2_relu": dict(n=1, c=3, h=15, oc=16, k=3, s=2, p=1, epilogue="relu"),
    "stem_5ch_7x7_nobias": dict(n=2, c=5, h=13, oc=20, k=7, s=2, p=3, bias=False),
    "stem_2ch_dilated_clip": dict(n=1, c=2, h=11, oc=8, k=3, p=2, d=2, epilogue="clip"),
    # few output channels: a pointwise head writes them in one zero-padded block; a 3x3 stays NCHW
    "1x1_few_outputs_relu": dict(n=2, c=16, h=9, oc=3, k=1, epilogue="relu"),
    "1x1_one_output_residual": dict(n=1, c=32, h=6, oc=1, k=1, epilogue="residual"),
    "3x3_few_outputs": dict(n=1, c=16, h=8, oc=2, k=3, p=1),
}


@pytest.mark.parametrize("block", [8, 16])
@pytest.mark.parametrize("case", list(CASES))
def test_blocked_conv_matches_reference(case, block):
    g = conv_case(**CASES[case])
    blocked = g.clone()
    fired = transform(blocked, block, selective=False, override="direct")   # the direct kernel (not Winograd)
    cfg = CASES[case]
    expect_blocked = blockable_channels(cfg["c"], cfg["oc"], block, (cfg["k"], cfg["k"]), cfg.get("dw", False))
    assert bool(fired.get("Conv")) == expect_blocked, fired
    if not expect_blocked:
        return
    assert {n.qualified_op for n in blocked.nodes} >= {"kiln::ToNCHWc", "kiln::ConvNCHWc", "kiln::FromNCHWc"}
    xs = random_inputs(g, 1)
    want = Interpreter(g).run(xs)[0]
    ref = Interpreter(blocked).run(xs)[0]             # the blocked ops' NumPy references
    np.testing.assert_allclose(ref, want, rtol=1e-4, atol=1e-4)
    m = kiln.compile(blocked, target="cpu", opt_level=0, report=True)
    got = m.run({"x": xs[0]})["y"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    if cfg.get("epilogue"):   # the epilogue is fused into the conv's kernel
        assert any("ConvNCHWc" in str(k) and ("Relu" in str(k) or "Clip" in str(k)) for k in m.report.fused_groups)


def test_plan_tile_fits_the_register_file():
    def geom(ow, ocb, dw=False):
        k = [3, 3] if dw else [1, 1]
        return BlockedGeom(1, 4, ow, ow, 16, ocb, 1 if dw else 4, k, 16, [1, 1], [1, 1], [0, 0], [ow, ow], dw)
    for vbytes, regs in ((64, 32), (32, 16)):
        for ow in (7, 13, 14, 28, 56, 112, 398):
            for ocb in (1, 4, 6, 9):
                r, v = plan_tile(geom(ow, ocb), vbytes)
                assert ocb % v == 0 and (r * v <= regs - 4 or r == 1) and r <= ow
                r, v = plan_tile(geom(ow, ocb, True), vbytes)
                assert v == 1 and (r <= min(regs - 4, 14) or r == 1) and r <= ow
    assert plan_tile(geom(56, 4), 64) == (7, 4)
    # widths with no good divisor: the last tile runs past the row (1599 = 3 x 13 x 41, 398 = 2 x 199)
    assert plan_tile(geom(1599, 32), 64) == (7, 4) and plan_tile(geom(398, 8), 64) == (7, 4)
    # ... but a conv reading its input in place keeps a divisor when one is nearly as good
    assert plan_tile(geom(54, 4), 64, in_place=True) == (6, 4)
    # depthwise: enough independent accumulators to cover the FMA latency, AVX2 too
    assert plan_tile(geom(7, 4, True), 32) == (7, 1) and plan_tile(geom(14, 4, True), 32) == (7, 1)
    assert plan_tile(geom(56, 4, True), 64) == (14, 1)
    # one channel block: at most 14 columns (each its own address register), not 28
    assert plan_tile(geom(28, 1), 64) == (14, 1) and plan_tile(geom(112, 1), 64) == (14, 1)
    # a rotated grouped conv: an accumulator per lane rotation and column, half the registers
    for vbytes, regs in ((64, 32), (32, 16)):
        for rot in (2, 4, 8):
            for ow in (1, 7, 28, 56):
                g = BlockedGeom(1, 4, ow, ow, 16, 4, rot, [3, 3], 16, [1, 1], [1, 1], [1, 1], [ow, ow], True, 1, rot)
                r, v = plan_tile(g, vbytes)
                assert v == 1 and r <= ow and (r * rot <= regs // 2 or r <= 2)
    rotated = BlockedGeom(1, 8, 56, 56, 16, 8, 4, [3, 3], 16, [1, 1], [1, 1], [1, 1], [56, 56], True, 1, 4)
    assert plan_tile(rotated, 64) == (4, 1) and plan_tile(rotated, 32) == (2, 1)


@pytest.mark.parametrize("order", ["channels", "rows", "groups"])
@pytest.mark.parametrize("case", ["1x1", "1x1_stride2_nobias", "3x3_stride2_residual", "stem_5ch_7x7_nobias",
                                  "3x3_pad_relu", "1x1_narrow_relu"])
def test_either_loop_order_matches_reference(case, order):
    """Every loop order of the blocked direct conv (kiln.lower.nchwc.loop_order), at batch 1 and
    2 (3x3_pad_relu, 1x1_narrow_relu: "groups" runs each channel group over both images)."""
    blocked_direct_matches_reference(case, {"nchwc.order": order})


def blocked_direct_matches_reference(case: str, decisions: dict) -> None:
    """CASES[case] blocked (direct convs, block 8) and compiled with `decisions` gives the
    interpreter's result on the NCHW graph."""
    g = conv_case(**CASES[case])
    blocked = g.clone()
    transform(blocked, 8, selective=False, override="direct")
    xs = random_inputs(g, 1)
    got = kiln.compile(blocked, target="cpu", opt_level=0, decisions=decisions).run({"x": xs[0]})["y"]
    np.testing.assert_allclose(got, Interpreter(g).run(xs)[0], rtol=1e-4, atol=1e-4)


def test_loop_order_reads_a_large_plane_once():
    """Rows outside the channel groups where the input plane does not fit L2 and the weights fit
    half of it (ResNet-50's 1x1 convs of 56x56x256); channels outside where the plane fits or the
    weights would stream once per row."""
    from kiln.lower.nchwc import loop_order
    from kiln.targets.target import Target
    t = Target.named("x86-64-v4", l2_bytes=1 << 20)

    def geom(c, h, oc, s=1, k=1):
        o = (h - k) // s + 1
        return BlockedGeom(1, c // 16, h, h, 16, oc // 16, c // 16, [k, k], 16, [s, s], [1, 1], [0, 0], [o, o], False)
    assert loop_order(geom(256, 56, 512, s=2), 4, 4, t) == "rows"         # 3.2 MB plane, 512 KB weights
    assert loop_order(geom(256, 56, 128), 4, 4, t) == "rows"
    assert loop_order(geom(64, 56, 256), 4, 4, t) == "channels"            # 802 KB plane: fits
    assert loop_order(geom(512, 28, 1024, s=2), 4, 4, t) == "channels"     # 2 MB of weights, 14 rows
    assert loop_order(geom(256, 56, 64), 4, 4, t) == "channels"            # one channel group
    assert loop_order(geom(256, 56, 512, s=2), 4, 4, Target.named("x86-64-v4", l2_bytes=8 << 20)) == "channels"


def test_loop_order_reads_large_weights_once_for_the_batch():
    """"groups" (each channel group over every image) where the weights do not stay in half of L2
    and the batch's input is small beside them (ResNet-50's 512 -> 2048 1x1 of 7x7 at batch 4: 4
    MB of weights once, not per image); the per-image orders where the batch's input would be
    read again per group for little gain (2048 -> 512 of 7x7) or much loss (1024 -> 2048 stride
    2 of 14x14), where the weights fit L2 (960 -> 320 of 7x7, 1.2 MB: read again per image from
    L3), at batch 1, and at a batch not known until run time."""
    from kiln.loops.symbols import symbol
    from kiln.lower.nchwc import loop_order
    from kiln.targets.target import Target
    t = Target.named("x86-64-v4", l2_bytes=2 << 20)

    def geom(n, c, h, oc, s=1, k=1):
        p = k // 2
        o = (h + 2 * p - k) // s + 1
        return BlockedGeom(n, c // 16, h, h, 16, oc // 16, c // 16, [k, k], 16, [s, s], [1, 1], [p, p], [o, o], False)
    assert [loop_order(geom(n, 512, 7, 2048), 4, 4, t) for n in (1, 2, 4, 8)] == ["channels"] + ["groups"] * 3
    assert loop_order(geom(4, 512, 14, 512, s=2, k=3), 4, 4, t) == "groups"       # 9.4 MB of weights
    assert loop_order(geom(4, 2048, 7, 512), 4, 4, t) == "channels"
    assert loop_order(geom(4, 1024, 14, 2048, s=2), 4, 4, t) == "channels"
    assert loop_order(geom(8, 960, 7, 320), 4, 4, t) == "channels"
    assert loop_order(geom(4, 256, 56, 128), 4, 4, t) == "rows"
    assert loop_order(geom(symbol("batch"), 512, 7, 2048), 4, 4, t) == "channels"


@pytest.mark.parametrize("case", ["1x1", "3x3_stride2_residual", "3x3_pad_relu", "channels_not_multiple"])
def test_next_group_hints_keep_the_result(case):
    """nchwc.prefetch_next: the next channel group's weight hints (Stage.prefetch_next) read and
    write nothing, whatever the group (the last one's point past the weights)."""
    blocked_direct_matches_reference(case, {"nchwc.order": "channels", "nchwc.prefetch": 1, "nchwc.prefetch_next": 1})


def test_next_group_hint_rule_and_kernel():
    """A dense conv tile hints the next channel group's weights into L2, a block per output row,
    where a group takes at most a quarter of L2 and each chunk of the parallel loop holds two
    groups or more: ResNet-50's 512 -> 2048 1x1 of 7x7 and 1024 -> 2048 stride 2 (32 groups, 4
    to a chunk on 2 cores), 256 -> 1024 of 14x14 (16 groups, 2 to a chunk); not 2048 -> 512 (8
    groups, a chunk each: the next is another thread's) but on one core, not the 3x3 512 -> 512
    (1.18 MB a group), a depthwise conv or one group."""
    from kiln.compiler import run_stages
    from kiln.lower.nchwc import prefetch_next
    from kiln.targets.target import Target
    two, one = (Target.named("x86-64-v4", cores=c, l1d_bytes=48 << 10, l2_bytes=2 << 20) for c in (2, 1))

    def geom(c, h, oc, s=1, k=1, dw=False, n=1):
        p = k // 2
        o = (h + 2 * p - k) // s + 1
        return BlockedGeom(n, c // 16, h, h, 16, oc // 16, 1 if dw else c // 16, [k, k], 16, [s, s], [1, 1], [p, p],
                           [o, o], dw)
    assert prefetch_next(geom(512, 7, 2048), 4, 4, two) == 1
    assert prefetch_next(geom(1024, 14, 2048, s=2), 4, 4, two) == 1
    assert prefetch_next(geom(256, 14, 1024), 4, 4, two) == 1
    assert prefetch_next(geom(2048, 7, 512), 4, 4, two) == 0
    assert prefetch_next(geom(2048, 7, 512), 4, 4, one) == 1
    assert prefetch_next(geom(512, 7, 512, k=3), 4, 4, one) == 0
    assert prefetch_next(geom(512, 7, 512, k=3, dw=True), 1, 4, one) == 0
    assert prefetch_next(geom(256, 14, 64), 4, 4, one) == 0
    # the kernel: one hint per input-lane step, the next group's block (row mod the tile's
    # blocks: oc_v), into L2, beside the tile's own blocks' hints into L1
    g = conv_case(n=1, c=64, h=9, oc=256, k=1)          # 64 KiB of weights, 4 groups of 9 rows
    blocked = g.clone()
    transform(blocked, 16, selective=False, override="direct")
    _, oc_v = plan_tile(geom(64, 9, 256), 64)
    src = run_stages(blocked, "c", cpu=one).source.text
    l2 = [ln.strip() for ln in src.splitlines() if "__builtin_prefetch" in ln and ln.endswith(", 0, 2);")]
    assert len(l2) == 1 and f"% {oc_v}) * 1024)" in l2[0] and l2[0].endswith(f" + {oc_v * 1024})], 0, 2);")
    assert "0, 2);" not in run_stages(blocked, "c", cpu=two).source.text        # 36 rows in chunks of 4-5
    assert "0, 2);" not in run_stages(blocked, "c", cpu=one, decisions={"nchwc.prefetch_next": 0}).source.text


@pytest.mark.parametrize("ahead", [0, 1, 16])
@pytest.mark.parametrize("case", ["1x1", "3x3_stride2_residual", "3x3_dilated_clip", "channels_not_multiple"])
def test_weight_prefetch_keeps_the_result(case, ahead):
    """nchwc.prefetch: a dense tile's weight hints (Stage.prefetch) read and write nothing."""
    blocked_direct_matches_reference(case, {"nchwc.prefetch": ahead})


def test_weight_prefetch_rule_and_kernel():
    """A dense conv whose weights exceed L1 prefetches them PREFETCH_BYTES ahead in its tile's
    input-lane loop, one hint per output block of the tile; depthwise convs and weights that fit
    L1 do not."""
    from kiln.compiler import run_stages
    from kiln.lower.nchwc import PREFETCH_BYTES, prefetch_ahead
    from kiln.targets.target import Target
    t = Target.named("x86-64-v4", l1d_bytes=48 << 10)

    def geom(c, oc, k=1, dw=False, h=14):
        return BlockedGeom(1, c // 16, h, h, 16, oc // 16, 1 if dw else c // 16, [k, k], 16, [1, 1], [1, 1],
                           [0, 0], [h, h], dw)
    assert prefetch_ahead(geom(256, 256), 256 * 256 * 4, 4, t) == PREFETCH_BYTES // 64      # 256 KiB of weights
    assert prefetch_ahead(geom(64, 64), 64 * 64 * 4, 4, t) == 0                            # 16 KiB: in L1
    assert prefetch_ahead(geom(512, 512, 3, dw=True), 512 * 9 * 4 * 16, 4, t) == 0         # depthwise
    g = conv_case(n=1, c=64, h=9, oc=256, k=1)          # 64 KiB of weights
    blocked = g.clone()
    transform(blocked, 16, selective=False, override="direct")
    hints = [ln for ln in run_stages(blocked, "c", cpu=t).source.text.splitlines() if "__builtin_prefetch" in ln
             and ln.endswith(", 0, 3);") and "prefetch(&b0_" not in ln]   # (into L1: not the next group's,
    # prefetch_next, nor the input's, prefetch_input)
    _, oc_v = plan_tile(geom(64, 256, h=9), 64)
    # each output block's weight stream (64 x 16 floats apart), PREFETCH_BYTES ahead of the vector read
    ahead = {int(h.rsplit("+ ", 1)[1].split(")")[0]) for h in hints}
    assert len(hints) == oc_v > 1 and ahead == {PREFETCH_BYTES // 4 + 64 * 16 * o for o in range(oc_v)}
    assert "__builtin_prefetch" not in run_stages(blocked, "c", cpu=t, decisions={"nchwc.prefetch": 0,
                                                                                  "nchwc.prefetch_input": 0}).source.text


@pytest.mark.slow
@pytest.mark.parametrize("name,selective,blocked", [("mobilenetv2", True, 52), ("resnet18", False, 20),
                                                    ("resnet18", True, 20)])
def test_models_at_O3_match_onnxruntime(name, selective, blocked, monkeypatch):
    ort = pytest.importorskip("onnxruntime")
    from benchmarks.models import MODELS, inputs_for
    monkeypatch.setattr(layout, "SELECTIVE", selective)
    model = MODELS[name]()
    feeds = inputs_for(name, model)
    m = kiln.compile(model, target="cpu", opt_level=3, report=True)
    fired = next(s for s in m.report.passes if s.name == "transform_layout").fired
    assert fired.get("Conv", 0) + fired.get("Winograd", 0) == blocked    # every conv taken into NCHWc
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = s.run(None, feeds)[0]
    got = m.run(feeds)
    got = got["logits"] if isinstance(got, dict) else got[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


POOLS = {   # conv (c -> oc, k, s, p) -> Relu -> MaxPool (k, s, p, d) on an h x h input
    "resnet_stem": dict(c=3, h=23, oc=16, k=7, s=2, p=3, pk=3, ps=2, pp=1),
    "padded_channels_no_pads": dict(c=16, h=9, oc=12, k=1, s=1, p=0, pk=2, ps=2, pp=0),
    "dilated_stride1": dict(c=8, h=10, oc=24, k=3, s=1, p=1, pk=3, ps=1, pp=2, pd=2),
    "uneven_pads": dict(c=3, h=12, oc=16, k=3, s=1, p=1, pk=3, ps=2, pp=0, pads=[0, 1, 1, 0]),
}


@pytest.mark.parametrize("block", [8, 16])
@pytest.mark.parametrize("case", list(POOLS))
def test_blocked_max_pool_matches_reference(case, block):
    cfg = POOLS[case]
    c, h, oc, k, s, p = (cfg[key] for key in ("c", "h", "oc", "k", "s", "p"))
    o = out_hw(h, k, s, p)
    pads = cfg.get("pads", [cfg["pp"]] * 4)
    d = cfg.get("pd", 1)
    po = (o + pads[0] + pads[2] - (cfg["pk"] - 1) * d - 1) // cfg["ps"] + 1
    po2 = (o + pads[1] + pads[3] - (cfg["pk"] - 1) * d - 1) // cfg["ps"] + 1
    body = conv_text("x", "c", c, oc, k, s, p).replace("{c}", f"1,{oc},{o},{o}")
    body += (f'  %r: float32[1,{oc},{o},{o}] = Relu(%c) name "relu"\n'
             f'  %y: float32[1,{oc},{po},{po2}] = MaxPool(%r) {{kernel_shape = [{cfg["pk"]}, {cfg["pk"]}], '
             f'strides = [{cfg["ps"]}, {cfg["ps"]}], pads = {pads}, dilations = [{d}, {d}]}} name "pool"')
    g = graph(prog(f"(%x: float32[1,{c},{h},{h}]) -> (%y)", body), w_conv=R(oc, c, k, k), b_conv=R(oc))
    blocked = g.clone()
    fired = transform(blocked, block, selective=False, override="direct")   # the direct kernel (not Winograd)
    assert fired.get("MaxPool") == 1, fired
    assert "kiln::MaxPoolNCHWc" in {n.qualified_op for n in blocked.nodes}
    xs = random_inputs(g, 2)
    want = Interpreter(g).run(xs)[0]
    np.testing.assert_allclose(Interpreter(blocked).run(xs)[0], want, rtol=1e-5, atol=1e-5)
    got = kiln.compile(blocked, target="cpu", opt_level=0).run({"x": xs[0]})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


SE_CASES = {   # tests.passes.test_layout.se_block arguments
    "v3_hardswish_residual": dict(c=8, h=9, m=24, r=4, o=8),
    "stride2_5x5_reducemean": dict(n=2, c=8, h=11, m=20, r=6, o=12, k=5, s=2, pool="ReduceMean", opset=13),
    "silu_sigmoid_batch3": dict(n=3, c=16, h=7, m=40, r=10, o=16, act="SiLU", gate="Sigmoid"),
    # a 2x2 plane, 40 output channels: the project conv scales what it reads, not its weights
    "tiny_plane_wide_project": dict(n=2, c=8, h=4, m=24, r=6, o=40, s=2),
    # 7x7, 64 outputs: the scaled input made once in the conv's copy (kiln.lower.nchwc), 2 images
    "seven_plane_wide_project": dict(n=2, c=16, h=7, m=48, r=8, o=64),
    "odd_everything": dict(n=1, c=5, h=13, m=18, r=3, o=7, k=5, s=1, act="Relu", gate="Sigmoid",
                           pool="ReduceMean", opset=18),
}


def _se_random_cases(count=3, seed=7):
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(count):
        k, s = int(rng.choice([3, 5])), int(rng.choice([1, 2]))
        out[f"random{i}"] = dict(n=int(rng.integers(1, 4)), c=int(rng.integers(3, 20)), h=int(rng.integers(5, 16)),
                                 m=int(rng.integers(8, 48)), r=int(rng.integers(2, 12)), o=int(rng.integers(4, 24)),
                                 k=k, s=s, act=str(rng.choice(["HardSwish", "SiLU", "Relu"])),
                                 gate=str(rng.choice(["HardSigmoid", "Sigmoid"])))
    return out


SE_CASES.update(_se_random_cases())


@pytest.mark.parametrize("block", [8, 16])
@pytest.mark.parametrize("case", list(SE_CASES))
def test_squeeze_excite_blocked_matches_reference(case, block):
    """A whole inverted residual with squeeze-excite, every conv blocked: the blocked global
    average, the per-channel gate broadcast, the gate folded into the project conv's weights."""
    from tests.passes.test_layout import se_block
    cfg = SE_CASES[case]
    g = se_block(**cfg)
    blocked = g.clone()
    fired = transform(blocked, block, selective=False, override="direct")   # the direct kernel (not Winograd)
    if worth_blocking(cfg["m"], block) and worth_blocking(cfg["o"], block):
        assert fired.get("GlobalAveragePool") == 1 and fired.get("scale") == 1, fired
    xs = random_inputs(g, 1)
    want = Interpreter(g).run(xs)[0]
    np.testing.assert_allclose(Interpreter(blocked).run(xs)[0], want, rtol=1e-4, atol=1e-4)
    got = kiln.compile(blocked, target="cpu", opt_level=0).run({"x": xs[0]})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", ["silu_sigmoid_batch3", "v3_hardswish_residual"])
def test_gate_scaled_weights_are_scaled_a_vector_at_a_time(case):
    """A squeeze-excite gate the project conv's weights take (kiln.lower.nchwc.scaled_weights,
    per image and input channel ii): the weights are scaled in vector loops over the output
    lanes o, the gate one value over the vector, not in runs of ii x o with a gate per block
    of lanes (a load indexed by lane // block, which GCC left a scalar loop: one element a
    cycle, 75K of EfficientNet-B0's 672 -> 112 weights per image)."""
    from kiln.compiler import run_stages
    from kiln.loops import stmt as S
    from kiln.loops.expr import free_vars, walk
    from tests.passes.test_layout import se_block
    st = run_stages(se_block(**SE_CASES[case]), "loops", cpu="x86-64-v4")
    loops = [t for f in st.lowered.module.funcs if isinstance(f, S.PrimFunc) for t in S.walk_stmts(f.body)
             if isinstance(t, S.For) and t.kind == "vectorized" and isinstance(t.body, S.Store)
             and "wscaled" in t.body.buffer.name]
    assert loops, "no scaled weights in the model"
    for t in loops:
        assert t.extent.op == "const" and t.extent.arg == 16, S.ir_text(t)     # one block's o lanes
        loads = [x for x in walk(t.body.value) if x.op == "load"]
        lane_free = [x for x in loads if all(t.var not in free_vars(i) for i in x.args)]
        divided = [x for x in loads for i in x.args for y in walk(i)
                   if y.op in ("floordiv", "floormod", "div", "mod") and t.var in free_vars(y)]
        assert lane_free and not divided, S.ir_text(t)                        # the gate: one value


def test_squeeze_excite_symbolic_batch_at_O3():
    """The default pipeline (SiLU recognised, selective blocking) on a symbolic batch: one
    compiled model at batch 1 and 4 against the reference."""
    from tests.passes.test_layout import se_block
    g = se_block(n="N", c=16, h=10, m=48, r=12, o=24, k=5, s=2, act="SiLU", gate="Sigmoid")
    m = kiln.compile(g, target="cpu")
    ref = Interpreter(g)
    for n in (1, 4):
        x = np.random.default_rng(n).standard_normal((n, 16, 10, 10)).astype(F)
        np.testing.assert_allclose(m.run({"x": x})["y"], ref.run([x])[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("partials", [1, 4, 8])
@pytest.mark.parametrize("shape", [(1, 2, 57, 61, 8), (3, 1, 7, 5, 16), (2, 3, 1, 1, 8), (1, 2, 9, 19, 16)])
def test_blocked_global_average_pool_alone(shape, partials):
    """GlobalAveragePoolNCHWc's kernel against its reference: odd planes, a large one (float32
    sums over 3477 pixels, values offset from zero), batch > 1, a one-pixel plane; one sum per
    vector or pool.partials of them (row widths not a multiple: the last group guarded)."""
    n, cb, h, w, blk = shape
    text = (f'graph "g" (%x: float32[{n},{cb},{h},{w},{blk}]) -> (%y)\n  opsets {{"": 17, "kiln": 1}}\n{{\n'
            f'  %y: float32[{n},{cb},1,1,{blk}] = "kiln"::GlobalAveragePoolNCHWc(%x) name "gap"\n}}')
    g = graph(text)
    x = (np.random.default_rng(3).standard_normal(shape) + 5).astype(F)
    want = Interpreter(g).run([x])[0]
    np.testing.assert_allclose(want, x.astype(np.float64).mean(axis=(2, 3), keepdims=True), rtol=1e-5)
    got = kiln.compile(g, target="cpu", opt_level=0, decisions={"pool.partials": partials}).run({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_global_average_sums_a_row_in_partial_sums():
    """A plane's rows summed into pool.partials vectors at once (4 by default: independent adds,
    where one sum waits on its previous add for every pixel; EfficientNet-B0's 16 squeeze-excite
    pools one thread 0.223 -> 0.190 ms), kept in registers; rows too short for two per partial
    sum, or pool.partials 1, take one."""
    from kiln.compiler import run_stages

    def source(w, **decisions):
        text = (f'graph "g" (%x: float32[1,3,5,{w},16]) -> (%y)\n  opsets {{"": 17, "kiln": 1}}\n{{\n'
                f'  %y: float32[1,3,1,1,16] = "kiln"::GlobalAveragePoolNCHWc(%x) name "gap"\n}}')
        return run_stages(graph(text), "c", opt_level=0, cpu="x86-64-v4", decisions=decisions).source.text
    assert "gsum_rf[64]" in source(56) and "gsum_rf[32]" in source(56, **{"pool.partials": 2})
    assert "gsum_rf" not in source(7) and "gsum_rf" not in source(56, **{"pool.partials": 1})


def test_one_pixel_pointwise_conv_forks_for_its_weights():
    """A squeeze-excite block's 1x1 conv on one pixel does little arithmetic per weight it reads
    (960 -> 240: 230K weights, ~30 us one thread): it forks where threads spin between kernels
    (a fork ~2 us), not where they sleep (a wake-up ~20 us, more than the half it saves), and
    either way computes the reference."""
    from dataclasses import replace
    from kiln.stages import stage_text
    from kiln.targets.target import Target
    g = conv_case(n=1, c=960, h=1, oc=240, k=1)
    blocked = g.clone()
    transform(blocked, 16, selective=False)
    spin = replace(Target.named("x86-64-v4"), omp_wait_policy="PASSIVE", omp_spincount="10000",
                   threads_impl="omp")
    sleep = replace(spin, omp_spincount="0")

    def forks(target):
        text = stage_text(blocked, "c", None, opt_level=0, cpu=target)
        conv = text[text.index(next(line for line in text.splitlines()
                                    if "ConvNCHWc(" in line and line.endswith("{"))):]
        body = conv[:conv.index("\n}\n")]
        return "omp parallel" in body or "kiln_pool_for(" in body   # (OpenMP's team or kiln's pool)
    assert forks(spin) and not forks(sleep)
    xs = random_inputs(g, 1)
    got = kiln.compile(blocked, target="cpu", opt_level=0).run({"x": xs[0]})["y"]
    np.testing.assert_allclose(got, Interpreter(g).run(xs)[0], rtol=1e-4, atol=1e-4)


def test_keeps_bytes_only_where_no_element_moves():
    """ToNCHWc / FromNCHWc need no kernel where every element stays at its offset: blocks of
    one channel, or one pixel with whole blocks; a channel tail (padding), a real plane, a
    symbolic plane or another op each need one."""
    from kiln.graph.types import TensorType as T
    from kiln.ops.layout import keeps_bytes
    f = kiln.dtypes.DType.float32
    assert keeps_bytes("ToNCHWc", T(f, ("n", 1, 49, 10)), T(f, ("n", 1, 49, 10, 1)))
    assert keeps_bytes("ToNCHWc", T(f, (2, 5, 7, 3)), T(f, (2, 5, 7, 3, 1)))
    assert keeps_bytes("FromNCHWc", T(f, (8, 4, 1, 1, 16)), T(f, (8, 64, 1, 1)))
    assert keeps_bytes("ToNCHWc", T(f, (3, 32, 1, 1)), T(f, (3, 4, 1, 1, 8)))
    assert not keeps_bytes("FromNCHWc", T(f, (8, 4, 1, 1, 16)), T(f, (8, 60, 1, 1)))     # padded tail
    assert not keeps_bytes("FromNCHWc", T(f, (1, 2, 7, 7, 16)), T(f, (1, 32, 7, 7)))      # a plane
    assert not keeps_bytes("ToNCHWc", T(f, (1, 3, 9, 9)), T(f, (1, 1, 9, 9, 3)))          # channels-last stem
    assert not keeps_bytes("ToNCHWc", T(f, (1, 16, "h", 1)), T(f, (1, 1, "h", 1, 16)))    # symbolic plane
    assert not keeps_bytes("ConvNCHWc", T(f, (1, 1, 1, 1, 16)), T(f, (1, 1, 1, 1, 16)))


@pytest.mark.parametrize("c,oc,n", [(1, 32, 2), (1, 12, 3), (3, 16, 1)])
def test_conversions_that_move_nothing_run_no_kernel(c, oc, n):
    """A one-channel input blocked as NCHW1c is the same bytes as its NCHW form: the compiled model
    runs no conversion kernel for it (a channels-last stem still gets one); a global pool's one
    pixel flattened into a classifier is read blocked (the weights' rows in the blocked order,
    zero for a padded tail): no conversion at all. Both match the reference."""
    h, classes = 9, 5
    body = (conv_text("x", "c", c, oc, 3, p=1).replace("{c}", f"{n},{oc},{h},{h}")
            + f'  %r: float32[{n},{oc},{h},{h}] = Relu(%c) name "relu"\n'
            + f'  %p: float32[{n},{oc},1,1] = GlobalAveragePool(%r) name "gap"\n'
            + f'  %f: float32[{n},{oc}] = Flatten(%p) name "flat"\n'
            + f'  %y: float32[{n},{classes}] = Gemm(%f, %w_fc) {{transB = 1}} name "fc"')
    g = graph(prog(f"(%x: float32[{n},{c},{h},{h}]) -> (%y)", body),
              w_conv=R(oc, c, 3, 3), b_conv=R(oc), w_fc=R(classes, oc))
    blocked = g.clone()
    assert transform(blocked, 16, selective=False, override="direct").get("Conv")
    ops = [n_.op for n_ in blocked.nodes]
    assert "ToNCHWc" in ops and "FromNCHWc" not in ops and "GlobalAveragePoolNCHWc" in ops, ops
    xs = random_inputs(g, 2)
    m = kiln.compile(blocked, target="cpu", opt_level=0)
    kernels = " ".join(what for what, _ in m.profile({"x": xs[0]}, runs=1))
    assert ("ToNCHWc" in kernels) == (c != 1), kernels
    assert "FromNCHWc" not in kernels, kernels
    np.testing.assert_allclose(m.run({"x": xs[0]})["y"], Interpreter(g).run(xs)[0], rtol=1e-4, atol=1e-4)


def test_global_average_pool_forks_by_its_summing_rate():
    """A blocked global average pool adds one vector per vector it reads (~12e3 elements a us
    on one thread): a squeeze-excite pool of 480 x 14 x 14 (~8 us) stays serial where threads
    sleep between kernels (a wake-up ~20 us), a 64 x 112 x 112 one (~67 us) forks; both give
    the reference."""
    from dataclasses import replace
    from kiln.stages import stage_text
    from kiln.targets.target import Target
    sleep = replace(Target.named("x86-64-v4"), omp_wait_policy="PASSIVE", omp_spincount="0", threads_impl="omp")
    for c, h, forks in ((480, 14, False), (64, 112, True)):
        body = (conv_text("x", "c", c, c, 1).replace("{c}", f"1,{c},{h},{h}")
                + f'  %y: float32[1,{c},1,1] = GlobalAveragePool(%c) name "gap"')
        g = graph(prog(f"(%x: float32[1,{c},{h},{h}]) -> (%y)", body), w_conv=R(c, c, 1, 1), b_conv=R(c))
        blocked = g.clone()
        transform(blocked, 16, selective=False, override="direct")
        assert "GlobalAveragePoolNCHWc" in [n_.op for n_ in blocked.nodes]
        text = stage_text(blocked, "c", None, opt_level=0, cpu=sleep)
        pool = text[text.index(next(line for line in text.splitlines()
                                    if "GlobalAveragePoolNCHWc(" in line and line.endswith("{"))):]
        body = pool[:pool.index("\n}\n")]
        assert ("omp parallel" in body or "kiln_pool_for(" in body) == forks, (c, h)
        xs = random_inputs(g, 1)
        got = kiln.compile(blocked, target="cpu", opt_level=0).run({"x": xs[0]})["y"]
        np.testing.assert_allclose(got, Interpreter(g).run(xs)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("c,oc,cpu", [(24, 72, None), (40, 24, None), (12, 20, "x86-64-v3")])
def test_narrow_pointwise_convs_with_symbolic_batch(c, oc, cpu):
    """1x1 convs whose last input block is at most half used sum over the used channels only
    (kiln.lower.nchwc._narrow_sum: one axis k over them, block k // ib, lane k % ib), at every
    batch of one shape-generic module: c -> oc -> Relu -> c."""
    from onnx import TensorProto, helper, numpy_helper
    from kiln.lower.nchwc import _narrow_sum, summed_channels
    from kiln.ops.layout import pack_conv_weight
    rng = np.random.default_rng(c)
    w, b = rng.standard_normal((oc, c, 1, 1)).astype(F), rng.standard_normal(oc).astype(F)
    w2 = rng.standard_normal((c, oc, 1, 1)).astype(F)
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("Relu", ["c"], ["r"]),
         helper.make_node("Conv", ["r", "w2"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", c, 6, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    lanes = kiln.targets.target.Target.host().vector_lanes(4) if cpu is None else 8
    packed = pack_conv_weight(w, lanes, False, lanes)
    assert summed_channels(packed) == c
    geom = BlockedGeom(n=1, icb=packed.shape[1], h=6, w=5, ib=lanes, ocb=packed.shape[0], icbg=packed.shape[1],
                       kernel=[1, 1], ob=lanes, strides=[1, 1], dil=[1, 1], begin=[0, 0], out=[6, 5],
                       depthwise=False)
    padded = packed.shape[1] * lanes
    narrow = c % lanes and c % lanes <= lanes // 2 and (padded - c) * 8 >= padded
    assert _narrow_sum(geom, packed, 8) == (c if narrow else None)
    assert _narrow_sum(geom, packed, 14) is None
    m = kiln.compile(model, cpu=cpu, shapes="generic")
    for n in (1, 3):
        x = rng.standard_normal((n, c, 6, 5)).astype(F)
        r = np.maximum(np.einsum("nchw,oc->nohw", x, w[:, :, 0, 0]) + b[None, :, None, None], 0)
        want = np.einsum("nchw,oc->nohw", r, w2[:, :, 0, 0])
        np.testing.assert_allclose(m.run({"x": x})["y"], want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))



@pytest.mark.parametrize("ahead", [1, 2])
@pytest.mark.parametrize("case", ["1x1", "1x1_stride2_nobias", "3x3_stride2_residual", "channels_not_multiple",
                                  "1x1_few_outputs_relu"])
def test_input_hints_keep_the_result(case, ahead):
    """nchwc.prefetch_input: a dense tile's hints of the input it reads `ahead` input blocks later
    read and write nothing (the last blocks' point past the input), padded input or not."""
    blocked_direct_matches_reference(case, {"nchwc.prefetch_input": ahead})


def test_input_hint_rule_and_kernel():
    """A dense 1x1 conv of two input blocks or more hints the next block's input lines, one per
    column of its register tile, at each input block (prefetch_input); not a 3x3 (the stem got
    slower), a depthwise or grouped conv, or one input block."""
    from kiln.compiler import run_stages
    from kiln.lower.nchwc import prefetch_input
    from kiln.targets.target import Target

    def geom(c, oc, k=1, dw=False, groups=1):
        return BlockedGeom(4, c // 16, 14, 14, 16, oc // 16, 1 if dw else c // 16 // groups, [k, k], 16, [1, 1],
                           [1, 1], [k // 2] * 2, [14, 14], dw, groups)
    assert prefetch_input(geom(1024, 512)) == 1 and prefetch_input(geom(64, 256)) == 1
    assert prefetch_input(geom(16, 64)) == 0
    assert prefetch_input(geom(512, 512, k=3)) == 0
    assert prefetch_input(geom(512, 512, k=3, dw=True)) == 0
    assert prefetch_input(geom(512, 512, groups=2)) == 0
    g = conv_case(n=1, c=64, h=7, oc=32, k=1)        # 4 input blocks of 8, 7 columns
    blocked = g.clone()
    transform(blocked, 8, selective=False, override="direct")
    one = Target.named("x86-64-v4", cores=1)

    def input_hints(**decisions):       # (a 7-column tile: a hint per column, the next block's)
        src = run_stages(blocked, "c", cpu=one, decisions={"nchwc.reg_w": 7, **decisions}).source.text
        return [ln.strip() for ln in src.splitlines() if "__builtin_prefetch(&b0_" in ln]
    got = input_hints()
    assert len(got) == 7 and all("v9_icb * 392" in ln or "icb * 392" in ln for ln in got)
    assert sorted(int(re.search(r" \+ (\d+)\)\], 0, 3\);$", ln).group(1)) for ln in got) == [392 + 8 * k for k in range(7)]
    assert input_hints(**{"nchwc.prefetch_input": 0}) == []
