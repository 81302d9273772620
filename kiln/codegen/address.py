"""Address invariants of a register tile, computed once before it (the C emitter's part,
kiln.codegen.c: Emitter.element).

A register tile is a nest of unrolled loops (a conv's 7 columns x 4 output blocks: 28 FMAs).
Each access's flat index there is a sum of terms, most of them free of the tile's loops
(`(row % 28) * 1792 + icb * 50176 + ii`) and a few of them the tile's own (`ow * 32`).
Written as one expression per access, every unrolled copy carried the whole sum and GCC
spent its time proving the copies' common parts equal: ResNet-18's 1x1 conv kernel took
0.15 s of CPU at -O3. With the invariant part named once before the tile
(`const int64_t o = ...;` then `b[o + ow * 32]`) the same kernel took 0.08 s (GCC 12,
Sapphire Rapids). Only pure index arithmetic of variables bound outside the tile moves (no
load, call or check: their value or failure stays where it was); constants stay with the
access (an addressing mode's displacement).
"""

from __future__ import annotations

from kiln.loops import stmt as S
from kiln.loops.expr import Expr, const, free_vars, walk

_PURE = frozenset({"var", "const", "add", "sub", "mul", "floordiv", "floormod", "truncdiv", "truncmod",
                   "min", "max"})


def bound_inside(s: S.Stmt) -> tuple[set, set]:
    """(the variables `s` binds: loop and Let variables; the buffers it allocates)."""
    names, buffers = set(), set()
    for t in S.walk_stmts(s):
        if isinstance(t, (S.For, S.Let)):
            names.add(t.var)
        elif isinstance(t, S.Allocate):
            buffers.add(t.buffer)
    return names, buffers


def _terms(e: Expr, sign: int, out: list) -> list:
    """`e` as signed terms of its + and - (a list of (sign, term))."""
    if e.op == "add":
        _terms(e.args[0], sign, out)
        _terms(e.args[1], sign, out)
    elif e.op == "sub":
        _terms(e.args[0], sign, out)
        _terms(e.args[1], -sign, out)
    else:
        out.append((sign, e))
    return out


def _sum(terms: list, dtype) -> Expr:
    """The signed terms added up (0 for none)."""
    total = None
    for sign, t in terms:
        if total is None:
            total = t if sign > 0 else const(0, dtype) - t
        else:
            total = total + t if sign > 0 else total - t
    return const(0, dtype) if total is None else total


def split(flat: Expr, inner: set) -> tuple[Expr | None, Expr]:
    """(the part of index `flat` to compute before the tile, None when nothing moves; the rest):
    the terms that are pure index arithmetic free of the tile's variables `inner`, and are not
    constants."""
    terms = _terms(flat, 1, [])
    moved = [(g, t) for g, t in terms if t.op != "const" and not (free_vars(t) & inner)
             and all(x.op in _PURE for x in walk(t))]
    if not moved:
        return None, flat
    kept = [(g, t) for g, t in terms if not any(t is m and g == h for h, m in moved)]
    return _sum(moved, flat.dtype), _sum(kept, flat.dtype)


class Tile:
    """An unrolled nest being emitted: the variables and buffers it binds, and the offsets
    named before it (invariant index -> (C name, C expression))."""

    def __init__(self, nest: S.Stmt):
        self.inner, self.local = bound_inside(nest)
        self.offsets: dict[Expr, tuple[str, str]] = {}

    def element(self, name: str, buf: S.Buffer, flat: Expr, text) -> str:
        """C of element `flat` of buffer `buf` (C name `name`), its invariant part an offset
        named before the tile; `text`: the emitter's C text of an index expression."""
        off, rest = (None, flat) if buf in self.local else split(flat, self.inner)
        if off is None:
            return f"{name}[{text(flat)}]"
        if off not in self.offsets:
            self.offsets[off] = (f"kiln_o{len(self.offsets)}", text(off))
        at = self.offsets[off][0]
        return f"{name}[{at}]" if rest.op == "const" and rest.arg == 0 else f"{name}[{at} + {text(rest)}]"

    def declarations(self, ctype) -> str:
        """The offsets' C declarations (`ctype`: an index dtype's C type)."""
        return " ".join(f"const {ctype(e.dtype)} {name} = {c};" for e, (name, c) in self.offsets.items())

    @staticmethod
    def fits(nest: S.For) -> bool:
        """Whether `nest` may be a tile: no parallel loop inside (outlined with what it captures)."""
        return not any(isinstance(t, S.For) and t.kind == "parallel" for t in S.walk_stmts(nest))
