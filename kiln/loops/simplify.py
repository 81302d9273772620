"""Index simplifier: rewrite rules as data plus a small interval (bound) analysis.

A rule is `(pattern, replacement)` in the style of Halide's `rewrite(x + 0, x)`:
patterns are built with the same operators as Exprs from wildcards (`x`, `y`) and
constant wildcards (`c1`, `c2`); a replacement is a wildcard (return its binding)
or a function of the bindings (and the bound context) returning an Expr, or None
when a side condition fails. Algebraic rules fire on integer/bool nodes only, so
float semantics (-0.0, NaN) are never changed; constant folding uses NumPy scalars
of the node's dtype so folded values equal what C computes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from kiln.dtypes import DType
from kiln.loops.expr import BINARY, Expr, const, max_, min_, rebuild, substitute
from kiln.loops.symbols import SYMBOL_MAX, least
from kiln.loops import stmt as S

COMMUTATIVE = {"add", "mul", "min", "max", "eq", "ne", "and", "or", "bitand", "bitor", "bitxor"}


# -- patterns ------------------------------------------------------------------

@dataclass(frozen=True)
class Pat:
    op: str | None = None        # None matches any node
    args: tuple = ()
    name: str | None = None      # bind the matched node under this name
    value: Any = None            # for op == "const": the literal to match (None: any const)

    def _b(self, op, o, rev=False):
        o = o if isinstance(o, Pat) else Pat("const", value=o)
        return Pat(op, (o, self) if rev else (self, o))

    def __add__(self, o): return self._b("add", o)
    def __radd__(self, o): return self._b("add", o, True)
    def __sub__(self, o): return self._b("sub", o)
    def __mul__(self, o): return self._b("mul", o)
    def __floordiv__(self, o): return self._b("floordiv", o)
    def __mod__(self, o): return self._b("floormod", o)
    def __lt__(self, o): return self._b("lt", o)
    def __le__(self, o): return self._b("le", o)


def P(op, *args): return Pat(op, tuple(a if isinstance(a, Pat) else Pat("const", value=a) for a in args))


def match(p: Pat, e: Expr, env: dict) -> dict | None:
    if p.op is not None:
        if p.op != e.op or len(p.args) != len(e.args):
            return None
        if p.op == "const" and p.value is not None and e.arg != p.value:
            return None
    if p.name is not None:
        if p.name in env:
            return env if env[p.name] is e else None
        env = {**env, p.name: e}
    if not p.args:
        return env
    orders = [e.args, e.args[::-1]] if p.op in COMMUTATIVE else [e.args]
    for args in orders:
        out = env
        for pa, ea in zip(p.args, args):
            out = match(pa, ea, out)
            if out is None:
                break
        if out is not None:
            return out
    return None


def compiled(p: Pat):
    """`match(p, {})` as a function of the expression alone, made of closures for pattern `p`:
    the same bindings, found in the same order (a commutative node tries its args as given,
    then swapped, each child keeping the first match it finds). The simplifier tries tens of
    rules per node, and walking the `Pat` trees was most of its time (ResNet-18: 166K calls
    of `match`, 0.15 s of a cold compile's Python)."""
    m = _matcher(p)
    return lambda e: m(e, _NO_BINDINGS)


_NO_BINDINGS: dict = {}   # (never written: a binding makes a new dict)


def _matcher(q: Pat):
    """A function `(e, env) -> env | None` matching `q` against `e` with bindings `env`."""
    op, name, n = q.op, q.name, len(q.args)
    if not n:
        value = q.value if op == "const" else None
        if op is None:           # a wildcard
            def leaf(e, env):
                if name in env:
                    return env if env[name] is e else None
                return {**env, name: e}
            return leaf
        if name is None:         # a literal
            def literal(e, env):
                return env if e.op == op and not e.args and (value is None or e.arg == value) else None
            return literal

        def bound(e, env):       # a constant wildcard
            if e.op != op or e.args or (value is not None and e.arg != value):
                return None
            if name in env:
                return env if env[name] is e else None
            return {**env, name: e}
        return bound
    kids = [_matcher(a) for a in q.args]
    orders = [tuple(range(n)), tuple(range(n))[::-1]] if op in COMMUTATIVE else [tuple(range(n))]
    if n == 2 and name is None:
        k0, k1 = kids
        swap = len(orders) == 2

        def pair(e, env):
            if e.op != op:
                return None
            a = e.args
            if len(a) != 2:
                return None
            out = k0(a[0], env)
            if out is not None:
                out = k1(a[1], out)
                if out is not None or not swap:
                    return out
            elif not swap:
                return None
            out = k0(a[1], env)
            return None if out is None else k1(a[0], out)
        return pair

    def node(e, env):
        if e.op != op or len(e.args) != n:
            return None
        if name is not None:
            if name in env:
                return env if env[name] is e else None
            env = {**env, name: e}
        for order in orders:
            out = env
            for kid, k in zip(kids, order):
                out = kid(e.args[k], out)
                if out is None:
                    break
            else:
                return out
        return None
    return node


# -- bounds ----------------------------------------------------------------------

class Ctx:
    """Known integer ranges of variables (inclusive), and memoized bounds/simplify."""

    def __init__(self, ranges: dict | None = None):
        self.ranges = dict(ranges or {})
        self._bounds: dict = {}
        self._simp: dict = {}

    def bounds(self, e: Expr) -> tuple:
        """Inclusive (lo, hi) of an integer expression; either may be None (unknown)."""
        if e.dtype.is_float:
            return (None, None)
        hit = self._bounds.get(e)
        if hit is None:
            hit = self._bounds[e] = _bounds(self, e)
        return hit

    def within(self, e: Expr, lo: int, hi: int) -> bool:
        a, b = self.bounds(e)
        return a is not None and b is not None and a >= lo and b <= hi

    def simplify(self, e: Expr) -> Expr:
        if not e.args:    # a var or a constant: no rule rewrites one (every pattern has an op with args)
            return e
        hit = self._simp.get(e)
        if hit is not None:
            return hit
        node = rebuild(e, tuple([self.simplify(a) for a in e.args]))
        for _ in range(64):
            new = _apply_rules(self, node)
            if new is None or new is node:
                break
            node = rebuild(new, tuple([self.simplify(a) for a in new.args]))
        self._simp[e] = node
        return node


def _int_bound(b):
    """A range end as an int, or None where it is symbolic (an Expr: unknown here)."""
    if isinstance(b, Expr):
        return b.arg if b.op == "const" and not b.dtype.is_float else None
    return b


def _bounds(ctx: Ctx, e: Expr):
    op = e.op
    if op == "const":
        return (e.arg, e.arg)
    if op == "var":
        if e in ctx.ranges:
            lo, hi = ctx.ranges[e]
            return (_int_bound(lo) if not isinstance(lo, Expr) else ctx.bounds(lo)[0],
                    _int_bound(hi) if not isinstance(hi, Expr) else ctx.bounds(hi)[1])
        if e.arg.kind == "symbol":     # a size known at run time (kiln.loops.symbols)
            return (least(e), SYMBOL_MAX)
        dom = e.arg.dom
        if not dom:
            return (None, None)
        lo, n = _int_bound(dom[0]), _int_bound(dom[1])
        return (lo, None if lo is None or n is None else lo + n - 1)
    if e.dtype is DType.bool:
        return (0, 1)
    if op == "cast":
        src = e.args[0]
        if not src.dtype.is_float and src.dtype.itemsize <= e.dtype.itemsize and src.dtype.is_signed == e.dtype.is_signed:
            return ctx.bounds(src)
        return (None, None)
    if op == "check":
        return ctx.bounds(e.args[0])
    if op == "select":
        (a, b), (c, d) = ctx.bounds(e.args[1]), ctx.bounds(e.args[2])
        return (None if a is None or c is None else min(a, c), None if b is None or d is None else max(b, d))
    if op not in BINARY or len(e.args) != 2:
        return (None, None)
    (a, b), (c, d) = ctx.bounds(e.args[0]), ctx.bounds(e.args[1])
    known = None not in (a, b, c, d)
    if op == "add":
        return (None if a is None or c is None else a + c, None if b is None or d is None else b + d)
    if op == "sub":
        return (None if a is None or d is None else a - d, None if b is None or c is None else b - c)
    if op == "mul" and known:
        ps = (a * c, a * d, b * c, b * d)
        return (min(ps), max(ps))
    if op == "floormod" and c is not None and c > 0:
        if known and a >= 0 and b < c:
            return (a, b)
        return (0, d - 1) if d is not None else (None, None)
    if op == "floordiv" and known and c > 0:
        qs = (a // c, a // d, b // c, b // d)
        return (min(qs), max(qs))
    if op == "min":
        hi = b if d is None else d if b is None else min(b, d)
        return (min(a, c) if a is not None and c is not None else None, hi)
    if op == "max":
        lo = a if c is None else c if a is None else max(a, c)
        return (lo, max(b, d) if b is not None and d is not None else None)
    return (None, None)


# -- constant folding --------------------------------------------------------

_NP_FOLD: dict[str, Callable] = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b, "floordiv": lambda a, b: a // b, "floormod": lambda a, b: a % b,
    "min": min, "max": max, "lt": lambda a, b: a < b, "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b, "eq": lambda a, b: a == b, "ne": lambda a, b: a != b,
    "and": lambda a, b: bool(a) and bool(b), "or": lambda a, b: bool(a) or bool(b),
    "bitand": lambda a, b: a & b, "bitor": lambda a, b: a | b, "bitxor": lambda a, b: a ^ b,
}


def fold(e: Expr) -> Expr | None:
    """Fold an operator whose operands are all constants (None when not foldable)."""
    if not e.args or any(a.op != "const" for a in e.args):
        return None
    vals = [np.array(a.arg, dtype=a.dtype.np)[()] for a in e.args]
    if e.op in ("floordiv", "floormod", "div") and vals[1] == 0:
        return None
    if e.op in ("min", "max") and e.dtype.is_float and any(np.isnan(v) for v in vals):
        return None
    with np.errstate(all="ignore"):
        if e.op in _NP_FOLD:
            if e.dtype.is_float and e.op in ("min", "max"):
                return None  # leave NaN/-0.0 propagation to the target's helper
            r = _NP_FOLD[e.op](*vals)
        elif e.op == "not":
            r = not vals[0]
        elif e.op == "select":
            return e.args[1] if vals[0] else e.args[2]
        elif e.op == "cast" and not e.dtype.is_float and not e.args[0].dtype.is_float:
            r = np.array(vals[0]).astype(e.dtype.np)[()]
        else:
            return None
    return const(r.item() if hasattr(r, "item") else r, e.dtype)


# -- the rules ---------------------------------------------------------------

x, y, z, w = Pat(name="x"), Pat(name="y"), Pat(name="z"), Pat(name="w")
c1, c2 = Pat("const", name="c1"), Pat("const", name="c2")
c3, c4, c5 = Pat("const", name="c3"), Pat("const", name="c4"), Pat("const", name="c5")


def _c(v, like: Expr) -> Expr:
    return const(v, like.dtype)


def _cmp_by_bounds(op):
    """x OP y decided by the bounds of x - y."""
    def rule(ctx, x, y):
        if _sym_le(ctx, x, y, 1 if op == "lt" else 0):   # a loop over a symbolic extent
            return const(1, DType.bool)
        if op == "lt" and _sym_lt(ctx, x, y):
            return const(1, DType.bool)
        lo, hi = ctx.bounds(x - y)
        decide = {"lt": (hi is not None and hi < 0, lo is not None and lo >= 0),
                  "le": (hi is not None and hi <= 0, lo is not None and lo > 0)}[op]
        return const(1, DType.bool) if decide[0] else const(0, DType.bool) if decide[1] else None
    return rule


def _sym_le(ctx, x, y, less: int = 0) -> bool:
    """x <= y - less for a loop var x over a symbolic extent (kiln.loops.symbols): its last
    index minus y folds to a constant <= -less."""
    if x.op != "var" or not isinstance(ctx.ranges.get(x, (None, None))[1], Expr):
        return False
    gap = ctx.simplify(ctx.ranges[x][1] - y)
    return gap.op == "const" and gap.arg <= -less


_DIGITS = ("floormod", "floordiv")


def _below(ctx, x, y) -> bool:
    """0 <= x < y, x a loop var over a symbolic extent."""
    lo = ctx.bounds(x)[0]
    return lo is not None and lo >= 0 and _sym_le(ctx, x, y, 1)


def _sym_lt(ctx, x, y) -> bool:
    """x < y for the digits of a fused loop over symbolic extents: x % y < y (y >= 1), and
    v // d < y where v's last index is below y * d (kiln.loops.symbols)."""
    if x.op == "floormod" and x.args[1] is y:
        lo = ctx.bounds(y)[0]
        return lo is not None and lo >= 1
    if x.op == "floordiv":
        d, hi = x.args[1], _sym_hi(ctx, x.args[0])
        lo = ctx.bounds(d)[0]
        if hi is None or lo is None or lo < 1:
            return False
        gap = ctx.simplify(hi - y * d)
        return gap.op == "const" and gap.arg < 0
    return False


def _sym_hi(ctx, e):
    """A symbolic upper bound of index `e`: a loop var's last index (an Expr), or that of a
    quotient of one by a positive constant; None when there is none."""
    if e.op == "var" and isinstance(ctx.ranges.get(e, (None, None))[1], Expr):
        return ctx.ranges[e][1]
    if e.op == "floordiv" and (ctx.bounds(e.args[1])[0] or 0) >= 1:
        hi = _sym_hi(ctx, e.args[0])
        return None if hi is None else ctx.simplify(hi // e.args[1])
    return None


def _minmax_by_bounds(op):
    def rule(ctx, x, y):
        if _sym_le(ctx, x, y) or (x.op in _DIGITS and _sym_lt(ctx, x, ctx.simplify(y + 1))):
            return x if op == "min" else y
        if _sym_le(ctx, y, x) or (y.op in _DIGITS and _sym_lt(ctx, y, ctx.simplify(x + 1))):
            return y if op == "min" else x
        (a, b), (c, d) = ctx.bounds(x), ctx.bounds(y)
        if b is not None and c is not None and b <= c:
            return x if op == "min" else y
        if d is not None and a is not None and d <= a:
            return y if op == "min" else x
        return None
    return rule


def _div_by_bounds(ctx, x, c1):
    lo, hi = ctx.bounds(x)
    if c1.arg > 0 and lo is not None and hi is not None and lo // c1.arg == hi // c1.arg:
        return _c(lo // c1.arg, x)
    return None


def _mod_by_bounds(ctx, x, c1):
    lo, hi = ctx.bounds(x)
    if c1.arg > 0 and lo is not None and hi is not None and lo // c1.arg == hi // c1.arg:
        q = lo // c1.arg
        return x if q == 0 else x - q * c1.arg
    return None


def _pos(*cs):
    return all(c.arg > 0 for c in cs)


def _true(e): return const(1, DType.bool)
def _false(e): return const(0, DType.bool)


# (pattern, replacement). Replacement: a wildcard Pat, or f(ctx, **bindings) -> Expr | None.
INT_RULES: list[tuple[Pat, Any]] = [
    (c1 + x, lambda ctx, c1, x: x + c1 if x.op != "const" else None),      # constants to the right
    (c1 * x, lambda ctx, c1, x: x * c1 if x.op != "const" else None),
    (x + 0, x), (x - 0, x), (x * 1, x), (x // 1, x),
    (x * 0, lambda ctx, x: _c(0, x)), (x % 1, lambda ctx, x: _c(0, x)),
    (x - x, lambda ctx, x: _c(0, x)),
    (x - c1, lambda ctx, x, c1: x + (-c1.arg) if x.op != "const" else None),
    ((x + c1) + c2, lambda ctx, x, c1, c2: x + (c1.arg + c2.arg)),
    ((x + c1) + y, lambda ctx, x, c1, y: (x + y) + c1 if y.op != "const" else None),
    ((x * c1) * c2, lambda ctx, x, c1, c2: x * (c1.arg * c2.arg)),
    ((x + c1) * c2, lambda ctx, x, c1, c2: x * c2.arg + c1.arg * c2.arg),
    ((x + y) * c1, lambda ctx, x, y, c1: x * c1 + y * c1),
    ((x + y) - y, x), ((x + y) - x, y),
    (x * c1 + x * c2, lambda ctx, x, c1, c2: x * (c1.arg + c2.arg)),
    (x * c1 + x, lambda ctx, x, c1: x * (c1.arg + 1)),
    (x + x, lambda ctx, x: x * 2),
    # floor division / modulo (exact for floor semantics whatever the sign of x, y)
    ((x * c1) // c1, lambda ctx, x, c1: x if c1.arg != 0 else None),
    ((x * c1) % c1, lambda ctx, x, c1: _c(0, x) if c1.arg != 0 else None),
    ((x * c1 + y) // c1, lambda ctx, x, c1, y: x + y // c1 if c1.arg > 0 else None),
    ((x * c1 + y) % c1, lambda ctx, x, c1, y: y % c1 if c1.arg > 0 else None),
    ((x * c1) // c2, lambda ctx, x, c1, c2: x * (c1.arg // c2.arg) if _pos(c1, c2) and c1.arg % c2.arg == 0 else None),
    ((x * c1) % c2, lambda ctx, x, c1, c2: _c(0, x) if _pos(c1, c2) and c1.arg % c2.arg == 0 else None),
    ((x * c1 + y) // c2, lambda ctx, x, c1, y, c2:
        x * (c1.arg // c2.arg) + y // c2 if _pos(c1, c2) and c1.arg % c2.arg == 0 else None),
    ((x * c1 + y) % c2, lambda ctx, x, c1, y, c2:
        y % c2 if _pos(c1, c2) and c1.arg % c2.arg == 0 else None),
    ((x // c1) // c2, lambda ctx, x, c1, c2: x // (c1.arg * c2.arg) if _pos(c1, c2) else None),
    ((x % c1) % c2, lambda ctx, x, c1, c2: x % c2 if _pos(c1, c2) and c1.arg % c2.arg == 0 else None),
    ((x % c1) // c2, lambda ctx, x, c1, c2: (x // c2) % (c1.arg // c2.arg) if _pos(c1, c2) and c1.arg % c2.arg == 0 else None),
    ((x // c1) * c1 + x % c1, x),
    ((y + (x // c1) * c1) + x % c1, lambda ctx, y, x, c1: y + x),
    (((x // c1) % c2) * c1 + x % c1, lambda ctx, x, c1, c2: x % (c1.arg * c2.arg) if _pos(c1, c2) else None),
    ((y + ((x // c1) % c2) * c1) + x % c1, lambda ctx, y, x, c1, c2:
        y + x % (c1.arg * c2.arg) if _pos(c1, c2) else None),
    # re-joining a fused loop's digits: x//(c3*c4)*(c4*c5) + (x//c3 % c4)*c5 == x//c3*c5
    ((x // c1) * c2 + ((x // c3) % c4) * c5, lambda ctx, x, c1, c2, c3, c4, c5:
        (x // c3) * c5.arg if _pos(c1, c3) and c1.arg == c3.arg * c4.arg and c2.arg == c4.arg * c5.arg
        else None),
    ((x // c1) * c2 + (x % c4) * c5, lambda ctx, x, c1, c2, c4, c5:
        x * c5.arg if _pos(c1, c4) and c1.arg == c4.arg and c2.arg == c4.arg * c5.arg else None),
    ((x // c1) * c1 + (x % c1 + y), lambda ctx, x, c1, y: x + y),
    # the same by a symbolic divisor (a fused loop over a symbolic extent, e.g. a GEMM's rows
    # folded over a batch of symbolic M rows each): exact for floor division by any z != 0
    ((x // z) * z + x % z, lambda ctx, x, z: x if z.op != "const" else None),
    ((y + (x // z) * z) + x % z, lambda ctx, y, x, z: y + x if z.op != "const" else None),
    # and scaled by a stride (a row-major address over symbolic dims: digit * (size * stride))
    ((x // y) * (y * z) + (x % y) * z, lambda ctx, x, y, z: x * z if y.op != "const" else None),
    ((w + (x // y) * (y * z)) + (x % y) * z, lambda ctx, w, x, y, z: w + x * z if y.op != "const" else None),
    (x // c1, _div_by_bounds), (x % c1, _mod_by_bounds),
    # a guard on a fused loop's leading digit (a symbolic extent): x // y < z is x < z * y for y >= 1
    (x // y < z, lambda ctx, x, y, z: x < z * y if y.op != "const" and (ctx.bounds(y)[0] or 0) >= 1 else None),
    # a bound on a digit by a constant and a constant moved across a comparison: a zero border's
    # guard on a fused loop of columns x lanes (a padded copy of a 3-channel stem input checked
    # 0 <= v // 3 + -1, an int64 division a lane in a vector loop) reads 3 <= v
    (c1 <= x // c2, lambda ctx, c1, x, c2: _c(c1.arg * c2.arg, x) <= x if c2.arg > 0 else None),
    (x // c2 < c1, lambda ctx, x, c2, c1: x < _c(c1.arg * c2.arg, x) if c2.arg > 0 else None),
    (c1 <= x + c2, lambda ctx, c1, x, c2: _c(c1.arg - c2.arg, x) <= x),
    (x + c1 < c2, lambda ctx, x, c1, c2: x < _c(c2.arg - c1.arg, x)),
    # comparisons and min/max decided by bounds
    (x < y, _cmp_by_bounds("lt")), (x <= y, _cmp_by_bounds("le")),
    (P("gt", x, y), lambda ctx, x, y: y < x), (P("ge", x, y), lambda ctx, x, y: y <= x),
    (P("min", x, x), x), (P("max", x, x), x),
    (P("min", x, y) - z, lambda ctx, x, y, z: min_(x - z, y - z)),
    (P("max", x, y) - z, lambda ctx, x, y, z: max_(x - z, y - z)),
    (P("min", x, y), _minmax_by_bounds("min")), (P("max", x, y), _minmax_by_bounds("max")),
    (P("min", P("max", x, y), x), x), (P("max", P("min", x, y), x), x),
    # a loop var below a symbolic divisor (kiln.loops.symbols): x // y == 0, x % y == x
    (x // y, lambda ctx, x, y: _c(0, x) if y.op != "const" and _below(ctx, x, y) else None),
    (x % y, lambda ctx, x, y: x if y.op != "const" and _below(ctx, x, y) else None),
    # a fused loop's digit by a symbolic extent (kiln.loops.symbols): (x*y - 1) // y == x - 1
    ((x * y + c1) // y, lambda ctx, x, y, c1: x + (-1) if c1.arg == -1 and (ctx.bounds(y)[0] or 0) >= 1
        else None),
    (P("min", x + c1, x + c2), lambda ctx, x, c1, c2: x + min(c1.arg, c2.arg)),
    (P("max", x + c1, x + c2), lambda ctx, x, c1, c2: x + max(c1.arg, c2.arg)),
    # logic
    (P("and", x, 1), x), (P("and", x, 0), lambda ctx, x: _false(x)), (P("and", x, x), x),
    (P("or", x, 0), x), (P("or", x, 1), lambda ctx, x: _true(x)), (P("or", x, x), x),
    (P("not", P("not", x)), x),
]

ANY_RULES: list[tuple[Pat, Any]] = [
    (P("select", 1, x, y), x), (P("select", 0, x, y), y), (P("select", z, x, x), x),
    (P("check", x, 1, y), x),   # a check proven to pass
]


def _index(*tables):
    """op -> [(matcher, name of the wildcard returned or None, replacement)], the rules of
    `tables` in order (each pattern's matcher as `compiled` makes it)."""
    out: dict = {}
    for rules in tables:
        for pat, rep in rules:
            assert pat.args, f"rule {pat}: Ctx.simplify never tries rules on a node without args"
            out.setdefault(pat.op, []).append((_matcher(pat), rep.name if isinstance(rep, Pat) else None, rep))
    return out


# the algebraic rules then the others, for integer/bool nodes of integer/bool operands; the
# others alone for the rest
_INT, _ANY = _index(INT_RULES, ANY_RULES), _index(ANY_RULES)


def _apply_rules(ctx: Ctx, e: Expr) -> Expr | None:
    folded = fold(e)
    if folded is not None:
        return folded
    table = _ANY if e.dtype.is_float or any(a.dtype.is_float for a in e.args) else _INT
    for matcher, name, rep in table.get(e.op, ()):
        env = matcher(e, _NO_BINDINGS)
        if env is None:
            continue
        out = env[name] if name is not None else rep(ctx, **env)
        if out is not None and out is not e:
            return out
    return None


def simplify(e: Expr, ranges: dict | None = None) -> Expr:
    """Simplify an expression given inclusive integer ranges {var: (lo, hi)}."""
    return Ctx(ranges).simplify(e)


def prove(cond: Expr, ranges: dict | None = None) -> bool:
    """True when `cond` simplifies to the constant true under the given ranges."""
    r = simplify(cond, ranges)
    return r.op == "const" and bool(r.arg)


# -- statements ---------------------------------------------------------------

def simplify_stmt(s: S.Stmt, ranges: dict | None = None) -> S.Stmt | None:
    """Simplify every expression, drop trivial loops/branches; None when nothing is left."""
    return _simp_stmt(s, dict(ranges or {}))


def _simp_stmt(s, ranges):
    ctx = Ctx(ranges)
    if isinstance(s, S.For):
        lo, ext = ctx.simplify(s.min), ctx.simplify(s.extent)
        if ext.op == "const" and ext.arg <= 0:
            return None
        if ext.op == "const" and ext.arg == 1:
            return _simp_stmt(substitute_stmt(s.body, {s.var: lo}), ranges)
        if lo.op == "const" and ext.op == "const":
            ranges = {**ranges, s.var: (lo.arg, lo.arg + ext.arg - 1)}
        elif lo.op == "const":   # a symbolic extent: bounded by its symbols' range
            ranges = {**ranges, s.var: (lo.arg, ctx.simplify(lo + ext - 1))}
        body = _simp_stmt(s.body, ranges)
        return None if body is None else S.For(s.var, lo, ext, s.kind, body)
    if isinstance(s, S.Store):
        return S.Store(s.buffer, tuple(ctx.simplify(i) for i in s.indices), ctx.simplify(s.value))
    if isinstance(s, S.Seq):
        parts = [p for p in (_simp_stmt(t, ranges) for t in s.stmts) if p is not None]
        return S.seq(*parts) if parts else None
    if isinstance(s, S.IfThenElse):
        c = ctx.simplify(s.cond)
        if c.op == "const":
            branch = s.then if c.arg else s.else_
            return None if branch is None else _simp_stmt(branch, ranges)
        then = _simp_stmt(s.then, ranges)
        other = None if s.else_ is None else _simp_stmt(s.else_, ranges)
        if then is None and other is None:
            return None
        if then is None:
            return S.IfThenElse(ctx.simplify(Expr("not", DType.bool, (c,))), other)
        return S.IfThenElse(c, then, other)
    if isinstance(s, S.Allocate):
        body = _simp_stmt(s.body, ranges)
        return None if body is None else S.Allocate(s.buffer, body, s.scope)
    if isinstance(s, S.Let):
        v = ctx.simplify(s.value)
        body = _simp_stmt(s.body, {**ranges, s.var: ctx.bounds(v)} if None not in ctx.bounds(v) else ranges)
        return None if body is None else S.Let(s.var, v, body)
    if isinstance(s, S.Evaluate):
        return S.Evaluate(ctx.simplify(s.expr))
    return s


def substitute_stmt(s: S.Stmt, mapping: dict) -> S.Stmt:
    """Substitute expressions (usually loop vars) everywhere inside a statement."""
    memo: dict = {}
    sub = lambda e: substitute(e, mapping, memo)  # noqa: E731
    if isinstance(s, S.For):
        return S.For(s.var, sub(s.min), sub(s.extent), s.kind, substitute_stmt(s.body, mapping))
    if isinstance(s, S.Store):
        return S.Store(s.buffer, tuple(map(sub, s.indices)), sub(s.value))
    if isinstance(s, S.Seq):
        return S.Seq(tuple(substitute_stmt(t, mapping) for t in s.stmts))
    if isinstance(s, S.IfThenElse):
        return S.IfThenElse(sub(s.cond), substitute_stmt(s.then, mapping),
                            None if s.else_ is None else substitute_stmt(s.else_, mapping))
    if isinstance(s, S.Allocate):
        return S.Allocate(s.buffer, substitute_stmt(s.body, mapping), s.scope)
    if isinstance(s, S.Let):
        return S.Let(s.var, sub(s.value), substitute_stmt(s.body, mapping))
    if isinstance(s, S.Evaluate):
        return S.Evaluate(sub(s.expr))
    return s

