"""ToNCHWc with `pads` (a stem conv's zero padding made by its input conversion) and the
vectorized interleave of a few channels (kiln.lower.narrow_convert), against the reference."""

import numpy as np
import pytest

import kiln
from kiln.compiler import run_stages
from kiln.interpreter import Interpreter
from kiln.lower.narrow_convert import interleave_indices, interleave_reference
from kiln.ops.layout import to_blocked
from kiln.targets.target import Target
from tests.ops.test_layout_lower import conv_text
from tests.passes.test_layout import R
from tests.passes.util import graph, prog

F = np.float32


@pytest.mark.parametrize("lanes", [4, 8, 16])
@pytest.mark.parametrize("c", [2, 3, 4, 5, 7])
def test_interleave_shuffles_make_channels_last(c, lanes):
    """The shuffles' output vectors, in order, are the pixels' channels one after another."""
    planes = [[100 * q + i for i in range(lanes)] for q in range(c)]
    want = [planes[q][i] for i in range(lanes) for q in range(c)]
    assert interleave_reference(planes, lanes) == want
    assert all(len(steps) == c - 1 for steps in interleave_indices(c, lanes))


def _conversion(n, c, h, w, block, pads):
    """ToNCHWc alone, its blocked (padded) result the graph's output."""
    pt, pl, pb, pr = pads
    out = f"{n},{-(-c // block)},{h + pt + pb},{w + pl + pr},{block}"
    body = (f'  %y: float32[{out}] = "kiln"::ToNCHWc(%x) {{block = {block}, pads = [{pt}, {pl}, {pb}, {pr}]}} '
            'name "to"')
    text = prog(f"(%x: float32[{n},{c},{h},{w}]) -> (%y)", body).replace('opsets {"": 17}', 'opsets {"": 17, "kiln": 1}')
    return graph(text)


@pytest.mark.parametrize("n,c,h,w,block,pads", [
    (2, 3, 5, 37, 3, (1, 1, 1, 1)),      # two whole vectors of 16 and a tail per row
    (1, 5, 4, 21, 5, (3, 0, 2, 3)),      # asymmetric; no left pad
    (1, 2, 3, 64, 2, (0, 2, 0, 0)),      # whole vectors only
    (2, 3, 6, 9, 3, (0, 0, 0, 0)),       # no padding, the row shorter than a vector
    (1, 20, 3, 7, 16, (1, 2, 0, 1)),     # whole blocks and a channel tail (the scheduled copy)
    (1, 1, 4, 5, 1, (2, 1, 1, 0)),       # one channel (the scheduled copy)
])
def test_padded_conversion_matches_reference(n, c, h, w, block, pads):
    g = _conversion(n, c, h, w, block, pads)
    x = np.random.default_rng(c).standard_normal((n, c, h, w)).astype(F)
    pt, pl, pb, pr = pads
    want = to_blocked(np.pad(x, [(0, 0), (0, 0), (pt, pb), (pl, pr)]), block)
    np.testing.assert_array_equal(Interpreter(g).run([x])[0], want)
    got = kiln.compile(g, target="cpu", opt_level=0).run({"x": x})["y"]
    np.testing.assert_array_equal(got, want)


def test_negative_or_short_pads_are_named():
    with pytest.raises(kiln.KilnError, match="ToNCHWc pads must be 4 non-negative ints"):
        kiln.compile(_conversion(1, 3, 4, 4, 3, (1, -1, 0, 0)), target="cpu", opt_level=0)


def test_narrow_conversion_is_the_vectorized_kernel():
    """A few channels convert in the hand-written interleave (its shuffles in the C source),
    at the target's vector width."""
    lanes = Target.host().vector_lanes(4)
    if lanes < 4:
        pytest.skip("no float32 vectors on this target")
    src = run_stages(_conversion(1, 3, 4, 2 * lanes + 1, 3, (1, 1, 1, 1)), "c").source.text
    assert "to_narrow" in src and src.count("__builtin_shufflevector") == 3 * 2


def stem(n, c, h, oc, k, s, p, readers=1):
    """A padded stem conv (+ Relu), and with readers=2 a second conv reading the same input."""
    shape = f"{n},{oc},{(h + 2 * p - k) // s + 1},{(h + 2 * p - k) // s + 1}"
    body = conv_text("x", "c", c, oc, k, s, p).replace("{c}", shape) + f'  %y: float32[{shape}] = Relu(%c) name "relu"'
    consts = {"w_conv": R(oc, c, k, k), "b_conv": R(oc)}
    outs = "%y"
    if readers == 2:
        body += "\n" + conv_text("x", "z", c, oc, k, s, p, name="other").replace("{z}", shape).rstrip("\n")
        consts.update(w_other=R(oc, c, k, k), b_other=R(oc))
        outs = "%y, %z"
    return graph(prog(f"(%x: float32[{n},{c},{h},{h}]) -> ({outs})", body), **consts)


@pytest.mark.parametrize("readers", [1, 2])
def test_stem_padding_moves_into_its_conversion(readers):
    """The stem's only reader: ToNCHWc pads, the conv none (it reads in place); a second reader of
    the input keeps the conv's own padding (one conversion serves both)."""
    from kiln.passes.layout import transform
    g = stem(2, 3, 37, 16, 3, 2, 1, readers)
    blocked = g.clone()
    transform(blocked, 16, selective=False, override="direct")
    conv_in = [n for n in blocked.nodes if n.op == "ToNCHWc"]
    convs = [n for n in blocked.nodes if n.op == "ConvNCHWc"]
    assert len(conv_in) == 1 and len(convs) == readers
    assert conv_in[0].attrs.get("pads") == ([1, 1, 1, 1] if readers == 1 else None)
    assert all(list(c.attrs["pads"]) == ([0] * 4 if readers == 1 else [1] * 4) for c in convs)
    x = np.random.default_rng(1).standard_normal((2, 3, 37, 37)).astype(F)
    m = kiln.compile(blocked, target="cpu", opt_level=0)
    for want, got in zip(Interpreter(g).run([x]), m.run({"x": x}).values()):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_stem_with_symbolic_batch_at_O3():
    """The default pipeline on a symbolic batch: one compiled model at batch 1 and 3."""
    g = stem("N", 3, 35, 32, 3, 2, 1)
    m = kiln.compile(g, target="cpu")
    ref = Interpreter(g)
    for n in (1, 3):
        x = np.random.default_rng(n).standard_normal((n, 3, 35, 35)).astype(F)
        np.testing.assert_allclose(m.run({"x": x})["y"], ref.run([x])[0], rtol=1e-4, atol=1e-4)
