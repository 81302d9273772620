"""transform_layout beyond convs and elementwise ops: Concat along channels and nearest Resize run
on the blocked twins (no conversions between blocked convs), and where they must stay NCHW."""

import numpy as np
import pytest

import kiln
from kiln.interpreter import Interpreter
from kiln.passes import layout
from tests.passes.util import assert_equivalent, graph, prog, random_inputs, run_pass

from tests.passes.test_layout import F, R, _ops, block8  # noqa: F401 (block8: autouse, block 8, every conv)


def _compiled_matches(g, blocked, seed=0):
    xs = random_inputs(g, seed)
    want = Interpreter(g).run(xs)
    got = kiln.compile(blocked, target="cpu", opt_level=0).run(dict(zip([v.name for v in g.inputs], xs)))
    for v, w in zip(g.outputs, want):
        np.testing.assert_allclose(got[v.name], w, rtol=1e-4, atol=1e-4)


CSP = ('  %a: float32[1,8,{h},{w}] = Conv(%x, %wa, %ba) {{kernel_shape = [1, 1]}} name "a"\n'
       '  %sa: float32[1,8,{h},{w}] = Swish(%a) name "sa"\n'
       '  %b: float32[1,16,{h},{w}] = Conv(%x, %wb) {{kernel_shape = [3, 3], strides = [1, 1], pads = [1, 0, 1, 2]}} name "b"\n'
       '  %sb: float32[1,16,{h},{w}] = Swish(%b) name "sb"\n'
       '  %m: float32[1,16,{h},{w}] = MaxPool(%sb) {{kernel_shape = [5, 5], pads = [2, 2, 2, 2]}} name "pool"\n'
       '  %cat: float32[1,40,{h},{w}] = Concat(%sa, %sb, %m) {{axis = 1}} name "cat"\n'
       '  %y: float32[1,8,{h},{w}] = Conv(%cat, %wc) {{kernel_shape = [1, 1]}} name "c"')


def test_concat_of_blocked_values_runs_blocked(monkeypatch):
    """CSP/SPPF: conv outputs (and a pool of one) concatenated along channels, read by a conv:
    block multiples concatenate as blocks, so nothing is converted between the convs."""
    monkeypatch.setenv("KILN_CONV_ALGO", "direct")     # the 3x3 conv as the direct ConvNCHWc
    g = graph(prog("(%x: float32[1,16,9,7]) -> (%y)", CSP.format(h=9, w=7)),
              wa=R(8, 16, 1, 1), ba=R(8), wb=R(16, 16, 3, 3), wc=R(8, 40, 1, 1))
    out, stats = run_pass("transform_layout", g)
    assert _ops(out) == ["kiln::ToNCHWc", "kiln::ConvNCHWc", "Swish", "kiln::ConvNCHWc", "Swish",
                         "kiln::MaxPoolNCHWc", "Concat", "kiln::ConvNCHWc", "kiln::FromNCHWc"]
    assert out.nodes[6].outputs[0].type.shape == (1, 5, 9, 7, 8)
    assert stats.fired["Concat"] == 1
    assert_equivalent(g, out, rtol=1e-4, atol=1e-5)
    _compiled_matches(g, out)


