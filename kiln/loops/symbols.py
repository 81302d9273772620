"""Symbolic sizes in the loop IR: a Buffer dim or a loop extent may be an Expr over
*symbol* vars (a model's `batch`, `seq`), whose values a kernel reads at run time.

One compiled kernel then serves every value of the symbol (TVM Relax, Inductor
dynamic=True). Schedules still take their decisions (tile sizes, serial or parallel)
on ints: `hint(x)` is an int for any extent (a symbol's size hint stands in for its
value), `static(x)` says whether a size is known. A decision taken on a hint must
stay correct for every value: splits of symbolic extents are guarded by the lowering,
tiles pad and clamp, so a hint only changes speed.
"""

from __future__ import annotations

import contextlib
import operator

from kiln.errors import KilnError
from kiln.loops.expr import INDEX, Expr, var, walk

DEFAULT_HINT = 64
SYMBOL_MAX = (1 << 31) - 1   # the largest value a symbol may take (the runtime refuses more)
# the declared size of a dim that is never allocated whole and needs no clamping (a GEMM
# accumulator's, computed a tile at a time): larger than any index a symbol can give
UNBOUNDED = 1 << 40
_HINTS: dict = {}    # symbol var -> its size hint
_LEAST: dict = {}    # symbol var -> its least value, where more than 1
# work (loop iterations) below which a kernel runs serially: the default of kiln.lower.decisions'
# parallel_min_work, and what a parallel loop over a symbolic extent checks at run time
SERIAL_WORK = 1 << 15


def symbol(name: str, hint: int = DEFAULT_HINT, least: int = 1) -> Expr:
    """A fresh symbol var named `name` (a size >= `least` >= 1 known at run time)."""
    v = var(name, INDEX, None, "symbol")
    _HINTS[v] = int(hint)
    if least > 1:   # (vars are hash-consed by name: a name says its least value, `_ge<least>`)
        if not name.endswith(f"_ge{least}"):
            raise KilnError(f"symbol {name!r} of least value {least} must be named ..._ge{least}")
        _LEAST[v] = int(least)
    return v


@contextlib.contextmanager
def hints(values: dict):
    """Symbol vars' hints set to `values` ({var: int}) inside the block (a lowering made for
    small values of a symbol, kiln.lower.generic), restored after."""
    saved = {v: _HINTS.get(v) for v in values}
    _HINTS.update({v: int(h) for v, h in values.items()})
    try:
        yield
    finally:
        for v, h in saved.items():
            if h is None:
                _HINTS.pop(v, None)
            else:
                _HINTS[v] = h


def least(v: Expr) -> int:
    """The least value of symbol var `v` (1 unless made with more)."""
    return _LEAST.get(v, 1)


def is_symbol(e) -> bool:
    return isinstance(e, Expr) and e.op == "var" and e.arg.kind == "symbol"


def static(x) -> bool:
    """Is size `x` known at compile time (an int, or a constant Expr)?"""
    return not isinstance(x, Expr) or x.op == "const"


def as_int(x) -> int | None:
    """Size `x` as an int when static, else None."""
    if not isinstance(x, Expr):
        return int(x)
    return int(x.arg) if x.op == "const" else None


def symbols_in(e) -> list:
    """The symbol vars size expression `e` (an int, an Expr, or a shape tuple) mentions."""
    if isinstance(e, (tuple, list)):
        out: list = []
        for x in e:
            out += [s for s in symbols_in(x) if s not in out]
        return out
    if not isinstance(e, Expr):
        return []
    return [x for x in walk(e) if is_symbol(x)]


_EVAL = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "floordiv": operator.floordiv,
         "floormod": operator.mod, "min": min, "max": max}


