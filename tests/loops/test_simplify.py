"""The expression IR (hash-consing, typing) and the rule-based index simplifier."""

import pytest

from kiln.dtypes import DType
from kiln.errors import KilnError
from kiln.loops import const, exp, max_, min_, select, simplify, var
from kiln.loops.simplify import ANY_RULES, INT_RULES, Pat, compiled, match, prove

i = var("i", dom=(0, 8))
j = var("j", dom=(0, 4))
n = var("n")  # unbounded
f = var("x", DType.float32)


def test_hash_consing_makes_structure_identity():
    assert (i * 4 + j) is (i * 4 + j)
    assert const(1.5, DType.float32) is const(1.5, DType.float32)
    assert const(0.0, DType.float32) is not const(-0.0, DType.float32)
    assert var("i") is not var("i")  # vars are unique even with equal names


def test_dtype_rules():
    with pytest.raises(KilnError, match="dtype mismatch"):
        i + f
    with pytest.raises(KilnError, match="true division"):
        i / 2
    assert (i < 3).dtype is DType.bool
    assert exp(f).dtype is DType.float32
    with pytest.raises(KilnError, match="truth value"):
        bool(i < 3)


@pytest.mark.parametrize("expr, expected", [
    (lambda: n + 0, lambda: n),
    (lambda: n * 1, lambda: n),
    (lambda: n * 0, lambda: const(0, DType.int64)),
    (lambda: 3 + n, lambda: n + 3),
    (lambda: (n + 2) + 5, lambda: n + 7),
    (lambda: (n * 4) // 4, lambda: n),
    (lambda: (n * 4) % 4, lambda: const(0, DType.int64)),
    (lambda: (i * 4 + j) // 4, lambda: i),          # 0 <= j < 4
    (lambda: (i * 4 + j) % 4, lambda: j),
    (lambda: (n * 8 + j) // 4, lambda: n * 2),
    (lambda: (n // 4) * 4 + n % 4, lambda: n),
    (lambda: (n // 2) // 3, lambda: n // 6),
    (lambda: j // 4, lambda: const(0, DType.int64)),
    (lambda: j % 4, lambda: j),
    (lambda: (j + 4) % 4, lambda: j),
    (lambda: min_(i, 100), lambda: i),
    (lambda: max_(i, 7), lambda: const(7, DType.int64)),
    (lambda: min_(n + 3, n + 5), lambda: n + 3),
    (lambda: select(i < 8, n, j), lambda: n),
    (lambda: (n + 1) * 3, lambda: n * 3 + 3),
    (lambda: const(7, DType.int64) // 2, lambda: const(3, DType.int64)),
    (lambda: const(-7, DType.int64) // 2, lambda: const(-4, DType.int64)),
    (lambda: const(-7, DType.int64) % 2, lambda: const(1, DType.int64)),
])
def test_rules(expr, expected):
    assert simplify(expr()) is expected()


def test_float_identities_are_left_alone():
    # x + 0.0 is not x for x = -0.0, x * 0 is not 0 for NaN: float nodes only fold constants
    assert simplify(f + 0.0) is f + 0.0
    assert simplify(f * 0.0) is f * 0.0
    assert simplify(const(1.5, DType.float32) * 2.0) is const(3.0, DType.float32)


def test_ranges_drive_bound_rules():
    assert prove(i < 8)
    assert not prove(i < 7)
    assert prove(n < 10, {n: (0, 9)})
    assert simplify(n // 16, {n: (0, 15)}) is const(0, DType.int64)


def test_rules_are_data():
    pat, _ = INT_RULES[2]
    assert isinstance(pat, Pat)
    env = match(Pat(name="x") + 0, n + 0, {})
    assert env == {"x": n}
    assert match(Pat(name="x") - Pat(name="x"), n - i, {}) is None


def test_fused_loop_digits_rejoin_to_the_flat_index():
    # a 3-D loop nest fused into one var: the row-major flat index is the var itself
    x = var("x", dom=(0, 4096))
    assert simplify((x // 512) * 512 + ((x // 32) % 16) * 32 + x % 32) is x
    assert simplify((x // 8) * 24 + (x % 8) * 3) is simplify(x * 3)
    # digits that do not line up must stay as they are
    e = (x // 512) * 500 + ((x // 32) % 16) * 32
    assert simplify(e) is not simplify((x // 32) * 32)


def test_digit_rejoin_inside_a_longer_sum():
    x, y = var("x", dom=(0, 120)), var("y", dom=(0, 10))
    assert simplify((y * 120 + (x // 5) * 5) + x % 5) is simplify(y * 120 + x)
    assert simplify(((x // 5) % 4) * 5 + x % 5) is simplify(x % 20)


def test_digits_by_symbolic_sizes_rejoin():
    # a GEMM's rows folded over a symbolic batch of a symbolic M rows each: the fused row
    # var's digits (f // m, f % m) put back together, in an index and in a row-major address
    # (strides m * 24 and 24), are the var itself; the tile guard on the leading digit is a
    # bound on the var
    from kiln.loops.symbols import symbol
    m, h, b = symbol("fold_m"), symbol("fold_h"), symbol("fold_b")
    x = var("x", dom=(0, 4096))
    assert simplify((x // m) * m + x % m) is x
    assert simplify((x // m) * (m * 24) + (x % m) * 24) is simplify(x * 24)
    q = x // m
    addr = ((q // h) * ((m * 24) * h) + (q % h) * (m * 24)) + (x % m) * 24
    assert simplify(addr) is simplify(x * 24)
    assert simplify((x // m) // h < b) is simplify(x < (b * h) * m)
    # a divisor that is not the digit's stays
    assert simplify((x // m) * h + x % m) is not x


def test_a_digit_bound_by_a_constant_reads_as_a_bound_on_the_var():
    """A zero border's guard on a fused (column, lane) loop: 0 <= v // 3 - 1 is 3 <= v, no
    division left in a vectorized copy; exact under floor division, negative values included."""
    v = n
    cases = [(0 <= v // 3 + (-1), 3 <= v), (v // 3 < 5, v < 15), (2 <= v + 5, -3 <= v), (v + 4 < 9, v < 5)]
    for before, after in cases:
        assert simplify(before) is simplify(after)
    for x in range(-20, 21):        # the identities the rules use, with Python's floor division
        assert (0 <= x // 3 - 1) == (3 <= x) and (x // 3 < 5) == (x < 15)
        assert (2 <= x + 5) == (-3 <= x) and (x + 4 < 9) == (x < 5)


def test_compiled_patterns_bind_what_match_binds():
    """Each rule's compiled matcher finds the bindings `match` finds, in the same order
    (a commutative node's args as given first, each child's first match kept), on every
    node of random integer and boolean expressions, repeated and swapped operands included."""
    import random
    from kiln.loops.expr import Expr
    rnd, I, B = random.Random(3), DType.int64, DType.bool
    leaves = [i, j, n, *(const(c, I) for c in (0, 1, 2, 4, 8, -1))]

    def num(d):
        if d == 0 or rnd.random() < 0.25:
            return rnd.choice(leaves)
        a = num(d - 1)
        b = a if rnd.random() < 0.2 else num(d - 1)
        return Expr(rnd.choice(["add", "add", "sub", "mul", "mul", "floordiv", "floormod", "min", "max"]), I, (a, b))

    def cond(d):
        op = rnd.choice(["lt", "le", "gt", "ge", "and", "or", "not", "select"])
        if op in ("and", "or"):
            a = cond(d - 1) if d else const(rnd.choice([0, 1]), B)
            return Expr(op, B, (a, rnd.choice([a, const(rnd.choice([0, 1]), B), cond(0) if d else a])))
        if op == "not":
            return Expr("not", B, (cond(d - 1) if d else Expr("lt", B, (num(1), num(1))),))
        if op == "select":
            return Expr("select", I, (rnd.choice([Expr("lt", B, (num(1), num(1))), const(1, B)]), num(2), num(2)))
        return Expr(op, B, (num(d), num(d)))

    rules = [(p, compiled(p)) for p, _ in INT_RULES + ANY_RULES]
    found = 0
    for k in range(1500):
        stack = [num(4) if k % 2 else cond(3)]
        while stack:
            e = stack.pop()
            stack.extend(e.args)
            for p, m in rules:
                want, got = match(p, e, {}), m(e)
                assert (got is None) == (want is None), (p, e)
                if want is not None:
                    found += 1
                    assert got.keys() == want.keys() and all(got[q] is want[q] for q in want), (p, e)
    assert found > 1000   # (the rules do fire)
