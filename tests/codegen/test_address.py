"""A register tile's address invariants (kiln.codegen.address): the part of each index free of
the tile's unrolled loops is named once before the tile, the tile's accesses add only their
own terms; what may not move (a load's value, a variable bound inside the tile) stays."""

from __future__ import annotations

import re

import numpy as np

from kiln.codegen import build_c, emit_c
from kiln.codegen.address import split
from kiln.dtypes import DType
from kiln.loops import LoopModule, Schedule, compute, lower, placeholder, var
from kiln.loops.expr import load
from kiln.loops.stmt import Buffer

rng = np.random.default_rng(7)


def tiled(fn, name="tiled"):
    """out[i, r, c, l] = fn(x, i, r, c, l) over 5 x 3 x 4 x 16: i a plain loop, (r, c) unrolled, l vectorized."""
    x = placeholder((5, 6, 9, 16), DType.float32, "x")
    out = compute((5, 3, 4, 16), lambda i, r, c, l: fn(x, i, r, c, l), "out", DType.float32)
    s = Schedule(out)
    _, r, c, l = s[out].axis
    s[out].unroll(r)
    s[out].unroll(c)
    s[out].vectorize(l)
    return lower(s, [x, out], name)


def test_tile_reads_through_an_offset_named_before_it_and_matches_numpy():
    func = tiled(lambda x, i, r, c, l: x[(i, r + 1, 2 * c + 1, l)] * 2.0)
    text = emit_c(LoopModule([func]))
    decl = re.search(r"const int64_t (kiln_o\d+) = ([^;]*);", text)
    assert decl is not None, text
    # declared before the tile's first unrolled loop, from the outer loop's variable alone
    assert text.index(decl.group(0)) < text.index("#pragma GCC unroll")
    assert "_i" in decl.group(2) and "_r" not in decl.group(2) and "_c" not in decl.group(2)
    assert f"[{decl.group(1)} + " in text   # the tile's accesses: the offset plus their own terms
    x = rng.standard_normal((5, 6, 9, 16)).astype(np.float32)
    y = np.empty((5, 3, 4, 16), np.float32)
    build_c(func)[func.name](x, y)
    np.testing.assert_array_equal(y, x[:, 1:4, 1:9:2, :] * 2)


def test_split_keeps_constants_loads_and_tile_variables_in_the_access():
    i, j, r = var("i"), var("j"), var("r")
    table = Buffer("t", DType.int64, (8,))
    off, rest = split(i * 100 + r * 16 + j + 3, {r})
    assert str(off) == str(i * 100 + j) and str(rest) == str(r * 16 + 3)
    # a loaded index (a gather's) stays where it is read, a tile variable's term too
    gathered = load(table, (i,)) * 16 + r
    assert split(gathered, {r}) == (None, gathered)
    assert split(r * 4 + 7, {r}) == (None, r * 4 + 7)
    # a subtracted invariant term moves with its sign
    off, rest = split(i * 9 - j + r, {r})
    assert str(off) == str(i * 9 - j) and str(rest) == str(r)
