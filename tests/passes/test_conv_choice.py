"""The conv algorithm chooser as the layout pass applies it (kiln.passes.layout_rules.choose_convs over
kiln.lower.conv_algo.choose): on random convs (dense, depthwise, grouped; 1x1, 3x3, 5x5, 7x7;
strides, dilations, asymmetric pads; batch 1-3 or a symbolic batch) every conv gets one finding
whose algorithm is what the rewritten graph runs and whose reason names its kind, and the
rewritten graph computes what the original did (NumPy references of the blocked ops)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from kiln.ops.layout import block_groups
from kiln.passes import layout
from kiln.passes.layout import transform
from kiln.passes.layout_rules import blockable_channels
from tests.passes.util import assert_equivalent, graph, prog

F = np.float32
OP = {"direct-nchwc": "ConvNCHWc", "winograd": "ConvWinograd", "direct-nchw": "Conv"}


def conv_graph(n, c, oc, group, h, w, k, s, d, pads, seed=0):
    rng = np.random.default_rng(seed)
    oh = (h + pads[0] + pads[2] - (k - 1) * d - 1) // s + 1
    ow = (w + pads[1] + pads[3] - (k - 1) * d - 1) // s + 1
    body = (f'  %c: float32[{n},{oc},{oh},{ow}] = Conv(%x, %w, %b) {{kernel_shape = [{k}, {k}], '
            f'strides = [{s}, {s}], pads = [{", ".join(map(str, pads))}], dilations = [{d}, {d}], '
            f'group = {group}}} name "conv"\n'
            f'  %y: float32[{n},{oc},{oh},{ow}] = Relu(%c) name "relu"')
    return graph(prog(f"(%x: float32[{n},{c},{h},{w}]) -> (%y)", body),
                 w=(rng.standard_normal((oc, c // group, k, k)) / np.sqrt(c // group * k * k)).astype(F),
                 b=rng.standard_normal(oc).astype(F))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(n=st.sampled_from([1, 2, 3, "N"]), kind=st.sampled_from(["dense", "depthwise", "grouped"]),
       c=st.sampled_from([3, 8, 12, 16, 24, 32, 64]), mult=st.sampled_from([1, 2]),
       group=st.sampled_from([2, 4, 8]), h=st.integers(3, 14), w=st.integers(3, 14),
       k=st.sampled_from([1, 3, 5, 7]), s=st.integers(1, 2), d=st.integers(1, 2),
       pads=st.lists(st.integers(0, 3), min_size=4, max_size=4), block=st.sampled_from([8, 16]),
       selective=st.booleans(), algo=st.sampled_from([None, "direct", "winograd"]))
def test_every_conv_gets_its_algorithm_and_a_reason(n, kind, c, mult, group, h, w, k, s, d, pads, block,
                                                   selective, algo):
    group = 1 if kind == "dense" else c if kind == "depthwise" else group
    oc = c if kind == "depthwise" else c * mult
    assume(c % group == 0 and oc % group == 0)
    assume(h + pads[0] + pads[2] >= (k - 1) * d + 1 and w + pads[1] + pads[3] >= (k - 1) * d + 1)
    g = conv_graph(n, c, oc, group, h, w, k, s, d, pads)
    out = g.clone()
    findings = []
    transform(out, block, selective=selective, override=algo, findings=findings)
    assert len(findings) == 1
    f = findings[0]
    ran = [x.op for x in out.nodes if x.op in OP.values()]
    assert ran == [OP[f.choice.algorithm]], (f, ran)
    reason = f.choice.reason
    blockable = (kind != "grouped" or block_groups(c, oc, group, block) is not None) \
        and blockable_channels(c, oc, block, (k, k), kind == "depthwise", kind == "grouped")
    if not blockable:
        assert f.choice.algorithm == "direct-nchw" and reason.startswith("not blockable: ")
        # (the reason an asked-for algorithm was refused follows "; asked for": not the blocking's)
        why = reason.split("; asked for")[0]
        assert ("grouped" in why) == (kind == "grouped" and block_groups(c, oc, group, block) is None)
    elif f.choice.algorithm == "direct-nchwc" and selective:
        # the kind that made it a candidate is named first
        first = reason.split(":")[0].split(" (")[0]
        assert first in ("depthwise", "grouped", "pointwise", "strided", "a stem reading its"
                         f" {c} channels channels-last"), reason
        assert first == kind or kind == "dense"
    elif f.choice.algorithm == "winograd":
        assert k == 3 and s == 1 and d == 1 and kind == "dense" and algo != "direct"
    if algo == "winograd" and f.choice.algorithm != "winograd":
        assert "asked for winograd, but" in reason or not blockable or "no blocked neighbour" in reason
    assert_equivalent(g, out, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n", [1, "N"])
def test_reasons_name_each_kind(n, monkeypatch):
    """One graph, one conv of each kind next to blocked neighbours: each reason names its kind."""
    monkeypatch.setattr(layout, "SELECTIVE", True)
    rng = np.random.default_rng(5)

    def r(*shape):
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(F)
    body = (f'  %a: float32[{n},32,8,8] = Conv(%x, %w1) {{kernel_shape = [1, 1]}} name "pointwise"\n'
            f'  %b: float32[{n},32,8,8] = Conv(%a, %wd) {{kernel_shape = [3, 3], pads = [1, 1, 1, 1], group = 32}} name "depthwise"\n'
            f'  %c: float32[{n},32,8,8] = Conv(%b, %wg) {{kernel_shape = [3, 3], pads = [0, 1, 2, 1], dilations = [1, 1], group = 8}} name "grouped"\n'
            f'  %e: float32[{n},32,4,4] = Conv(%c, %ws) {{kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1]}} name "strided"\n'
            f'  %y: float32[{n},32,4,4] = Conv(%e, %wk) {{kernel_shape = [3, 3], pads = [2, 2, 2, 2], dilations = [2, 2]}} name "dilated"')
    g = graph(prog(f"(%x: float32[{n},16,8,8]) -> (%y)", body), w1=r(32, 16, 1, 1), wd=r(32, 1, 3, 3),
              wg=r(32, 4, 3, 3), ws=r(32, 32, 3, 3), wk=r(32, 32, 3, 3))
    out = g.clone()
    findings = []
    transform(out, 16, findings=findings)
    why = {f.node: f.choice for f in findings}
    assert why["pointwise"].reason.startswith("pointwise")
    assert why["depthwise"].reason.startswith("depthwise")
    assert why["grouped"].reason.startswith("grouped (8 groups of 4 channels: depthwise over 4 lane rotations")
    assert why["strided"].reason.startswith("strided")
    assert why["dilated"].algorithm == "direct-nchw" and why["dilated"].reason.startswith("dense KxK")
    assert {f.choice.algorithm for f in findings} == {"direct-nchwc", "direct-nchw"}
    assert_equivalent(g, out, rtol=1e-4, atol=1e-4)
