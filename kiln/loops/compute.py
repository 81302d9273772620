"""Halide/TVM-style compute definitions: *what* is computed, never how.

A `Tensor` is a Buffer that also remembers how it is produced: `op is None` for a
placeholder (an input), or a `ComputeOp` (axis vars + body Expr). Bodies read other
tensors with `T[i, j]`, i.e. ordinary loads of those buffers, so lowering needs no
separate tensor-access node. A reduction must be the whole body (as in TVM).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from kiln.dtypes import DType
from kiln.errors import KilnError
from kiln.loops.expr import Expr, as_expr, cast, reduce_identity, var, walk
from kiln.loops.stmt import Buffer


@dataclass(frozen=True, eq=False)
class ComputeOp:
    axis: tuple          # spatial iteration vars, one per output dim
    body: Expr

    @property
    def reduce_axis(self) -> tuple:
        return self.body.arg[1] if self.body.op == "reduce" else ()


@dataclass(frozen=True, eq=False, repr=False)
class Tensor(Buffer):
    op: ComputeOp | None = None

    @property
    def axis(self) -> tuple:
        return self.op.axis if self.op else ()

    @property
    def reduce_axis(self) -> tuple:
        return self.op.reduce_axis if self.op else ()

    @property
    def inputs(self) -> list:
        """Tensors this one reads, in first-use order."""
        if self.op is None:
            return []
        out = []
        for e in walk(self.op.body):
            if e.op == "load" and e.arg not in out:
                out.append(e.arg)
        return out

    def __repr__(self):
        return f"Tensor({self.name}, {self.dtype}, {list(self.shape)})"


def placeholder(shape, dtype: DType, name: str) -> Tensor:
    return Tensor(name, dtype, tuple(shape))


def reduce_axis(extent_or_range, name: str = "k") -> Expr:
    """A reduction variable over range(extent) or range(lo, hi)."""
    if isinstance(extent_or_range, (tuple, list)):
        lo, hi = extent_or_range
    else:
        lo, hi = 0, extent_or_range
    if isinstance(hi, Expr) or isinstance(lo, Expr):   # a symbolic extent (kiln.loops.symbols)
        return var(name, dom=(lo, _size(hi - lo)), kind="reduce")
    if hi < lo:
        raise KilnError(f"reduce_axis {name!r} has a negative range [{lo}, {hi})")
    return var(name, dom=(int(lo), int(hi - lo)), kind="reduce")


def _empty_domain(v: Expr) -> bool:
    extent = v.arg.dom[1]
    return not isinstance(extent, Expr) and int(extent) == 0


def _size(s):
    """A dim: an int, or a symbolic size Expr (a constant one as its int)."""
    if isinstance(s, Expr):
        return int(s.arg) if s.op == "const" else s
    return int(s)


def compute(shape, fn, name: str, dtype: DType | None = None) -> Tensor:
    """Tensor of `shape` whose element at (i, j, ...) is fn(i, j, ...)."""
    shape = tuple(_size(s) for s in shape)
    try:
        params = list(inspect.signature(fn).parameters.values())
        names = [p.name for p in params] if all(p.kind == p.POSITIONAL_OR_KEYWORD for p in params) \
            and len(params) == len(shape) else None
    except (TypeError, ValueError):
        names = None
    names = names or [f"i{d}" for d in range(len(shape))]
    axis = tuple(var(nm, dom=(0, s)) for nm, s in zip(names, shape))
    body = as_expr(fn(*axis), dtype)
    if body.op == "reduce" and any(_empty_domain(a) for a in body.arg[1]):
        # a reduction over an empty set is its combiner's identity (a sum 0, a max -inf): no
        # loop over nothing is made, and no schedule has to split an extent of 0
        body = reduce_identity(body.arg[0], body.dtype)
    if dtype is not None:
        body = cast(dtype, body) if body.op != "reduce" else body
    for e in walk(body):
        if e.op == "reduce" and e is not body:
            raise KilnError(f"compute {name!r}: a reduction must be the whole body "
                            f"(compute it as its own tensor first)")
    if body.op == "reduce" and dtype is not None and body.dtype is not dtype:
        raise KilnError(f"compute {name!r}: reduction dtype {body.dtype} differs from requested {dtype}")
    return Tensor(name, body.dtype, shape, op=ComputeOp(axis, body))
