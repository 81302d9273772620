"""A detector head's channel groups padded to whole blocks (kiln.passes.layout_groups, run by
transform_layout): the conv's weights get zero rows so each group starts a block, a Slice
keeps each group's channels, and the results are unchanged."""

import numpy as np
import pytest

import kiln
from kiln.graph import print_graph
from kiln.interpreter import Interpreter
from kiln.passes import layout, layout_groups
from tests.passes.util import assert_equivalent, graph, prog, random_inputs, run_pass

F = np.float32
rng = np.random.default_rng(3)


def R(*shape):
    return rng.standard_normal(shape).astype(F)


@pytest.fixture(autouse=True)
def block8(monkeypatch):
    monkeypatch.setenv("KILN_NCHWC", "8")
    monkeypatch.setattr(layout, "SELECTIVE", False)


def head(groups=3, k=5, c=16, perm="[0, 1, 3, 4, 2]", act="Sigmoid", opset=17):
    """Conv c -> groups*k on 4x6, act, split N,G,K,H,W, Transpose(perm), flattened rows."""
    oc = groups * k
    t = {"[0, 1, 3, 4, 2]": (1, groups, 4, 6, k), "[0, 1, 2, 4, 3]": (1, groups, k, 6, 4)}[perm]
    sig = f"(%x: float32[1,{c},4,6]) -> (%y)"
    body = (f'  %h: float32[1,{oc},4,6] = Conv(%x, %w, %b) {{kernel_shape = [1, 1]}} name "head"\n'
            f'  %s: float32[1,{oc},4,6] = {act}(%h) name "act"\n'
            f'  %r: float32[1,{groups},{k},4,6] = Reshape(%s, %shape) name "split"\n'
            f'  %t: float32[1,{",".join(map(str, t[1:]))}] = Transpose(%r) {{perm = {perm}}} name "move"\n'
            f'  %y: float32[1,{groups * 24},{k}] = Reshape(%t, %rows) name "rows"')
    w = R(oc, c, 1, 1)
    return graph(prog(sig, body, opset), w=w, b=R(oc), shape=np.array([1, groups, k, 4, 6], np.int64),
                 rows=np.array([1, groups * 24, k], np.int64)), w


def _ops(g):
    return [n.qualified_op for n in g.nodes]


def test_groups_padded_to_blocks():
    """3 groups of 5 channels, block 8: the conv computes 3 x 8 channels, group g's channel k at
    g * 8 + k (zero weights and bias elsewhere), split as 1,3,8,4,6 and sliced back to 5."""
    g, w = head()
    out, stats = run_pass("transform_layout", g)
    assert stats.fired["channel groups"] == 1
    assert _ops(out) == ["kiln::ToNCHWc", "kiln::ConvNCHWc", "Sigmoid", "kiln::FromNCHWc", "Reshape", "Slice",
                         "Transpose", "Reshape"]
    text = print_graph(out)
    assert "float32[1,3,4,6,8] = \"kiln\"::ConvNCHWc" in text
    assert "%r.groups8: float32[1,3,8,4,6] = Reshape" in text
    assert "%r: float32[1,3,5,4,6] = Slice(%r.groups8" in text
    conv = next(n for n in out.nodes if n.op == "ConvNCHWc")
    packed = conv.inputs[1].const          # (OC/8, IC/8, 1, 1, 8, 8): output lane last
    got = packed.transpose(0, 5, 1, 4, 2, 3).reshape(24, 16, 1, 1)
    want = np.zeros((24, 16, 1, 1), F)
    for grp in range(3):
        want[grp * 8:grp * 8 + 5] = w[grp * 5:grp * 5 + 5]
    np.testing.assert_array_equal(got, want)
    assert_equivalent(g, out, rtol=1e-5, atol=1e-6)


def test_plane_flattened_in_the_split():
    """The split may flatten the plane (N,G,K,H*W, then Transpose 0,1,3,2)."""
    sig = "(%x: float32[1,16,4,6]) -> (%y)"
    body = ('  %h: float32[1,15,4,6] = Conv(%x, %w) {kernel_shape = [1, 1]} name "head"\n'
            '  %r: float32[1,3,5,24] = Reshape(%h, %shape) name "split"\n'
            '  %y: float32[1,3,24,5] = Transpose(%r) {perm = [0, 1, 3, 2]} name "move"')
    g = graph(prog(sig, body), w=R(15, 16, 1, 1), shape=np.array([1, 3, 5, 24], np.int64))
    out, stats = run_pass("transform_layout", g)
    assert stats.fired["channel groups"] == 1
    assert "%r: float32[1,3,5,24] = Slice(%r.groups8" in print_graph(out)
    assert_equivalent(g, out, rtol=1e-5, atol=1e-6)


def test_old_opset_slices_by_attributes():
    g, _ = head(opset=9)
    out, stats = run_pass("transform_layout", g)
    assert stats.fired["channel groups"] == 1
    sl = next(n for n in out.nodes if n.op == "Slice")
    assert sl.attrs == {"starts": [0], "ends": [5], "axes": [2]} and len(sl.inputs) == 1
    assert_equivalent(g, out, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", ["not_channels_last", "whole_blocks", "costly", "one_group"])
def test_left_alone(case, monkeypatch):
    """Nothing gained: each group's channels not moved innermost, groups already whole blocks;
    padding that would cost the conv more multiply-adds than the gathers it saves; one group."""
    kw = {"not_channels_last": {"perm": "[0, 1, 2, 4, 3]"}, "whole_blocks": {"k": 8},
          "costly": {"c": 64}, "one_group": {"groups": 1, "k": 5}}[case]
    if case == "costly":
        monkeypatch.setattr(layout_groups, "GATHER_MACS", 4)    # 3 x 8 - 16 = 8 extra x 64 > 4 x 15
    g, _ = head(**kw)
    out, stats = run_pass("transform_layout", g)
    assert "channel groups" not in stats.fired
    assert "Slice" not in _ops(out)
    assert_equivalent(g, out, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("block", ["8", None])
def test_compiled_head_matches_the_reference(block, monkeypatch):
    """The compiled kernels (the padded conv, the conversion reading whole lane runs) give the
    reference's numbers, at block 8 and at the target's own (16 lanes with AVX-512)."""
    if block is None:
        monkeypatch.delenv("KILN_NCHWC")
    g, _ = head(groups=3, k=21, c=32)
    assert "Slice" in _ops(run_pass("transform_layout", g)[0])
    xs = random_inputs(g)
    want = Interpreter(g).run(xs)[0]
    got = kiln.compile(g).run({"x": xs[0]})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
