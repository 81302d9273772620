"""Winograd F(4x4, 3x3) (kiln.ops.winograd, kiln.lower.winograd) and the conv algorithm
chooser (kiln.lower.conv_algo): transforms exact, the native kernel against the direct
convolution on random shapes, its error within the stated bound, the chooser's rule and
its overrides."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.compiler import run_stages
from kiln.errors import KilnError
from kiln.lower.conv_algo import ConvShape, choose, winograd_m
from kiln.lower.winograd import STREAM_MIN_TILES, plan
from kiln.ops.nn import Window, conv_core
from kiln.ops.winograd import matrices, transform_weight, winograd_conv
from kiln.passes.layout import worth_blocking
from kiln.targets.target import Target
from tests.helpers import examples

F = TensorProto.FLOAT
# The stated bound (kiln.ops.winograd): F(4x4, 3x3) in float32 against the direct convolution
# computed in float64, max |error| / max |direct output|. Measured on the corpus CNNs' 68 3x3
# stride-1 convs (resnet50, unet, dbnet_resnet18, yolov5s_style, crnn; their own weights, BN
# folded, ReLU'd normal inputs) with benchmarks/winograd_error.py: at most 1.35e-5 (the float32
# direct convolution: 6.3e-7). So it passes rtol 1e-3 against direct with an atol of 2e-5 of
# the output's largest value, asserted here:
WINOGRAD_ERROR_BOUND = 2e-5


def direct(x, w, pads, b=None):
    """The direct convolution in float64 (the reference Winograd is held to)."""
    win = Window([3, 3], [1, 1], [1, 1], [pads[0], pads[1]], [pads[2], pads[3]],
                 [x.shape[2] + pads[0] + pads[2] - 2, x.shape[3] + pads[1] + pads[3] - 2], [0, 0])
    y = conv_core(None, x.astype(np.float64), w.astype(np.float64), 1, win)
    return y if b is None else y + b.astype(np.float64).reshape(1, -1, 1, 1)


def rel_error(got, want) -> float:
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))


@pytest.mark.parametrize("m", [2, 4, 6])
def test_transforms_compute_the_correlation_exactly(m):
    at, g, bt = matrices(m)
    rng = np.random.default_rng(m)
    d, f = rng.standard_normal(m + 2), rng.standard_normal(3)
    want = np.correlate(d, f, mode="valid")
    np.testing.assert_allclose(at @ ((g @ f) * (bt @ d)), want, rtol=1e-12, atol=1e-12)


def test_f4_matrices_are_lavins():
    at, g, bt = matrices(4)
    np.testing.assert_array_equal(bt[0], [4, 0, -5, 0, 1, 0])
    np.testing.assert_array_equal(bt[5], [0, 4, 0, -5, 0, 1])
    np.testing.assert_array_equal(at[3], [0, 1, -1, 8, -8, 1])
    np.testing.assert_allclose(g[1], [-1 / 6] * 3)


@pytest.mark.parametrize("m", [2, 4, 6])
def test_reference_in_float64_equals_direct(m):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 5, 9, 7))
    w = rng.standard_normal((6, 5, 3, 3))
    pads = [1, 0, 2, 1]
    u = transform_weight(w, 4, m, np.float64)               # [n^2, OCB, ICp, 4]
    t2, ocb, icp, ob = u.shape
    u = u.transpose(0, 1, 3, 2).reshape(t2, ocb * ob, icp)
    got = winograd_conv(np.pad(x, ((0, 0), (0, icp - 5), (0, 0), (0, 0))), u, pads, m)[:, :6]
    np.testing.assert_allclose(got, direct(x, w, pads), rtol=1e-10, atol=1e-10)


def conv_model(n, c, oc, h, w, pads, bias, relu=False, seed=0, batch_dim=None, silu=False):
    rng = np.random.default_rng(seed)
    wt = (rng.standard_normal((oc, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    inits = [numpy_helper.from_array(wt, "w")]
    ins = ["x", "w"]
    if bias:
        bv = rng.standard_normal(oc).astype(np.float32)
        inits.append(numpy_helper.from_array(bv, "b"))
        ins.append("b")
    nodes = [helper.make_node("Conv", ins, ["c" if relu or silu else "y"], name="conv3", pads=list(pads))]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["y"], name="relu"))
    if silu:            # as exporters write SiLU: x * Sigmoid(x) (kiln.passes.algebraic makes it a Swish)
        nodes += [helper.make_node("Sigmoid", ["c"], ["s"], name="sigmoid"),
                  helper.make_node("Mul", ["c", "s"], ["y"], name="silu")]
    oh, ow = h + pads[0] + pads[2] - 2, w + pads[1] + pads[3] - 2
    nb = batch_dim or n
    g = helper.make_graph(nodes, "wino", [helper.make_tensor_value_info("x", F, [nb, c, h, w])],
                          [helper.make_tensor_value_info("y", F, [nb, oc, oh, ow])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), wt, \
        (bv if bias else None)


def ops_of(model, **kw):
    return [n.op for n in run_stages(model, "optimized", **kw).optimized.graph.nodes]


WINO = {"conv.algorithm": "winograd"}


BLOCK = Target.host().vector_lanes(4)


# channel counts that fill blocks of 4, 8 or 16 well but are no multiple of them (and some that are)
CHANNELS = st.sampled_from([6, 7, 8, 12, 13, 16, 20, 23, 24, 30, 32, 40])


@examples(12)
def test_native_winograd_matches_direct_on_random_shapes(examples):
    settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])(
        given(n=st.integers(1, 2), c=CHANNELS, oc=CHANNELS, h=st.integers(1, 13),
              w=st.integers(1, 13), pads=st.lists(st.integers(0, 2), min_size=4, max_size=4),
              bias=st.booleans(), relu=st.booleans(), m=st.none())(_native_matches_direct))()


@examples(10)
def test_native_f2x2_matches_direct_on_random_shapes(examples):
    """The kernel's F(2x2, 3x3) (kiln.lower.conv_algo.winograd_m, asked for here): 2x2 output
    tiles from 4x4 input tiles, 16 GEMMs."""
    settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])(
        given(n=st.integers(1, 2), c=CHANNELS, oc=CHANNELS, h=st.integers(1, 11),
              w=st.integers(1, 11), pads=st.lists(st.integers(0, 2), min_size=4, max_size=4),
              bias=st.booleans(), relu=st.booleans(), m=st.just(2))(_native_matches_direct))()


def _native_matches_direct(n, c, oc, h, w, pads, bias, relu, m):
    # channels the layout pass blocks (whole blocks or a few padding ones: 7, 13, 30, ...),
    # odd sizes, asymmetric pads, batch > 1
    assume(h + pads[0] + pads[2] >= 3 and w + pads[1] + pads[3] >= 3)
    assume(worth_blocking(c, BLOCK) and worth_blocking(oc, BLOCK))
    model, wt, bv = conv_model(n, c, oc, h, w, pads, bias, relu)
    asked = WINO if m is None else {**WINO, "conv.winograd_m": m}
    nodes = run_stages(model, "optimized", decisions=asked).optimized.graph.nodes
    tiles = [nd.attrs["m"] for nd in nodes if nd.op == "ConvWinograd"]
    assert len(tiles) == 1 and (m is None or tiles == [m])
    x = np.random.default_rng(7).standard_normal((n, c, h, w)).astype(np.float32)
    want = direct(x, wt, pads, bv)
    if relu:
        want = np.maximum(want, 0)
    got = kiln.compile(model, decisions=asked).run(x=x)["y"]
    interp = kiln.compile(model, target="interpreter").run(x=x)["y"]
    assert rel_error(got, want) < WINOGRAD_ERROR_BOUND
    np.testing.assert_allclose(got, interp, rtol=1e-3, atol=1e-3 * np.max(np.abs(want)))


def test_error_within_the_stated_bound_at_cnn_widths():
    # a trained CNN's 3x3 conv: 128 channels in and out, an odd 23x23 plane, ReLU'd inputs
    model, wt, bv = conv_model(1, 128, 128, 23, 23, [1, 1, 1, 1], True, seed=3)
    x = np.maximum(np.random.default_rng(8).standard_normal((1, 128, 23, 23)), 0).astype(np.float32)
    assert "ConvWinograd" in ops_of(model, decisions=WINO)
    got = kiln.compile(model, decisions=WINO).run(x=x)["y"]
    want = direct(x, wt, [1, 1, 1, 1], bv)
    assert rel_error(got, want) < WINOGRAD_ERROR_BOUND
    # and as rtol 1e-3 against the direct float32 conv (kiln's own, chosen by the override)
    plain = kiln.compile(model, decisions={"conv.algorithm": "direct"}).run(x=x)["y"]
    np.testing.assert_allclose(got, plain, rtol=1e-3, atol=1e-3 * np.max(np.abs(plain)))


def test_symbolic_batch_runs_winograd_per_shape():
    model, wt, bv = conv_model(1, 16, 24, 10, 9, [1, 1, 1, 1], True, batch_dim="N")
    m = kiln.compile(model, decisions=WINO)
    for n in (1, 3):
        x = np.random.default_rng(n).standard_normal((n, 16, 10, 9)).astype(np.float32)
        assert rel_error(m.run(x=x)["y"], direct(x, wt, [1, 1, 1, 1], bv)) < WINOGRAD_ERROR_BOUND
    spec = run_stages(model, "partition", dims={"N": 2}, decisions=WINO).specialized
    assert "ConvWinograd" in [n.op for n in spec.graph.nodes]


def shape(c, oc, hw, k=3, s=1, group=1, n=1, blockable=True):
    o = (hw + 2 * (k // 2) - k) // s + 1
    return ConvShape(n, c, oc, (o, o), (k, k), (s, s), (1, 1), group, blockable, 8,
                     blocked_kind=blockable and (k == 1 or group > 1 or s > 1))


@pytest.mark.parametrize("s, algorithm", [
    (shape(64, 64, 56), "winograd"),                 # ResNet's first stage
    (shape(256, 256, 14), "winograd"),
    (shape(256, 256, 4), "direct-nchw"),             # 1 tile: the weights dominate
    (shape(8, 8, 56), "direct-nchw"),                # few channels: the transforms dominate
    (shape(64, 64, 5), "direct-nchw"),               # 5x5: the 8x8 tiles waste most
    (shape(64, 128, 56, s=2), "direct-nchwc"),       # strided: blocked direct
    (shape(64, 64, 56, k=1), "direct-nchwc"),        # pointwise
    (shape(64, 64, 56, group=64), "direct-nchwc"),   # depthwise
    (shape(64, 64, 56, blockable=False), "direct-nchw"),
])
def test_chooser_rule_and_reason(s, algorithm):
    c = choose(s, Target.host())
    assert c.algorithm == algorithm and c.reason


def test_chooser_weighs_winogards_weight_stream_against_direct_on_the_cores():
    """At the Sapphire Rapids VM's 3.2e3 floats per us a core, U streamed on the cores against the
    direct conv's multiply-adds on them: 512 -> 512 on 7x7 at batch 1 runs direct (49 pixels),
    on 10x10 (100) or at batch 2 Winograd; the cores split both, so their count changes nothing."""
    two, one = (Target.named("host", cores=k, stream_rate_measured=3.2e3) for k in (2, 1))
    c = choose(shape(512, 512, 7), two)
    assert c.algorithm == "direct-nchwc" and "stream on 2 cores" in c.reason and "~1475 us" in c.reason
    assert choose(shape(512, 512, 7), one).algorithm == "direct-nchwc"
    for s in (shape(512, 512, 10), shape(512, 512, 7, n=2), shape(256, 256, 14)):
        assert choose(s, two).algorithm == choose(s, one).algorithm == "winograd"
    assert choose(dataclasses.replace(shape(512, 512, 7), per_image=True), two).algorithm == "winograd"
    # a core that streams faster (the table's 7e3 floats per us) takes Winograd at 7x7 too
    assert choose(shape(512, 512, 7), Target.named("host", cores=2, stream_rate_measured=7e3)).algorithm == "winograd"


def test_the_output_tile_weighs_the_weights_stream_against_the_multiply_adds():
    """F(2x2, 3x3) where F(4x4)'s 4x weights take longer to stream than its fewer multiply-adds
    save (kiln.lower.conv_algo.winograd_us): ResNet's 256 -> 256 on 14x14 at batch 1 on 2 cores
    streaming 3.2e3 floats per us (this Sapphire Rapids VM), not where the weights stream fast,
    nor at 28x28 or 56x56, nor for a symbolic batch."""
    slow, fast = (Target.named("host", cores=2, stream_rate_measured=r) for r in (3.2e3, 1e6))
    s = shape(256, 256, 14)
    assert winograd_m(s, slow) == 2 and "F(2x2,3x3), 2.2x fewer multiplies" in choose(s, slow).reason
    assert winograd_m(s, fast) == 4 and "F(4x4,3x3), 3.1x fewer multiplies" in choose(s, fast).reason
    assert winograd_m(shape(128, 128, 28), slow) == winograd_m(shape(64, 64, 56), slow) == 4
    assert winograd_m(dataclasses.replace(s, per_image=True), slow) == 4
    assert winograd_m(s, fast, {"conv.winograd_m": 2}) == 2 and winograd_m(s, slow, {"conv.winograd_m": 4}) == 4
    with pytest.raises(KilnError, match="illegal value 6 for decision 'conv.winograd_m'"):
        winograd_m(s, slow, {"conv.winograd_m": 6})


def test_the_layout_pass_gives_the_kernel_its_output_tile():
    model, wt, bv = conv_model(1, 256, 256, 14, 14, [1, 1, 1, 1], True, relu=True, seed=2)
    x = np.random.default_rng(2).standard_normal((1, 256, 14, 14)).astype(np.float32)
    want = np.maximum(direct(x, wt, [1, 1, 1, 1], bv), 0)
    for rate, m in ((3.2e3, 2), (1e6, 4)):
        cpu = Target.named("host", cores=2, stream_rate_measured=rate)
        nodes = run_stages(model, "optimized", cpu=cpu).optimized.graph.nodes
        assert [(nd.attrs["m"], nd.inputs[1].type.shape[0]) for nd in nodes if nd.op == "ConvWinograd"] == \
            [(m, (m + 2) ** 2)]
        got = kiln.compile(model, cpu=cpu).run(x=x)["y"]
        assert rel_error(got, want) < WINOGRAD_ERROR_BOUND


def test_chooser_override():
    assert choose(shape(8, 8, 56), Target.host(), "winograd").algorithm == "winograd"
    assert choose(shape(64, 64, 56), Target.host(), "direct").algorithm == "direct-nchw"
    c = choose(shape(64, 64, 56, s=2), Target.host(), "winograd")   # cannot: stays direct, says why
    assert c.algorithm == "direct-nchwc" and "strided" in c.reason


def test_override_by_decision_and_environment(monkeypatch):
    model, _, _ = conv_model(1, 64, 64, 24, 24, [1, 1, 1, 1], True)
    assert "ConvWinograd" in ops_of(model)                                   # the rule
    assert "ConvWinograd" not in ops_of(model, decisions={"conv.algorithm": "direct"})
    monkeypatch.setenv("KILN_CONV_ALGO", "direct")
    assert "ConvWinograd" not in ops_of(model)
    assert "ConvWinograd" in ops_of(model, decisions=WINO)                    # the decision wins
    monkeypatch.setenv("KILN_CONV_ALGO", "fft")
    with pytest.raises(KilnError, match="conv.algorithm"):
        ops_of(model)
    monkeypatch.delenv("KILN_CONV_ALGO")
    with pytest.raises(KilnError, match="conv.algorithm"):
        kiln.compile(model, decisions={"conv.algorithm": "fft"})


def test_relu_runs_in_the_output_transform():
    model, wt, bv = conv_model(2, 40, 36, 11, 14, [1, 1, 1, 1], True, relu=True)
    ops = ops_of(model, decisions=WINO)
    assert "ConvWinograd" in ops and "Relu" not in ops
    x = np.random.default_rng(5).standard_normal((2, 40, 11, 14)).astype(np.float32)
    want = np.maximum(direct(x, wt, [1, 1, 1, 1], bv), 0)
    assert rel_error(kiln.compile(model, decisions=WINO).run(x=x)["y"], want) < WINOGRAD_ERROR_BOUND


@pytest.mark.parametrize("n,batch_dim,target", [(1, None, "cpu"), (2, None, "cpu"), (3, "batch", "cpu"),
                                                 (2, None, "interpreter")])
def test_silu_runs_in_the_output_transform(n, batch_dim, target):
    """A SiLU (Swish) that is the conv's only reader is the kernel's activation: one kernel, the
    direct convolution's result (float64) through x * sigmoid(x)."""
    model, wt, bv = conv_model(n, 24, 40, 13, 10, [1, 1, 1, 1], True, seed=n, batch_dim=batch_dim, silu=True)
    ops = ops_of(model, decisions=WINO)
    assert "ConvWinograd" in ops and not {"Swish", "Sigmoid", "Mul"} & set(ops)
    x = np.random.default_rng(n).standard_normal((n, 24, 13, 10)).astype(np.float32)
    c = direct(x, wt, [1, 1, 1, 1], bv)
    got = kiln.compile(model, target=target, decisions=WINO).run(x=x)["y"]
    assert rel_error(got, c / (1 + np.exp(-c))) < WINOGRAD_ERROR_BOUND