def test_concat_with_a_partial_block_or_an_nchw_input_stays_nchw():
    body = ('  %a: float32[1,12,5,5] = Conv(%x, %wa) {kernel_shape = [1, 1]} name "a"\n'
            '  %b: float32[1,8,5,5] = Conv(%x, %wb) {kernel_shape = [1, 1]} name "b"\n'
            '  %y: float32[1,20,5,5] = Concat(%a, %b) {axis = 1} name "cat"\n'
            '  %n: float32[1,8,5,5] = Neg(%x) name "neg"\n'
            '  %z: float32[1,16,5,5] = Concat(%b, %n) {axis = 1} name "cat2"')
    g = graph(prog("(%x: float32[1,8,5,5]) -> (%y, %z)", body), wa=R(12, 8, 1, 1), wb=R(8, 8, 1, 1))
    out, stats = run_pass("transform_layout", g)
    assert "Concat" not in stats.fired
    assert [n.op for n in out.nodes if n.op == "Concat"] == ["Concat", "Concat"]
    assert all(n.inputs[0].type.rank == 4 for n in out.nodes if n.op == "Concat")
    assert_equivalent(g, out, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("how", ["scales", "sizes"])
def test_nearest_resize_of_a_blocked_value_runs_blocked(how):
    """FPN/PAN upsampling between convs: the block axis gets scale 1 (or its own size)."""
    ins = "%t, %roi, %sc" if how == "scales" else "%t, %roi, _, %sz"
    body = ('  %t: float32[2,16,5,3] = Conv(%x, %w1) {kernel_shape = [1, 1]} name "lat"\n'
            f'  %u: float32[2,16,10,9] = Resize({ins}) {{mode = "nearest", '
            'coordinate_transformation_mode = "asymmetric", nearest_mode = "floor"} name "up"\n'
            '  %y: float32[2,8,10,9] = Conv(%u, %w2) {kernel_shape = [3, 3], pads = [1, 1, 1, 1]} name "c"')
    consts = dict(w1=R(16, 8, 1, 1), w2=R(8, 16, 3, 3), roi=np.zeros(0, F))
    if how == "scales":
        consts["sc"] = np.array([1, 1, 2, 3], F)
    else:
        consts["sz"] = np.array([2, 16, 10, 9], np.int64)
    g = graph(prog("(%x: float32[2,8,5,3]) -> (%y)", body), **consts)
    out, stats = run_pass("transform_layout", g)
    assert stats.fired["Resize"] == 1
    assert _ops(out) == ["kiln::ToNCHWc", "kiln::ConvNCHWc", "Resize", "kiln::ConvNCHWc", "kiln::FromNCHWc"]
    assert out.nodes[2].outputs[0].type.shape == (2, 2, 10, 9, 8)
    assert_equivalent(g, out, rtol=1e-4, atol=1e-5)
    _compiled_matches(g, out)


def test_linear_resize_stays_nchw():
    body = ('  %t: float32[1,8,4,4] = Conv(%x, %w1) {kernel_shape = [1, 1]} name "lat"\n'
            '  %y: float32[1,8,8,8] = Resize(%t, %roi, %sc) {mode = "linear"} name "up"')
    g = graph(prog("(%x: float32[1,8,4,4]) -> (%y)", body), w1=R(8, 8, 1, 1), roi=np.zeros(0, F),
              sc=np.array([1, 1, 2, 2], F))
    out, stats = run_pass("transform_layout", g)
    assert "Resize" not in stats.fired and _ops(out)[-1] == "Resize"
    assert_equivalent(g, out, rtol=1e-4, atol=1e-5)


def test_selective_default_blocks_strided_and_1d_convs_through_pools_and_concats(monkeypatch):
    """By default a strided conv and a 1x1 conv reached through a MaxPool and a channel Concat
    run blocked (and the ops between them), as do 1-D convs next to each other; a dense 3x3
    stride-1 conv stays NCHW."""
    monkeypatch.setattr(layout, "SELECTIVE", True)
    body = ('  %a: float32[1,16,4,4] = Conv(%x, %w2) {kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1]} name "down"\n'
            '  %s: float32[1,16,4,4] = Swish(%a) name "act"\n'
            '  %m: float32[1,16,4,4] = MaxPool(%s) {kernel_shape = [3, 3], pads = [1, 1, 1, 1]} name "pool"\n'
            '  %c: float32[1,32,4,4] = Concat(%s, %m) {axis = 1} name "cat"\n'
            '  %y: float32[1,8,4,4] = Conv(%c, %w1) {kernel_shape = [1, 1]} name "pw"\n'
            '  %z: float32[1,8,4,4] = Conv(%y, %w3) {kernel_shape = [3, 3], pads = [1, 1, 1, 1]} name "dense"\n'
            '  %t: float32[1,8,9] = Conv(%l, %wl1) {kernel_shape = [3], pads = [2, 2], dilations = [2]} name "c1d"\n'
            '  %r: float32[1,8,9] = Relu(%t) name "relu"\n'
            '  %u: float32[1,8,5] = Conv(%r, %wl2) {kernel_shape = [3], strides = [2], pads = [1, 1]} name "c1d_s2"')
    g = graph(prog("(%x: float32[1,8,8,8], %l: float32[1,8,9]) -> (%z, %u)", body),
              w2=R(16, 8, 3, 3), w1=R(8, 32, 1, 1), w3=R(8, 8, 3, 3), wl1=R(8, 8, 3), wl2=R(8, 8, 3))
    out, stats = run_pass("transform_layout", g)
    convs = {n.name: n.qualified_op for n in out.nodes if "Conv" in n.op}
    assert convs == {"down": "kiln::ConvNCHWc", "pw": "kiln::ConvNCHWc", "dense": "Conv",
                     "c1d": "kiln::ConvNCHWc", "c1d_s2": "kiln::ConvNCHWc"}
    assert stats.fired["MaxPool"] == 1 and stats.fired["Concat"] == 1
    # outputs reach ~800: float32 sums in another order differ by ~1e-4 absolute near zero
    assert_equivalent(g, out, rtol=1e-4, atol=1e-3)


def test_silu_fuses_into_its_conv_at_O3():
    """Conv -> Sigmoid -> Mul(conv, sigmoid) is one kernel at -O3 (the Mul becomes a Swish)."""
    body = ('  %c: float32[1,16,9,9] = Conv(%x, %w) {kernel_shape = [3, 3], pads = [1, 1, 1, 1]} name "conv"\n'
            '  %s: float32[1,16,9,9] = Sigmoid(%c) name "sig"\n'
            '  %y: float32[1,16,9,9] = Mul(%c, %s) name "mul"')
    g = graph(prog("(%x: float32[1,8,9,9]) -> (%y)", body), w=R(16, 8, 3, 3))
    m = kiln.compile(g, target="cpu", opt_level=3, report=True)
    assert m.report.kernels == 1 or sum("Swish" in str(k) and "Conv" in str(k) for k in m.report.fused_groups) == 1
    xs = random_inputs(g, 1)
    np.testing.assert_allclose(m.run({"x": xs[0]})["y"], Interpreter(g).run(xs)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n, k, relu", [(1, 2, True), ("N", 2, False), (2, 3, False)])
def test_depth_to_space_of_whole_blocks_runs_blocked_into_a_concat(n, k, relu, monkeypatch):
    """A U-Net's up-convolution (1x1 conv to k*k*16 channels, DCR DepthToSpace, kiln.passes.
    conv_transpose) concatenated with a blocked skip and read by a conv: the DepthToSpace moves
    the twin's channel vectors (Reshape, Transpose, Reshape), nothing converts between the
    convs; a CRD one, or one whose result is read in NCHW, runs NCHW."""
    monkeypatch.setenv("KILN_CONV_ALGO", "direct")
    h = 5
    act = f'  %r: float32[{n},16,{h * k},{h * k}] = Relu(%d) name "relu"\n' if relu else ""
    body = (f'  %u: float32[{n},{16 * k * k},{h},{h}] = Conv(%x, %wu, %bu) {{kernel_shape = [1, 1]}} name "up"\n'
            f'  %d: float32[{n},16,{h * k},{h * k}] = DepthToSpace(%u) {{blocksize = {k}, mode = "DCR"}} name "d2s"\n'
            + act +
            f'  %s: float32[{n},8,{h * k},{h * k}] = Conv(%z, %ws) {{kernel_shape = [1, 1]}} name "skip"\n'
            f'  %cat: float32[{n},24,{h * k},{h * k}] = Concat(%{"r" if relu else "d"}, %s) {{axis = 1}} name "cat"\n'
            f'  %y: float32[{n},8,{h * k},{h * k}] = Conv(%cat, %wc) {{kernel_shape = [3, 3], pads = [1, 1, 1, 1]}} name "c"\n'
            f'  %v: float32[{n},{16 * k * k},{h},{h}] = Conv(%x, %wu) {{kernel_shape = [1, 1]}} name "up2"\n'
            f'  %e: float32[{n},16,{h * k},{h * k}] = DepthToSpace(%v) {{blocksize = {k}, mode = "CRD"}} name "crd"\n'
            f'  %t: float32[{n},16,{h * k},{h * k}] = Neg(%e) name "neg"')
    sig = f"(%x: float32[{n},16,{h},{h}], %z: float32[{n},8,{h * k},{h * k}]) -> (%y, %t)"
    g = graph(prog(sig, body, 17), wu=R(16 * k * k, 16, 1, 1), bu=R(16 * k * k), ws=R(8, 8, 1, 1),
              wc=R(8, 24, 3, 3))
    out, stats = run_pass("transform_layout", g)
    assert stats.fired["DepthToSpace"] == 1 and stats.fired["Concat"] == 1
    ops = _ops(out)
    assert ops.count("DepthToSpace") == 1 and ops.count("kiln::FromNCHWc") == 2   # the CRD one's input, y
    assert_equivalent(g, out, rtol=1e-4, atol=1e-4)
    _compiled_matches(g, out)


CONVNEXT = ('  %d: float32[1,16,5,6] = Conv(%x, %wd, %bd) {{kernel_shape = [7, 7], pads = [3, 3, 3, 3], group = 16}} name "dw"\n'
            '  %t: float32[1,5,6,16] = Transpose(%d) {{perm = [0, 2, 3, 1]}} name "t"\n'
            '  %m: float32[1,5,6,16] = MatMul(%t, %wm) name "mlp"\n'
            '  %u: float32[1,16,5,6] = Transpose(%m) {{perm = {perm}}} name "t1"\n'
            '  %r: float32[1,16,5,6] = Add(%x, %u) name "residual"\n'
            '  %y: float32[1,16,5,6] = Conv(%r, %wd2) {{kernel_shape = [7, 7], pads = [3, 3, 3, 3], group = 16}} name "dw2"')


def _convnext_weights(second=True):
    """Scaled as a trained net's (sums of 49 taps and 16 channels stay O(1): no cancellation
    of large values into a tiny output that an absolute tolerance would misjudge)."""
    w = {"wd": R(16, 1, 7, 7) / 7, "bd": R(16), "wm": R(16, 16) / 4}
    return {**w, "wd2": R(16, 1, 7, 7) / 7} if second else w


def test_channels_last_result_moved_to_nchw_joins_a_blocked_residual():
    """ConvNeXt's block: depthwise conv, a channels-last MLP, moved back (Transpose 0,3,1,2) and
    added to the residual stream, which the next depthwise conv reads: the Add runs on blocked
    twins (the move converted straight into the blocked layout), so the stream is never
    converted to NCHW and back."""
    g = graph(prog("(%x: float32[1,16,5,6]) -> (%y)", CONVNEXT.format(perm="[0, 3, 1, 2]")),
              **_convnext_weights())
    out, stats = run_pass("transform_layout", g)
    assert _ops(out) == ["kiln::ToNCHWc", "kiln::ConvNCHWc", "kiln::FromNCHWc", "Transpose", "MatMul",
                         "Transpose", "kiln::ToNCHWc", "Add", "kiln::ConvNCHWc", "kiln::FromNCHWc"]
    assert out.nodes[7].outputs[0].type.rank == 5        # the residual Add on blocked twins
    assert stats.fired["elementwise"] == 1
    assert_equivalent(g, out, rtol=1e-4, atol=1e-5)
    _compiled_matches(g, out)


def test_residual_moved_back_to_channels_last_stays_blocked():
    """The stage's last block: its residual sum is read only by a move to channels-last (the
    downsampling LayerNorm's Transpose 0,2,3,1): the Add runs blocked, converted back once."""
    body = CONVNEXT.format(perm="[0, 3, 1, 2]").rsplit("\n", 1)[0] + (
        '\n  %y: float32[1,5,6,16] = Transpose(%r) {perm = [0, 2, 3, 1]} name "t2"')
    g = graph(prog("(%x: float32[1,16,5,6]) -> (%y)", body), **_convnext_weights(second=False))
    out, stats = run_pass("transform_layout", g)
    assert _ops(out)[-3:] == ["Add", "kiln::FromNCHWc", "Transpose"]
    assert stats.fired["elementwise"] == 1
    assert_equivalent(g, out, rtol=1e-4, atol=1e-5)
    _compiled_matches(g, out)


def test_other_moves_of_a_channels_last_value_keep_the_add_nchw():
    """Any other permutation is no channels-last -> NCHW move: the Add stays NCHW."""
    g = graph(prog("(%x: float32[1,16,5,6]) -> (%y)", CONVNEXT.format(perm="[0, 3, 2, 1]").replace(
        "%t: float32[1,5,6,16]", "%t: float32[1,6,5,16]").replace("%m: float32[1,5,6,16]", "%m: float32[1,6,5,16]")
        .replace("perm = [0, 2, 3, 1]", "perm = [0, 3, 2, 1]")),
              **_convnext_weights())
    out, stats = run_pass("transform_layout", g)
    assert "elementwise" not in stats.fired
    assert next(n for n in out.nodes if n.op == "Add").outputs[0].type.rank == 4
    assert_equivalent(g, out, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("n, head_k", [(1, 1), ("N", 1), (2, 3)])
def test_pointwise_head_with_few_outputs_runs_blocked(n, head_k, monkeypatch):
    """DBNet's head: an up-convolution (1x1 to 4*16 channels, DCR DepthToSpace) -> Relu -> a 1x1
    conv to 4 channels (the second up-convolution) -> DepthToSpace -> Sigmoid. The 1x1 to fewer
    channels than a block runs blocked in one zero-padded block (layout_rules.narrow_output),
    so the first DepthToSpace moves whole channel vectors and the only conversion is of the
    4-channel result; a 3x3 conv to 4 channels stays NCHW (its input converted instead), even
    with every blockable conv blocked (the layout pass not selective)."""
    monkeypatch.setattr(layout, "SELECTIVE", head_k == 1)
    h = 4
    body = (f'  %u: float32[{n},64,{h},{h}] = Conv(%x, %wu, %bu) {{kernel_shape = [1, 1]}} name "up"\n'
            f'  %d: float32[{n},16,{2 * h},{2 * h}] = DepthToSpace(%u) {{blocksize = 2, mode = "DCR"}} name "d2s"\n'
            f'  %r: float32[{n},16,{2 * h},{2 * h}] = Relu(%d) name "relu"\n'
            f'  %v: float32[{n},4,{2 * h},{2 * h}] = Conv(%r, %wv, %bv) {{kernel_shape = [{head_k}, {head_k}], '
            f'pads = [{head_k // 2}, {head_k // 2}, {head_k // 2}, {head_k // 2}]}} name "head"\n'
            f'  %e: float32[{n},1,{4 * h},{4 * h}] = DepthToSpace(%v) {{blocksize = 2, mode = "DCR"}} name "d2s2"\n'
            f'  %y: float32[{n},1,{4 * h},{4 * h}] = Sigmoid(%e) name "sig"')
    sig = f"(%x: float32[{n},16,{h},{h}]) -> (%y)"
    g = graph(prog(sig, body, 17), wu=R(64, 16, 1, 1), bu=R(64), wv=R(4, 16, head_k, head_k), bv=R(4))
    out, stats = run_pass("transform_layout", g)
    ops = _ops(out)
    head = next(x for x in out.nodes if x.name == "head")
    if head_k == 1:
        assert head.qualified_op == "kiln::ConvNCHWc" and stats.fired["DepthToSpace"] == 1
        assert ops.count("kiln::FromNCHWc") == 1 and ops.index("kiln::FromNCHWc") > ops.index("kiln::ConvNCHWc", 2)
    else:
        assert head.qualified_op == "Conv" and not stats.fired.get("DepthToSpace")
    assert_equivalent(g, out, rtol=1e-4, atol=1e-4)
    _compiled_matches(g, out)


@pytest.mark.parametrize("n, c, dense", [(1, 16, "gemm_t"), ("N", 12, "matmul"), (2, 12, "gemm")])
def test_flatten_into_a_dense_layer_reads_the_blocked_twin(n, c, dense):
    """A classifier: conv -> MaxPool -> Flatten -> Gemm/MatMul with constant weights: the Flatten
    reads the pooled twin and the weights' rows follow the blocked order (12 channels at block
    8: zero rows for the 4 padding lanes), so nothing converts back to NCHW; a Flatten with a
    second reader converts."""
    h, o = 6, 5
    k = c * (h // 2) ** 2
    mm = {"gemm_t": f'Gemm(%f, %wd, %bd) {{transB = 1}}', "gemm": 'Gemm(%f, %wd, %bd)',
          "matmul": 'MatMul(%f, %wd)'}[dense]
    body = (f'  %a: float32[{n},{c},{h},{h}] = Conv(%x, %wa, %ba) {{kernel_shape = [3, 3], pads = [1, 1, 1, 1]}} name "a"\n'
            f'  %p: float32[{n},{c},{h // 2},{h // 2}] = MaxPool(%a) {{kernel_shape = [2, 2], strides = [2, 2]}} name "pool"\n'
            f'  %f: float32[{n},{k}] = Flatten(%p) {{axis = 1}} name "flat"\n'
            f'  %y: float32[{n},{o}] = {mm} name "fc"')
    g = graph(prog(f"(%x: float32[{n},{c},{h},{h}]) -> (%y)", body), wa=R(c, c, 3, 3), ba=R(c),
              wd=R(o, k) if dense == "gemm_t" else R(k, o), bd=R(o))
    out, stats = run_pass("transform_layout", g)
    assert stats.fired["Flatten"] == 1 and "kiln::FromNCHWc" not in _ops(out) and "Flatten" not in _ops(out)
    assert_equivalent(g, out, rtol=1e-4, atol=1e-4)
    _compiled_matches(g, out)
    two = graph(prog(f"(%x: float32[{n},{c},{h},{h}]) -> (%y, %f)", body), wa=R(c, c, 3, 3), ba=R(c),
                wd=R(o, k) if dense == "gemm_t" else R(k, o), bd=R(o))
    out, stats = run_pass("transform_layout", two)
    assert not stats.fired.get("Flatten") and "kiln::FromNCHWc" in _ops(out)
    assert_equivalent(two, out, rtol=1e-4, atol=1e-4)
