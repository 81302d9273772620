"""Shape arithmetic shared by op definitions: broadcasting, axes, dims."""

from __future__ import annotations

from typing import Sequence

from kiln.graph.types import Dim


def broadcast_shapes(ctx, *shapes: Sequence[Dim] | None) -> tuple[Dim, ...] | None:
    """Numpy-style multidirectional broadcast of shapes that may hold symbols.

    Returns None when any rank is unknown. Incompatible static dims fail with
    a KilnError naming the node.
    """
    if any(s is None for s in shapes):
        return None
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = []
    for k in range(rank):
        dims = [s[len(s) - rank + k] for s in shapes if len(s) - rank + k >= 0]
        ints = {d for d in dims if isinstance(d, int) and d != 1}
        syms = [d for d in dims if isinstance(d, str)]
        if len(ints) > 1:
            ctx.fail(f"cannot broadcast shapes {', '.join(str(tuple(s)) for s in shapes)}")
        if ints:
            out.append(ints.pop())
        elif syms:
            out.append(syms[0] if len(set(syms)) == 1 else ctx.new_dim())
        else:
            out.append(1)
    return tuple(out)


def normalize_axis(ctx, axis: int, rank: int, what: str = "axis") -> int:
    """Map a possibly negative axis into [0, rank), or fail naming the node."""
    if not -rank <= axis < rank:
        ctx.fail(f"{what} {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def normalize_axes(ctx, axes, rank: int, what: str = "axes") -> list[int]:
    return [normalize_axis(ctx, int(a), rank, what) for a in axes]


def require_nonempty(ctx, shape: Sequence[Dim] | None, axes, what: str) -> None:
    """Fail, naming the node, when a reduction without an identity (ArgMax, a global pool)
    would run over an empty set: some of `axes` of `shape` has a static extent 0. Called by
    inference (a static extent: a compile-time error) and by the reference on the actual
    shape (a symbolic one: a run-time error, where the cpu target's specialisation, which
    infers again on the concrete shape, fails the same way)."""
    if shape is None:
        return
    empty = [a for a in axes if shape[a] == 0]
    if empty:
        ctx.fail(f"{what} over an empty set: input 0 has shape {tuple(shape)}, axis "
                 f"{', '.join(map(str, empty))} of extent 0 (expected at least 1 element: "
                 f"{ctx.node.op} has no value for an empty set)")


def expect_shape(ctx, i: int, want: Sequence[Dim], name: str, scalar_ok: bool = False) -> None:
    """Fail unless input `i` (when present, of known shape) has shape `want` (dims that are
    symbols on either side match anything); `scalar_ok`: a scalar or a 1-element vector too.
    Kernels index such operands by another input's dims, so a mismatch is caught here."""
    if not ctx.has_input(i):
        return
    got = ctx.shape(i)
    if got is None or (scalar_ok and tuple(got) in ((), (1,))):
        return
    if len(got) != len(want) or any(isinstance(g, int) and isinstance(w, int) and g != w
                                     for g, w in zip(got, want)):
        also = " (or a scalar)" if scalar_ok else ""
        ctx.fail(f"input {i} ({name}) has shape {tuple(got)}, expected {tuple(want)}{also}")


def dim_mul(a: Dim, b: Dim, ctx) -> Dim:
    """Product of two dims; symbolic products get a fresh symbol."""
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    if a == 1:
        return b
    if b == 1:
        return a
    return ctx.new_dim()


def static_or_symbol(ctx, value) -> Dim:
    """An int if known, else a fresh symbol."""
    return int(value) if value is not None else ctx.new_dim()
