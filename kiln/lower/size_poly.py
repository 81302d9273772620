"""Sizes as integer polynomials of a model's input symbols (issue 15 item 1): `Poly`, with
floor divisions of them as named atoms ("(H+1)//2"), and the `Guard`s a shape-generic module
checks per new shape. The algebra kiln.lower.symbolic_shapes infers a graph's sizes in."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

BIG = 2 ** 31 - 1    # exporters write INT_MAX / INT64_MAX for "to the end"


class Undecided(Exception):
    """A fact about symbolic sizes that the polynomials cannot settle."""


# Floor divisions (a strided window's output size, floor((H + pads - span) / stride) + 1):
# floor(p / d) that is not exact becomes an *atom*, a symbol-like name ("(H-1)//2") standing
# for that quotient, so sizes stay polynomials over the input symbols and atoms. An atom's
# value is computed from its numerator at run time; it may be 0 (its least value is tracked).
_ATOMS: dict = {}    # atom name -> (numerator Poly, divisor int > 0)


def atom(name: str) -> tuple | None:
    """(numerator, divisor) of floor-division atom `name`, or None for an input symbol."""
    return _ATOMS.get(name)


@dataclass(frozen=True)
class Poly:
    """sum(coeff * prod(symbols)) over monomials: `terms` is a sorted tuple of
    (monomial: sorted tuple of symbol names, coeff != 0)."""
    terms: tuple = ()

    @staticmethod
    def of(x) -> Poly:
        if isinstance(x, Poly):
            return x
        if isinstance(x, (bool, np.bool_)):
            raise Undecided("a boolean is not a size")
        if isinstance(x, (float, np.floating)):
            if x != int(x):
                raise Undecided(f"{x} is not an integer")
        return Poly((((), int(x)),)) if int(x) else Poly()

    @staticmethod
    def sym(name: str) -> Poly:
        return Poly((((name,), 1),))

    @staticmethod
    def _make(acc: dict) -> Poly:
        return Poly(tuple(sorted(((m, c) for m, c in acc.items() if c), key=lambda t: (-len(t[0]), t[0]))))

    def __add__(self, other):
        acc = dict(self.terms)
        for m, c in Poly.of(other).terms:
            acc[m] = acc.get(m, 0) + c
        return Poly._make(acc)

    __radd__ = __add__

    def __neg__(self):
        return Poly(tuple((m, -c) for m, c in self.terms))

    def __sub__(self, other):
        return self + (-Poly.of(other))

    def __rsub__(self, other):
        return Poly.of(other) - self

    def __mul__(self, other):
        acc: dict = {}
        for m1, c1 in self.terms:
            for m2, c2 in Poly.of(other).terms:
                m = tuple(sorted(m1 + m2))
                acc[m] = acc.get(m, 0) + c1 * c2
        return Poly._make(acc)

    __rmul__ = __mul__

    def __floordiv__(self, other):
        q = self.exact_div(Poly.of(other))
        if q is None:
            raise Undecided(f"{self} / {other} is not exact")
        return q

    __truediv__ = __floordiv__

    def floordiv(self, d: int, assume_nonnegative: bool = False) -> Poly:
        """floor(self / d) for an int d > 0: the terms d divides come out as a polynomial,
        the rest stays under one floor-division atom (kept exact, never rounded at compile
        time: floor((2H + 1) / 2) = H + floor(1 / 2) = H)."""
        d = int(d)
        if d <= 0:
            raise Undecided(f"a floor division by {d}")
        if d == 1:
            return self
        whole, rest = {}, {}
        for m, c in self.terms:
            if m:
                q, r = divmod(c, d)
                (whole.__setitem__(m, q) if r == 0 else rest.__setitem__(m, c))
        const = self.value - sum(c for m, c in self.terms if m)      # the constant term
        if not rest:
            return Poly._make(whole) + const // d
        # keep the constant's multiples of d outside: floor((H + 5) / 2) = 2 + floor((H + 1) / 2)
        q, r = divmod(const, d)
        num = Poly._make({**rest, **({(): r} if r else {})})
        lo = num.lower_bound()
        if (lo is None or lo < 0) and not assume_nonnegative:
            raise Undecided(f"floor(({num}) / {d}) of a numerator that may be negative")
        name = f"({num})//{d}"
        _ATOMS.setdefault(name, (num, d))
        return Poly._make(whole) + q + Poly.sym(name)

    def exact_div(self, d: Poly) -> Poly | None:
        """self / d when it divides exactly (d a constant or a single term), else None."""
        if d == self and self.terms:
            return Poly.of(1)
        if len(d.terms) != 1:
            return None
        (dm, dc), = d.terms
        acc = {}
        for m, c in self.terms:
            rest = list(m)
            for s in dm:
                if s not in rest:
                    return None
                rest.remove(s)
            if c % dc:
                return None
            acc[tuple(rest)] = c // dc
        return Poly._make(acc)

    @property
    def is_const(self) -> bool:
        return all(not m for m, _ in self.terms)

    @property
    def value(self) -> int:
        return sum(c for _, c in self.terms)

    def lower_bound(self) -> int | None:
        """The least value for symbols >= 1 (floor-division atoms at their least), when every
        non-constant coefficient is positive, or is so once each symbol s is written least(s) + s'
        (s' >= 0): batch*past + batch*seq - batch, a KV cache's rows with past = symbol - 1, is
        batch' + past' + seq' + ... + 1 >= 1."""
        if not any(m and c < 0 for m, c in self.terms):
            return sum(c * math.prod(least_value(s) for s in m) for m, c in self.terms)
        shifted = Poly()
        for m, c in self.terms:
            t = Poly.of(c)
            for s in m:
                t = t * (Poly.sym(s) + least_value(s))
            shifted = shifted + t
        if any(m and c < 0 for m, c in shifted.terms):
            return None
        return sum(c for m, c in shifted.terms if not m)

    def compare(self, other) -> int:
        """-1, 0 or 1 as self <, ==, > other for every value of the symbols (>= 1)."""
        d = self - Poly.of(other)
        if not d.terms:
            return 0
        lo, hi = d.lower_bound(), (-d).lower_bound()
        if lo is not None and lo > 0:
            return 1
        if hi is not None and hi > 0:
            return -1
        raise Undecided(f"cannot compare {self} with {other}")

    def symbols(self) -> set:
        """The input symbols this size depends on (through its atoms too)."""
        out = set()
        for m, _ in self.terms:
            for s in m:
                a = atom(s)
                out |= a[0].symbols() if a else {s}
        return out

    def evaluate(self, env: dict) -> int:
        def value(s):
            if s in env:
                return env[s]
            a = atom(s)
            if a is None:
                raise KeyError(s)
            return a[0].evaluate(env) // a[1]
        return sum(c * math.prod(value(s) for s in m) for m, c in self.terms)

    def to_expr(self, table: dict):
        """The loop-IR expression of this size, symbol names mapped by `table` to vars."""
        from kiln.loops.expr import INDEX, const  # noqa: PLC0415
        e = None
        def sym(s):
            if s in table:
                return table[s]
            num, d = _ATOMS[s]
            return num.to_expr(table) // const(d, INDEX)
        for m, c in self.terms:
            t = None
            for s in m:
                t = sym(s) if t is None else t * sym(s)
            t = const(c, INDEX) if t is None else (t if c == 1 else t * c)
            e = t if e is None else e + t
        return const(0, INDEX) if e is None else e

    def __str__(self) -> str:
        if not self.terms:
            return "0"
        out = ""
        for m, c in self.terms:
            body = "*".join(m)
            term = (str(abs(c)) if not body else body if abs(c) == 1 else f"{abs(c)}*{body}")
            out += (("-" if c < 0 else "+") if out else ("-" if c < 0 else "")) + term
        return out

    __repr__ = __str__


def least_value(s: str) -> int:
    """The least value of input symbol (1) or floor-division atom `s`."""
    a = atom(s)
    if a is None:
        return 1
    lo = a[0].lower_bound()
    return 0 if lo is None else max(lo // a[1], 0)


@dataclass
class Guard:
    """`size` <= `bound` must hold for the shapes the generic module runs."""
    size: Poly
    bound: int
    why: str