def test_a_conv_read_by_more_than_its_silu_keeps_the_silu_apart():
    model, wt, bv = conv_model(1, 16, 16, 9, 9, [1, 1, 1, 1], True, silu=True)
    g = model.graph
    g.output.append(helper.make_tensor_value_info("c", F, [1, 16, 9, 9]))     # the conv's output read twice
    ops = ops_of(model, decisions=WINO)
    assert "ConvWinograd" in ops and "Swish" in ops
    x = np.random.default_rng(3).standard_normal((1, 16, 9, 9)).astype(np.float32)
    out = kiln.compile(model, decisions=WINO).run(x=x)
    c = direct(x, wt, [1, 1, 1, 1], bv)
    assert rel_error(out["c"], c) < WINOGRAD_ERROR_BOUND
    assert rel_error(out["y"], c / (1 + np.exp(-c))) < WINOGRAD_ERROR_BOUND


def test_report_lists_each_conv_with_its_algorithm():
    model, _, _ = conv_model(1, 64, 64, 24, 24, [1, 1, 1, 1], True)
    r = kiln.compile(model, report=True).report
    (c,) = r.convs
    assert c.node == "conv3" and c.choice.algorithm == "winograd" and "tiles" in c.choice.reason
    assert "conv 'conv3' [3x3 64->64 out 1x24x24]: winograd" in str(r)


