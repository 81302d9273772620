"""Pieces of the C emitter's straight vector code (kiln.codegen.c, Emitter.vector_store) that
need nothing of the emitter: flat indices, a lane variable's coefficient, and loads of one
vector's lanes in another order (a grouped conv's lane rotations, kiln.lower.nchwc).
"""

from __future__ import annotations

from kiln.loops import stmt as S
from kiln.loops.expr import Expr, free_vars, substitute
from kiln.loops.simplify import Ctx

# a vector's lanes in another order (constant indices): GCC's __builtin_shuffle, clang's
# __builtin_shufflevector (GCC has the latter only from 12)
PERMUTE = """#if defined(__clang__)
#define KILN_PERMUTE(it, v, ...) __builtin_shufflevector(v, v, __VA_ARGS__)
#else
#define KILN_PERMUTE(it, v, ...) __builtin_shuffle(v, (it){__VA_ARGS__})
#endif"""


class _NotVector(Exception):
    """An expression Emitter.vector_store does not write as vector code."""


def _coefficient(e: Expr, v: Expr) -> int | None:
    """c when `e` is c * v plus terms free of v (v only under + - and * by constants), else None."""
    if v not in free_vars(e):
        return 0
    if e is v:
        return 1
    if e.op in ("add", "sub"):
        a, b = (_coefficient(x, v) for x in e.args)
        return None if a is None or b is None else a + b if e.op == "add" else a - b
    if e.op == "mul":
        (a, b), c = e.args, None
        if a.op == "const":
            a, b = b, a
        if b.op == "const" and (c := _coefficient(a, v)) is not None:
            return c * b.arg
    return None


def _flat(buf: S.Buffer, idx) -> Expr:
    """The row-major flat index of `idx` into `buf` (not simplified)."""
    total = None
    for i, st in zip(idx, buf.strides):
        term = i if st == 1 else i * st
        total = term if total is None else total + term
    return total


def permuted_lanes(buf: S.Buffer, idx, v: Expr, lo: Expr, lanes: int, ctx: Ctx) -> tuple[int, list[int]] | None:
    """(base, order) when the `lanes` lanes of v (from lo) read buf's elements base + order[i] of
    its last axis (stride 1), order a permutation of range(lanes), the other indices free of v;
    else None."""
    if not idx or buf.strides[-1] != 1 or any(v in free_vars(i) for i in idx[:-1]):
        return None
    at = [ctx.simplify(substitute(idx[-1], {v: lo + i})) for i in range(lanes)]
    if any(o.op != "const" for o in at):
        return None
    base = min(int(o.arg) for o in at)
    order = [int(o.arg) - base for o in at]
    return (base, order) if sorted(order) == list(range(lanes)) else None
