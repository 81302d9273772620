"""A Concat whose inputs are contiguous runs of its result (batch 1 along the channels) needs no
kernel: each producer writes its part in place (kiln.lower.concat_parts). Checked against the
interpreter on CSP/SPPF-shaped graphs, blocked and NCHW, with parts also read elsewhere, read
twice, written over in place after the Concat, and where it cannot apply (batch 2, parts not on
the arena's alignment, a part that is a graph output)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import kiln
from kiln.interpreter import Interpreter
from tests.passes.util import graph, prog, random_inputs

F = np.float32


def _w(rng, *shape):
    return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(F)


def _sppf(n, c, h, w, twice=False, out_part=False):
    """x -> 1x1 conv -> a; a -> MaxPool -> p1 -> MaxPool -> p2; Concat(a, p1, p2[, a]) -> 1x1 conv
    -> Relu -> y (SPPF's shape; p1 is read by the Concat and the second pool). `out_part`: a is
    also a graph output."""
    rng = np.random.default_rng(c * h + w)
    parts = ["a", "p1", "p2"] + (["a"] if twice else [])
    cc = c * len(parts)
    pool = '{kernel_shape = [3, 3], pads = [1, 1, 1, 1]}'
    body = (f'  %a: float32[{n},{c},{h},{w}] = Conv(%x, %wa, %ba) {{kernel_shape = [1, 1]}} name "a"\n'
            f'  %p1: float32[{n},{c},{h},{w}] = MaxPool(%a) {pool} name "pool1"\n'
            f'  %p2: float32[{n},{c},{h},{w}] = MaxPool(%p1) {pool} name "pool2"\n'
            f'  %cat: float32[{n},{cc},{h},{w}] = Concat({", ".join("%" + p for p in parts)}) {{axis = 1}} name "cat"\n'
            f'  %o: float32[{n},{c},{h},{w}] = Conv(%cat, %wo) {{kernel_shape = [1, 1]}} name "out"\n'
            f'  %y: float32[{n},{c},{h},{w}] = Relu(%o) name "relu"')
    sig = f"(%x: float32[{n},{c},{h},{w}]) -> (%y{', %a' if out_part else ''})"
    return graph(prog(sig, body), wa=_w(rng, c, c, 1, 1), ba=rng.standard_normal(c).astype(F),
                 wo=_w(rng, c, cc, 1, 1))


def _concat_kernels(m, feeds) -> int:
    """Kernels that compute a Concat (alone or fused with others)."""
    return sum("Concat" in re.findall(r"(\w+) node", what) for what, _ in m.profile(feeds, runs=1))


def _check(g, blocked: bool, monkeypatch) -> int:
    if not blocked:
        monkeypatch.setenv("KILN_NCHWC", "0")
    xs = random_inputs(g, 3)
    want = Interpreter(g).run(xs)
    m = kiln.compile(g)
    feeds = {v.name: x for v, x in zip(g.inputs, xs)}
    got = m.run(feeds)
    for v, w in zip(g.outputs, want):
        np.testing.assert_allclose(got[v.name], w, rtol=1e-5, atol=1e-5)
    for _ in range(2):      # the arena reused: parts written anew each run
        again = m.run(feeds)
        for v in g.outputs:
            np.testing.assert_array_equal(again[v.name], got[v.name])
    return _concat_kernels(m, feeds)


@pytest.mark.parametrize("blocked", [True, False])
def test_batch1_concat_runs_no_kernel(blocked, monkeypatch):
    assert _check(_sppf(1, 16, 6, 8), blocked, monkeypatch) == 0


@pytest.mark.parametrize("blocked", [True, False])
def test_concat_that_cannot_be_parts_still_copies(blocked, monkeypatch):
    # batch 2: each part is two runs of the result
    assert _check(_sppf(2, 16, 6, 8), blocked, monkeypatch) == 1
    # one value twice: copied
    assert _check(_sppf(1, 16, 4, 4, twice=True), blocked, monkeypatch) == 1
    # a part that is also a graph output: copied in NCHW; blocked, the part is the blocked twin
    # and the graph output its conversion, so the Concat still needs no kernel
    assert _check(_sppf(1, 16, 4, 4, out_part=True), blocked, monkeypatch) == (0 if blocked else 1)


def test_unaligned_parts_are_copied(monkeypatch):
    # NCHW, 3 channels of 5x5 floats: the second part would start 300 bytes in (not 64-aligned)
    assert _check(_sppf(1, 3, 5, 5), False, monkeypatch) == 1


@pytest.mark.parametrize("blocked", [True, False])
def test_concat_joins_no_producer_group_and_runs_no_kernel(blocked, monkeypatch):
    """U-Net's decoder: an up-convolution (1x1 conv, DepthToSpace: an injective kernel the Concat
    would otherwise join, copying the skip inside it) and a skip conv, concatenated, read by a
    conv: both write their parts in place."""
    rng = np.random.default_rng(7)
    h = 4
    body = (f'  %s: float32[1,16,{2 * h},{2 * h}] = Conv(%z, %ws) {{kernel_shape = [1, 1]}} name "skip"\n'
            f'  %u: float32[1,64,{h},{h}] = Conv(%x, %wu, %bu) {{kernel_shape = [1, 1]}} name "up"\n'
            f'  %d: float32[1,16,{2 * h},{2 * h}] = DepthToSpace(%u) {{blocksize = 2, mode = "DCR"}} name "d2s"\n'
            f'  %cat: float32[1,32,{2 * h},{2 * h}] = Concat(%d, %s) {{axis = 1}} name "cat"\n'
            f'  %y: float32[1,16,{2 * h},{2 * h}] = Conv(%cat, %wc) {{kernel_shape = [1, 1]}} name "c"')
    sig = f"(%x: float32[1,16,{h},{h}], %z: float32[1,16,{2 * h},{2 * h}]) -> (%y)"
    g = graph(prog(sig, body, 17), wu=_w(rng, 64, 16, 1, 1), bu=rng.standard_normal(64).astype(F),
              ws=_w(rng, 16, 16, 1, 1), wc=_w(rng, 16, 32, 1, 1))
    assert _check(g, blocked, monkeypatch) == 0


@pytest.mark.parametrize("blocked", [True, False])
def test_concat_that_is_the_graph_output_is_written_by_its_parts(blocked, monkeypatch):
    """YOLO's heads: each scale's conv result reshaped and transposed, concatenated as the graph
    output: each head's kernel writes into the caller's output array; a head also read
    elsewhere (a second output) still works."""
    rng = np.random.default_rng(3)
    body, parts = "", []
    for i, h in enumerate((8, 4)):
        body += (f'  %c{i}: float32[1,48,{h},{h}] = Conv(%x{i}, %w{i}) {{kernel_shape = [1, 1]}} name "head{i}"\n'
                 f'  %r{i}: float32[1,3,16,{h * h}] = Reshape(%c{i}, %s{i}) name "view{i}"\n'
                 f'  %t{i}: float32[1,3,{h * h},16] = Transpose(%r{i}) {{perm = [0, 1, 3, 2]}} name "perm{i}"\n'
                 f'  %q{i}: float32[1,{3 * h * h},16] = Reshape(%t{i}, %u{i}) name "rows{i}"\n')
        parts.append(f"%q{i}")
    body += f'  %y: float32[1,240,16] = Concat({", ".join(parts)}) {{axis = 1}} name "cat"\n  %z: float32[1,48,4,4] = Relu(%c1) name "relu"'
    sig = "(%x0: float32[1,16,8,8], %x1: float32[1,16,4,4]) -> (%y, %z)"
    g = graph(prog(sig, body), w0=_w(rng, 48, 16, 1, 1), w1=_w(rng, 48, 16, 1, 1),
              s0=np.array([1, 3, 16, 64], np.int64), s1=np.array([1, 3, 16, 16], np.int64),
              u0=np.array([1, 192, 16], np.int64), u1=np.array([1, 48, 16], np.int64))
    assert _check(g, blocked, monkeypatch) == 0