@examples(6, fast=2)
def test_plan_decisions_replay_against_the_reference(examples):
    """The tuner's knobs (winograd.tr / .ov / .chunk_blocks / .osplit: kiln.lower.winograd.decided)
    give the direct convolution's result whatever their values."""
    settings(max_examples=examples, deadline=None)(
        given(n=st.integers(1, 2), h=st.integers(4, 17), tr=st.integers(1, 12), ov=st.sampled_from([1, 2, 4]),
              blocks=st.integers(1, 6), osplit=st.integers(1, 2))(_plan_replays))()


def _plan_replays(n, h, tr, ov, blocks, osplit):
    model, wt, bv = conv_model(n, 64, 64, h, h + 3, [1, 1, 1, 1], True, relu=True, seed=h)
    x = np.random.default_rng(h).standard_normal((n, 64, h, h + 3)).astype(np.float32)
    ocb = -(-64 // BLOCK)
    asked = {**WINO, "winograd.tr": tr, "winograd.ov": ov if ocb % ov == 0 else 1, "winograd.chunk_blocks": blocks,
             "winograd.osplit": min(osplit, ocb // (ov if ocb % ov == 0 else 1))}
    got = kiln.compile(model, decisions=asked).run(x=x)["y"]
    want = np.maximum(direct(x, wt, [1, 1, 1, 1], bv), 0)
    assert rel_error(got, want) < WINOGRAD_ERROR_BOUND


@pytest.mark.parametrize("tr,blocks", [(2, 4), (5, 2), (4, 3)])
def test_a_short_last_chunk_computes_only_its_register_blocks(tr, blocks):
    """12 tiles (a 10x13 output) in chunks of T = tr x blocks: the last chunk's GEMMs stop at its
    tiles rounded up to whole register blocks (winograd_gemm.h), its other rows left unwritten."""
    model, wt, bv = conv_model(1, 32, 48, 10, 13, [1, 1, 1, 1], True, relu=True, seed=tr)
    x = np.random.default_rng(tr).standard_normal((1, 32, 10, 13)).astype(np.float32)
    asked = {**WINO, "winograd.tr": tr, "winograd.ov": 1, "winograd.chunk_blocks": blocks, "winograd.osplit": 1}
    got = kiln.compile(model, decisions=asked).run(x=x)["y"]
    assert rel_error(got, np.maximum(direct(x, wt, [1, 1, 1, 1], bv), 0)) < WINOGRAD_ERROR_BOUND


@pytest.mark.parametrize("m", [4, 2])
@pytest.mark.parametrize("osplit,blocks", [(2, 1), (4, 2), (3, 1)])
def test_parts_of_a_chunk_share_its_transformed_input(m, osplit, blocks):
    """A range of tasks transforms a chunk's input once for all the parts its output channels
    are cut into (winograd.c keeps vbuf while the next task is another part of the same chunk):
    2 images of 9x11 (3 x 3 F(4x4) tiles each, or 5 x 6 F(2x2)) in chunks of 2 or 4 tiles, the
    last short, and 2, 3 or 4 parts of the channel blocks, 3 uneven: 10 to 36 tasks in at most
    8 ranges (the pool's chunks; one range where the conv runs on one thread), so a range holds
    parts of one chunk and then the next chunk's (a range that skipped the next chunk's
    transform would compute it from the previous chunk's tiles); a thread's buffers are kept
    over the ranges it takes (kiln_wg_slot), so a range may start on the chunk its thread's
    previous range ended on (its transform kept) or on another (transformed again)."""
    model, wt, bv = conv_model(2, 24, 4 * BLOCK, 9, 11, [1, 1, 1, 1], True, relu=True, seed=osplit)
    x = np.random.default_rng(osplit).standard_normal((2, 24, 9, 11)).astype(np.float32)
    asked = {**WINO, "conv.winograd_m": m, "winograd.tr": 2, "winograd.ov": 1, "winograd.chunk_blocks": blocks,
             "winograd.osplit": osplit}
    assert "ConvWinograd" in ops_of(model, decisions=asked)
    got = kiln.compile(model, decisions=asked).run(x=x)["y"]
    assert rel_error(got, np.maximum(direct(x, wt, [1, 1, 1, 1], bv), 0)) < WINOGRAD_ERROR_BOUND


@pytest.mark.parametrize("n,c,oc,h", [(1, 64, 64, 56), (1, 128, 128, 28), (1, 256, 256, 14), (1, 512, 512, 7),
                                      (4, 256, 256, 14), (1, 32, 32, 160), (3, 48, 80, 9)])
def test_plan_chunks_cover_the_tiles_in_register_blocks(n, c, oc, h):
    target = Target.host()
    lanes = target.vector_lanes(4)
    icb, ocb = -(-c // lanes), -(-oc // lanes)
    tr, ov, t, osplit = plan(n, icb, ocb, h, h, lanes, target)
    tiles = n * (-(-h // 4)) ** 2
    assert t % tr == 0 and ocb % ov == 0 and 1 <= osplit <= ocb // ov
    assert t <= -(-tiles // tr) * tr                 # no chunk longer than all the tiles
    nchunk = -(-tiles // t)
    assert tiles - (nchunk - 1) * t > 0              # the last chunk is not empty
    buffers = 36 * (icb + ov) * lanes * 4 * t        # the chunk's transformed input and GEMM output
    if 36 * icb * ocb * lanes * lanes * 4 <= target.l2_bytes:      # weights stay in L2: small chunks
        assert t == tr or buffers <= target.l2_bytes // 4
    else:                                            # weights stream once per chunk: few, long chunks
        assert nchunk == 1 or t + tr > STREAM_MIN_TILES    # (chunks evened out in register blocks)


def test_chunks_uneven_over_the_threads_are_evened_out_by_parts():
    """balanced_osplit: 4 images of 28x28 x 128 (196 F(4x4) tiles; the transformed weights stream
    past a 2 MiB L2: chunks of 36, the last of 16) left 108 tiles on one of 2 threads and 88 on
    the other; cut in 2 parts, each thread's share is 98 tiles' GEMMs plus the transforms (and
    64 tiles in chunks of 18, 18, 18, 10: 32 each, modelled below). Chunks that split evenly
    keep their one part (56x56 x 64, 8 images: 1568 tiles), and so does one thread."""
    from kiln.lower.winograd import balanced_osplit
    from kiln.runtime.threads import pool_chunks, pool_span
    t = Target.named("x86-64-v4", l2_bytes=2 << 20, cores=2)
    assert plan(4, 8, 8, 28, 28, 16, t) == (6, 4, 36, 2)
    assert plan(4, 8, 8, 28, 28, 16, dataclasses.replace(t, cores=1))[3] == 1
    assert plan(8, 4, 4, 56, 56, 16, t)[3] == 1

    def span(tiles, size, parts, cores=2):      # every task's GEMMs, each its own transform
        tasks = [min(size, tiles - c * size) * (1 / parts + 14 / 256) for c in range(-(-tiles // size))
                 for _ in range(parts)]
        return pool_span([sum(tasks[lo:hi]) for lo, hi in pool_chunks(len(tasks), cores)], cores)
    assert span(64, 18, 2) < 0.95 * span(64, 18, 1)
    assert balanced_osplit(64, 18, 4, 1, 2, 14 / 256) == 2
    assert balanced_osplit(64, 18, 4, 1, 1, 14 / 256) == 1
    assert balanced_osplit(64, 16, 4, 1, 2, 14 / 256) == 1     # 4 chunks of 16: even already


def test_weights_of_two_l2s_stream_once_in_one_chunk_of_up_to_two_l2s():
    """ONE_CHUNK_L2: 4 images of 14x14 x 256 (9.4 MB of F(4x4) weights, 64 tiles, 2.9 MB of
    transform buffers) go in one chunk (the weights stream once, not 4 times), cut in 4 parts for
    2 threads; 128 channels (2.4 MB of weights) keep chunks of half of L2, as do buffers past 2
    L2s (8 images)."""
    t = Target.named("x86-64-v4", l2_bytes=2 << 20, cores=2)
    assert plan(4, 16, 16, 14, 14, 16, t) == (6, 4, 66, 4)
    assert plan(1, 8, 8, 40, 40, 16, t)[2] == 36          # 100 tiles of 128 channels: 5 chunks
    assert plan(8, 16, 16, 14, 14, 16, t)[2] == 18         # 128 tiles: 5.9 MB of buffers


def test_an_illegal_plan_is_an_error_naming_it():
    model, _, _ = conv_model(1, 48, 48, 12, 12, [1, 1, 1, 1], True)
    ocb = -(-48 // BLOCK)
    bad_ov = next(v for v in (2, 3, 4) if ocb % v)
    with pytest.raises(KilnError, match=rf"illegal value {bad_ov} for decision 'winograd.ov'.*divide"):
        kiln.compile(model, decisions={**WINO, "winograd.ov": bad_ov})


@pytest.mark.parametrize("pf", [0, 1, 256])
def test_weight_prefetch_keeps_the_result_and_is_in_the_gemm(pf):
    """winograd.prefetch: the GEMM asks for each transformed-weight stream that many floats
    ahead (winograd_gemm.h); by default PREFETCH_BYTES ahead where U exceeds L1 (64 -> 64
    channels: 36 x 64 x 64 x 4 bytes)."""
    model, wt, bv = conv_model(1, 64, 64, 10, 9, [1, 1, 1, 1], True, relu=True, seed=pf)
    x = np.random.default_rng(pf).standard_normal((1, 64, 10, 9)).astype(np.float32)
    asked = {**WINO, "winograd.prefetch": pf}
    c = run_stages(model, "c", decisions=asked).source.text
    assert "__builtin_prefetch(ut + (o * IC + ic) * L + PF" in c and f"#define KILN_WGG_PF {pf}\n" in c
    assert (f"_p{pf}_n_gemm" in c) == (pf > 0)      # (the next position's hints go with the stream's)
    got = kiln.compile(model, decisions=asked).run(x=x)["y"]
    assert rel_error(got, np.maximum(direct(x, wt, [1, 1, 1, 1], bv), 0)) < WINOGRAD_ERROR_BOUND


@pytest.mark.parametrize("nx", [0, 1])
def test_next_position_hints_keep_the_result_and_are_in_the_gemm(nx):
    """winograd.prefetch_next: each register block after a transform position's first hints one
    of the next position's weight blocks into L2 (winograd_gemm.h's KILN_WGG_NX); the result
    is the same. By default on where the weights stream (winograd.prefetch on)."""
    model, wt, bv = conv_model(1, 64, 64, 10, 9, [1, 1, 1, 1], True, relu=True, seed=3)
    x = np.random.default_rng(3).standard_normal((1, 64, 10, 9)).astype(np.float32)
    asked = {**WINO, "winograd.prefetch": 1, "winograd.prefetch_next": nx}
    c = run_stages(model, "c", decisions=asked).source.text
    assert "__builtin_prefetch(ut + (OCB * IC + (j0 / TR % OV) * IC + ic) * L, 0, 2)" in c
    assert f"#define KILN_WGG_NX {nx}\n" in c and ("_p1_n_gemm" in c) == bool(nx)
    got = kiln.compile(model, decisions=asked).run(x=x)["y"]
    assert rel_error(got, np.maximum(direct(x, wt, [1, 1, 1, 1], bv), 0)) < WINOGRAD_ERROR_BOUND


def test_weight_prefetch_rule():
    from kiln.lower.nchwc import PREFETCH_BYTES
    from kiln.lower.winograd import gemm_instance
    t = Target.named("x86-64-v4", l1d_bytes=48 << 10)
    assert gemm_instance("f", 16, 6, 4, 36 * 64 * 64 * 4, t)[0] == f"f_p{PREFETCH_BYTES // 4}_n_gemm"
    assert gemm_instance("f", 16, 6, 4, 36 * 16 * 16 * 4, t)[0] == "f_gemm"    # 36 KiB: stays in L1
    assert gemm_instance("f", 16, 6, 4)[0] == "f_gemm"                           # (1-D: none by default)