def evaluate(x, values: dict) -> int:
    """Size `x` for symbol values {symbol var: int} (a direct walk: a new input shape plans
    its arena by evaluating every buffer's size, so this must be quick)."""
    if not isinstance(x, Expr):
        return int(x)

    def ev(e):
        if e.op == "const":
            return int(e.arg)
        if e.op == "var":
            if e not in values:
                raise KilnError(f"size {x} names {e.name}, which has no value here", stage="run")
            return int(values[e])
        if e.op == "cast" and not e.dtype.is_float:
            return ev(e.args[0])
        f = _EVAL.get(e.op)
        if f is None:
            raise KilnError(f"size {x} is not integer arithmetic on symbols", stage="run")
        return f(*(ev(a) for a in e.args))
    return ev(x)


def hint(x) -> int:
    """An int standing in for size `x` in schedule decisions (a symbol's hint). A symbolic
    size is at least 1 (the generic module's guards keep its sizes so), though floor
    divisions at the hints may give less (the eighth halving of an audio length of 64)."""
    if not isinstance(x, Expr):
        return int(x)
    syms = symbols_in(x)
    return max(evaluate(x, {s: _HINTS.get(s, DEFAULT_HINT) for s in syms}), 1 if syms else 0)


_PROBES = ({}, {})   # filled lazily: two sets of large pseudo-random symbol values


def same_size(a, b) -> bool:
    """Are sizes `a` and `b` equal for every value of their symbols? Static sizes are
    compared; symbolic ones (integer polynomials of the symbols: products, sums) are
    evaluated at pseudo-random large values, where unequal polynomials differ."""
    if static(a) and static(b):
        return as_int(a) == as_int(b)
    if a is b:
        return True
    syms = symbols_in((a, b))
    for k, probe in enumerate(_PROBES):
        for s in syms:
            if s not in probe:
                probe[s] = 1_000_003 + 7919 * len(probe) + 104_729 * k
        if evaluate(a, probe) != evaluate(b, probe):
            return False
    return True


_C_OPS = {"add": "+", "sub": "-", "mul": "*"}


def c_size(x) -> str:
    """Size `x` as C text for a hand-written kernel's body: an int, or an expression of the
    symbol vars by name (a shape-generic module declares them as the kernel's locals,
    kiln.lower.generic). Raises KilnError for what is not +, -, * of sizes or a floor
    division of one by a positive int."""
    if static(x):
        return str(as_int(x))

    def go(e) -> str:
        if e.op == "const":
            return str(int(e.arg))
        if e.op == "var" and e.arg.kind == "symbol":
            return e.arg.name
        if e.op in _C_OPS:
            return f"({go(e.args[0])} {_C_OPS[e.op]} {go(e.args[1])})"
        if e.op == "floordiv" and e.args[1].op == "const" and int(e.args[1].arg) > 0:
            # a floor-division size (a strided window's, kiln.lower.symbolic_shapes): its
            # numerator is >= 0 there (guarded), where C's truncating division is the floor
            return f"({go(e.args[0])} / {int(e.args[1].arg)})"
        if e.op == "cast" and not e.dtype.is_float:
            return go(e.args[0])
        raise KilnError(f"size {x} is not a sum of products of symbols (or their floor divisions)",
                        stage="lower")
    return go(x)


def smin(a, b):
    """min of two sizes: an int when both are static, else the static one (an upper bound
    used as a tile size) or a min Expr."""
    if static(a) and static(b):
        return min(as_int(a), as_int(b))
    from kiln.loops.expr import min_
    return min_(a, b)


def ceildiv(n, f):
    """ceil(n / f) for a size n (int or Expr) and a positive int f."""
    if static(n):
        return -(-as_int(n) // f)
    return (n + (f - 1)) // f if f != 1 else n


def extent(v: Expr) -> int:
    """A loop var's extent for schedule decisions: its int, or its hint when symbolic."""
    return hint(v.arg.dom[1])


def size_hint(shape) -> int:
    """The number of elements of `shape` (ints and symbolic sizes), symbols at their hints."""
    out = 1
    for d in shape:
        out *= hint(d)
    return out
