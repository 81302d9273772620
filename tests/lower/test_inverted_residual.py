"""The fused inverted residual (kiln.passes.inverted_residual, kiln.ops.inverted_residual,
kiln.lower.inverted_residual): the native kernel against ONNX Runtime and the reference on
random blocks (channel counts that fill blocks or not, kernel 3 or 5, strides 1 and 2, odd
sizes, every activation, batch > 1, a symbolic batch), what the pass matches and refuses,
and the rule that chooses it."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import kiln
from benchmarks.inverted_residual import block_model
from kiln.compiler import run_stages
from kiln.lower.conv_algo import IR_MIN_L2_SHARE, IR_ROW_PASS_L2_SHARE, choose_inverted_residual
from kiln.lower.inverted_residual import made_channels, register_tiles, summed_channels
from kiln.targets.target import Target
from tests.helpers import examples

FUSED = {"conv.inverted_residual": "fused"}
ACTS = ["", "Relu", "Clip", "HardSwish", "SiLU"]


def ort_run(model: bytes, x):
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def specialized_nodes(model: bytes, dims=None, decisions=FUSED) -> list:
    return run_stages(model, "partition", dims=dims or {}, decisions=decisions).specialized.graph.nodes


def fused_ops(model: bytes, dims=None, decisions=FUSED) -> list[str]:
    return [n.op for n in specialized_nodes(model, dims, decisions)]


BLOCK = Target.host().vector_lanes(4)
CHANNELS = st.one_of(st.integers(1, 4).map(lambda b: b * BLOCK), st.integers(3, 40))


@examples(10)
def test_fused_block_matches_onnxruntime(examples):
    settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))(
        given(c=CHANNELS, mult=st.integers(1, 6), o=CHANNELS, h=st.integers(1, 13),
              w=st.integers(1, 13), k=st.sampled_from([3, 5]), s=st.sampled_from([1, 2]), n=st.integers(1, 3),
              acts=st.tuples(*[st.sampled_from(ACTS)] * 3), residual=st.booleans(),
              seed=st.integers(0, 99))(_fused_matches_onnxruntime))()


def _fused_matches_onnxruntime(c, mult, o, h, w, k, s, n, acts, residual, seed):
    residual = residual and s == 1 and c == o
    model = block_model(c, c * mult, o, h, k, s, "", seed=seed, n=n, w=w, acts=acts, residual=residual)
    x = np.random.default_rng(seed).standard_normal((n, c, h, w)).astype(np.float32)
    # fused exactly when the layout pass blocked all three convs, the first reading whole blocks
    convs = [nd for nd in specialized_nodes(model, decisions={"conv.inverted_residual": "unfused"})
             if nd.op == "ConvNCHWc"]
    blocked = len(convs) == 3 and convs[0].inputs[1].const.shape[4] == BLOCK
    assert ("InvertedResidual" in fused_ops(model)) == blocked
    m = kiln.compile(model, decisions=FUSED)
    got, want = m.run({"x": x})["y"], ort_run(model, x)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("acts,cpu", [(("Clip", "Clip", ""), None), (("HardSwish", "Relu", "SiLU"), None),
                                      (("SiLU", "SiLU", ""), None), (("Relu", "SiLU", "HardSwish"), None),
                                      (("Clip", "HardSwish", "Relu"), "x86-64-v3")])
def test_fused_block_matches_the_reference_interpreter(acts, cpu):
    """(x86-64-v3: AVX2's 8 lanes and 16 registers, other register tiles; runs on any AVX2 host)"""
    model = block_model(24, 96, 24, 9, 3, 1, "", n=2, w=11, acts=acts, residual=True)
    x = np.random.default_rng(3).standard_normal((2, 24, 9, 11)).astype(np.float32)
    m = kiln.compile(model, decisions=FUSED, cpu=cpu, report=True)
    assert [f.choice.algorithm for f in m.report.inverted_residuals] == ["inverted-residual"]
    got = m.run({"x": x})["y"]
    ref = kiln.compile(model, target="interpreter").run({"x": x})["y"]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("acts", [("Clip", "Clip", ""), ("Relu", "Relu", "Clip"), ("HardSwish", "HardSwish", "Relu"),
                                  ("Clip", "Relu", "HardSwish")])
@pytest.mark.parametrize("cpu", [None, "x86-64-v3"])
def test_activations_clamp_and_keep_nans_as_the_reference(acts, cpu):
    """Values past the clamps' bounds and NaNs (spread by each conv to its window and channels)
    through every activation of the 1x1 tiles and the depthwise row, on 16 and 8 lanes: the
    clamps (one max and one min a vector) keep a NaN NaN, as the reference interpreter does;
    the depthwise ReLU once made it 0 (25 NaNs of 432 here)."""
    model = block_model(24, 96, 24, 9, 3, 1, "", n=2, w=11, acts=acts, residual=True)
    x = np.random.default_rng(3).standard_normal((2, 24, 9, 11)).astype(np.float32) * 8
    x[0, :, 2, 3] = np.nan
    x[1, 5, 6, 7] = np.nan
    m = kiln.compile(model, decisions=FUSED, cpu=cpu, report=True)
    assert [f.choice.algorithm for f in m.report.inverted_residuals] == ["inverted-residual"]
    got = m.run({"x": x})["y"]
    ref = kiln.compile(model, target="interpreter").run({"x": x})["y"]
    assert np.isnan(ref).sum() == 432
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("c,e,o,acts,cpu", [
    (24, 72, 24, ("Relu", "Relu", ""), None),            # 16 + 8 lanes: half-vector last blocks
    (12, 44, 12, ("HardSwish", "Clip", "Relu"), None),    # 12 of 16 input lanes, over half made
    (40, 120, 40, ("Clip", "SiLU", ""), None),
    (24, 36, 12, ("Relu", "HardSwish", "SiLU"), None),    # 32 + 4 expanded lanes
    (12, 44, 12, ("Clip", "Clip", ""), "x86-64-v3"),     # 8 lanes: 8 + 4
])
def test_narrow_channels_skip_their_padding_lanes(c, e, o, acts, cpu):
    """Channel counts that leave a block partly padding: the 1x1 convs sum over the used input
    lanes only and make a last block of at most half its lanes on half vectors; padding lanes
    stay zero (the output's blocked twin is read whole by the next layers)."""
    residual = c == o
    model = block_model(c, e, o, 7, 3, 1, "", n=2, w=9, acts=acts, residual=residual)
    x = np.random.default_rng(c).standard_normal((2, c, 7, 9)).astype(np.float32)
    m = kiln.compile(model, decisions=FUSED, cpu=cpu, report=True)
    assert [f.choice.algorithm for f in m.report.inverted_residuals] == ["inverted-residual"]
    want = ort_run(model, x)
    np.testing.assert_allclose(m.run({"x": x})["y"], want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("c,e,o,w,cpu", [
    (24, 96, 24, 29, None),          # 16 + 8 outputs: one tile of a whole and a half block; 13, 13, 2, 1 columns
    (32, 64, 88, 17, None),          # 88 = 5 x 16 + 8: a tile group of 4 blocks, then block 4 with the half one
    (16, 24, 40, 21, None),          # the expand's 16 + 8; the project's 2 whole blocks and a half one apart
    (12, 44, 12, 15, "x86-64-v3"),   # 8 lanes: 8 + 4
])
def test_whole_block_joins_the_half_block_tiles(c, e, o, w, cpu):
    """A last block of at most half its lanes after a whole block left alone by the tile groups:
    both in one tile (each broadcast input feeding both), with the residual, odd widths and
    every remainder piece of columns."""
    residual = c == o
    model = block_model(c, e, o, 5, 3, 1, "", n=2, w=w, acts=("Relu", "Clip", "Relu"), residual=residual)
    x = np.random.default_rng(o).standard_normal((2, c, 5, w)).astype(np.float32)
    m = kiln.compile(model, decisions=FUSED, cpu=cpu, report=True)
    assert [f.choice.algorithm for f in m.report.inverted_residuals] == ["inverted-residual"]
    want = ort_run(model, x)
    np.testing.assert_allclose(m.run({"x": x})["y"], want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))


def test_used_channels_of_packed_weights():
    w = np.zeros((3, 2, 1, 1, 16, 16), np.float32)     # (OCB, ICB, 1, 1, input lane, output lane)
    w[0, 1, 0, 0, 7, 2] = 1.0                             # input channel 16 + 7, output channel 2
    w[2, 0, 0, 0, 0, 4] = np.nan                          # a NaN weight is used
    b = np.zeros((3, 16), np.float32)
    assert summed_channels(w) == 24
    assert made_channels(w, b) == 2 * 16 + 5
    b[2, 9] = 0.5
    assert made_channels(w, b) == 2 * 16 + 10
    assert made_channels(np.zeros_like(w), np.zeros_like(b)) == summed_channels(np.zeros_like(w)) == 1
    assert summed_channels(None) is None and made_channels(w, None) is None


def test_symbolic_batch_fuses_at_each_batch():
    model = block_model(16, 48, 16, 10, 3, 1, "Clip", batch_dim=True)
    m = kiln.compile(model, decisions=FUSED)
    for n in (1, 3):
        x = np.random.default_rng(n).standard_normal((n, 16, 10, 10)).astype(np.float32)
        np.testing.assert_allclose(m.run({"x": x})["y"], ort_run(model, x), rtol=1e-4, atol=1e-4)
    assert "InvertedResidual" in fused_ops(model, dims={"N": 2})


def test_chain_with_a_shared_value_or_shifting_clip_is_not_fused():
    model = onnx.load_from_string(block_model(16, 64, 16, 8, 3, 1, "Clip"))
    g = model.graph
    g.output.append(onnx.helper.make_tensor_value_info("ea", onnx.TensorProto.FLOAT, None))   # read outside
    assert "InvertedResidual" not in fused_ops(model.SerializeToString())
    model = onnx.load_from_string(block_model(16, 64, 16, 8, 3, 1, "Clip"))
    lo = next(i for i in model.graph.initializer if i.name == "ea_lo")
    lo.CopyFrom(onnx.numpy_helper.from_array(np.array(0.5, np.float32), "ea_lo"))   # clip(0) != 0
    assert "InvertedResidual" not in fused_ops(model.SerializeToString())


def test_rule_fuses_when_the_expanded_tensor_outgrows_l2_and_is_reported():
    t = Target.host()
    budget = IR_MIN_L2_SHARE * t.l2_bytes
    assert choose_inverted_residual(int(budget) + 4, t).algorithm == "inverted-residual"
    assert choose_inverted_residual(int(budget) - 4, t).algorithm == "unfused"
    assert choose_inverted_residual(4, t, "fused").algorithm == "inverted-residual"
    big = block_model(16, 96, 16, 8, 3, 1, "Clip")     # 96 x 8 x 8 floats: far below L2
    assert "InvertedResidual" not in fused_ops(big, decisions={})
    m = kiln.compile(big, report=True, decisions=FUSED)
    (found,) = m.report.inverted_residuals
    assert found.choice.algorithm == "inverted-residual" and "16->96->16" in str(found)


def test_rule_wants_more_than_l2_share_for_a_row_pass_activation():
    t = Target.host()
    between = int((IR_MIN_L2_SHARE + IR_ROW_PASS_L2_SHARE) / 2 * t.l2_bytes)
    assert choose_inverted_residual(between, t, acts=("clip", "clip", "")).algorithm == "inverted-residual"
    assert choose_inverted_residual(between, t, acts=("relu", "hardswish", "")).algorithm == "inverted-residual"
    for acts in (("hardswish", "hardswish", ""), ("relu", "relu", "swish")):
        choice = choose_inverted_residual(between, t, acts=acts)
        assert choice.algorithm == "unfused" and "pass over the row" in choice.reason
    big = int(IR_ROW_PASS_L2_SHARE * t.l2_bytes) + 4
    assert choose_inverted_residual(big, t, acts=("hardswish", "hardswish", "")).algorithm == "inverted-residual"


def test_rule_fuses_long_rows_whose_expanded_tensor_fits():
    """Input and output rows of IR_WIDE_TILES widest tiles or more fuse (a tensor that fits L2
    too); long input rows with short output rows fuse only where the whole batch's expanded
    tensor outgrows the share of L2; short rows, or a row-pass activation, stay unfused; the
    pass gives the rule the block's widths and batch."""
    from kiln.lower.conv_algo import IR_WIDE_TILES
    from kiln.lower.inverted_residual import MAX_COLUMNS
    t = Target.host()
    wide, fits = IR_WIDE_TILES * MAX_COLUMNS, int(IR_MIN_L2_SHARE * t.l2_bytes) // 2

    def rule(widths, batch=1, acts=()):
        return choose_inverted_residual(fits, t, None, acts, widths, batch).algorithm

    assert rule((wide, wide)) == rule((wide, wide), 2) == "inverted-residual"
    assert rule((wide, wide - 1)) == rule((wide, wide - 1), 2) == "unfused"
    assert rule((wide, wide - 1), 3) == "inverted-residual"          # 3 images past the share
    assert rule((wide - 1, wide - 1), 8) == rule((wide - 1, wide), 1) == "unfused"
    assert rule((wide, wide), 8, ("hardswish", "relu", "")) == "unfused"
    assert choose_inverted_residual(fits, t).algorithm == "unfused"    # (widths not given)
    c, e, o = BLOCK, 2 * BLOCK, BLOCK     # a small expanded tensor: 2 blocks x wide x 12 rows
    assert "InvertedResidual" in fused_ops(block_model(c, e, o, 12, 3, 1, "Relu", w=wide), decisions={})
    assert "InvertedResidual" not in fused_ops(block_model(c, e, o, 12, 3, 1, "Relu", w=wide - 1), decisions={})
    narrow_out = block_model(c, e, o, 12, 3, 2, "Relu", w=wide, batch_dim=True)
    assert "InvertedResidual" not in fused_ops(narrow_out, dims={"N": 1}, decisions={})
    images = -(-int(IR_MIN_L2_SHARE * t.l2_bytes) // (e * wide * 12 * 4)) + 1
    assert "InvertedResidual" in fused_ops(narrow_out, dims={"N": images}, decisions={})


def test_register_tiles_fill_the_register_file():
    main, cols = register_tiles(32)
    assert (main, cols[4]) == (4, 6)
    main, cols = register_tiles(16)
    assert main * cols[main] + main + 1 <= 16


def test_the_kernel_compiles_as_three_units_or_one():
    """The shared kernel is split in three units compiled in parallel (csource.c_shared parts:
    the 1x1 tiles of 3 and 2 channel blocks, the depthwise row and the tiles of one block, the
    rest), each its own cached object; a whole-module text holding all parts is still one valid
    unit."""
    from kiln.codegen.build import compile_c
    from kiln.codegen.c import emit_c, emit_c_units, is_shared_unit
    model = block_model(24, 96, 40, 9, 3, 1, "Clip", w=11)
    module = run_stages(model, "loops", decisions=FUSED).lowered.module
    shared = [u for u in emit_c_units(module, 1) if is_shared_unit(u) and "kiln_inverted_residual" in u]
    assert len(shared) == 3
    assert [f"#define KILN_SHARED_PART {k}" in u for k, u in enumerate(shared)] == [True, True, True]
    compile_c(emit_c(module), Target.host())
