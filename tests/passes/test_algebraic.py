"""Algebraic simplification: each rule's before/after text, numbers unchanged, and where it must not fire."""

import numpy as np
import pytest

from tests.passes.util import check, prog

F, I = np.float32, np.int64


def _check(sig, before, after, **consts):
    after = None if after is None else prog(sig, after)
    return check("simplify_algebra", prog(sig, before), after, **consts)


def test_reshape_of_reshape_is_one_reshape():
    sig = "(%x: float32[2,3,4]) -> (%y)"
    _check(sig, '  %t: float32[6,4] = Reshape(%x, %s1) name "r1"\n'
                '  %y: float32[4,6] = Reshape(%t, %s2) name "r2"',
           '  %y: float32[4,6] = Reshape(%x, %r2.c) name "r2.Reshape"',
           s1=np.array([6, 4], I), s2=np.array([4, -1], I), **{"r2.c": np.array([4, 6], I)})


def test_unsqueeze_then_flatten_is_one_reshape():
    sig = "(%x: float32[2,3,4]) -> (%y)"
    _check(sig, '  %t: float32[1,2,3,4] = Unsqueeze(%x, %ax) name "u"\n'
                '  %y: float32[2,12] = Flatten(%t) {axis = 2} name "f"',
           '  %y: float32[2,12] = Reshape(%x, %f.c) name "f.Reshape"',
           ax=np.array([0], I), **{"f.c": np.array([2, 12], I)})


def test_reshape_back_to_the_input_shape_disappears():
    sig = "(%x: float32[2,3,4]) -> (%y)"
    _check(sig, '  %t: float32[6,4] = Reshape(%x, %s1) name "r1"\n'
                '  %u: float32[2,3,4] = Reshape(%t, %s2) name "r2"\n'
                '  %y: float32[2,3,4] = Relu(%u) name "relu"',
           '  %y: float32[2,3,4] = Relu(%x) name "relu"',
           s1=np.array([6, 4], I), s2=np.array([2, 3, 4], I))


@pytest.mark.parametrize("p1, p2, after", [
    ([1, 2, 0], [2, 0, 1], None),            # inverse perms: nothing left
    ([0, 2, 1], [1, 0, 2], [2, 0, 1]),
])
def test_transpose_pair(p1, p2, after):
    sig = "(%x: float32[2,3,4]) -> (%y)"
    shape1 = ",".join(str([2, 3, 4][i]) for i in p1)
    shape2 = ",".join(str([2, 3, 4][p1[i]]) for i in p2)
    before = (f'  %t: float32[{shape1}] = Transpose(%x) {{perm = {p1}}} name "t1"\n'
              f'  %u: float32[{shape2}] = Transpose(%t) {{perm = {p2}}} name "t2"\n'
              f'  %y: float32[{shape2}] = Relu(%u) name "relu"')
    if after is None:
        want = '  %y: float32[2,3,4] = Relu(%x) name "relu"'
    else:
        want = (f'  %u: float32[{shape2}] = Transpose(%x) {{perm = {after}}} name "t2.Transpose"\n'
                f'  %y: float32[{shape2}] = Relu(%u) name "relu"')
    _check(sig, before, want)


@pytest.mark.parametrize("shape, perm, out, moves", [
    ([5, 2, 1, 3], [0, 2, 1, 3], [5, 1, 2, 3], False),   # a bidirectional RNN's Y at batch 1
    ([1, 4, 1, 6], [2, 1, 3, 0], [1, 4, 6, 1], False),
    ([5, 2, 2, 3], [0, 2, 1, 3], [5, 2, 2, 3], True),    # batch 2: the data moves
    ([1, 4, 6], [0, 2, 1], [1, 6, 4], True),
])
def test_transpose_of_size_one_axes_is_a_reshape(shape, perm, out, moves):
    sig = f"(%x: float32[{','.join(map(str, shape))}]) -> (%y)"
    o = ",".join(map(str, out))
    before = (f'  %t: float32[{o}] = Transpose(%x) {{perm = {perm}}} name "t"\n'
              f'  %y: float32[{o}] = Relu(%t) name "relu"')
    want = None if moves else (f'  %t: float32[{o}] = Reshape(%x, %t.c) name "t.Reshape"\n'
                               f'  %y: float32[{o}] = Relu(%t) name "relu"')
    _check(sig, before, want, **({} if moves else {"t.c": np.array(out, I)}))


@pytest.mark.parametrize("op, fn", [("Mul", np.multiply), ("Add", np.add)])
def test_constants_are_gathered(op, fn):
    sig = "(%x: float32[2,3]) -> (%y)"
    c1, c2 = np.array([1.5, -2, 3], F), F(0.25)
    _check(sig, f'  %t: float32[2,3] = {op}(%x, %c1) name "a"\n'
                f'  %y: float32[2,3] = {op}(%c2, %t) name "b"',
           f'  %y: float32[2,3] = {op}(%x, %b.c) name "b.{op}"',
           c1=c1, c2=c2, **{"b.c": fn(c1, c2)})


def test_constants_are_not_gathered_into_an_outer_product():
    sig = "(%x: float32[4,4]) -> (%y)"
    _check(sig, '  %t: float32[4,4] = Mul(%x, %c1) name "a"\n'
                '  %y: float32[4,4] = Mul(%t, %c2) name "b"', None,
           c1=np.arange(1, 5, dtype=F).reshape(4, 1), c2=np.arange(1, 5, dtype=F))


@pytest.mark.parametrize("before, after, consts", [
    ("Sub(%x, %c)", "Add(%x, %n.c)", {"c": np.array([1, -2, 0.5], F), "n.c": np.array([-1, 2, -0.5], F)}),
    ("Div(%x, %c)", "Mul(%x, %n.c)", {"c": F(8), "n.c": F(0.125)}),
    ("Div(%c, %x)", "Reciprocal(%x)", {"c": F(1)}),
    ("Pow(%x, %c)", "Mul(%x, %x)", {"c": F(2)}),
])
def test_one_node_rewrites(before, after, consts):
    sig = "(%x: float32[2,3]) -> (%y)"
    op = after.split("(")[0]
    _check(sig, f'  %y: float32[2,3] = {before} name "n"',
           f'  %y: float32[2,3] = {after} name "n.{op}"', **consts)


@pytest.mark.parametrize("c, dtype", [
    (F(0), "float32"), (F(1e-40), "float32"), (np.float32(np.inf), "float32"), (I(4), "int64")])
def test_div_stays_when_the_reciprocal_is_not_exactly_usable(c, dtype):
    sig = f"(%x: {dtype}[2,3]) -> (%y)"
    _check(sig, f'  %y: {dtype}[2,3] = Div(%x, %c) name "d"', None, c=c)


def test_division_by_a_broadcast_value_is_one_reciprocal_per_row():
    sig = "(%x: float32[4,8], %v: float32[4,1]) -> (%y)"
    _check(sig, '  %s: float32[4,1] = Sqrt(%v) name "sqrt"\n'
                '  %y: float32[4,8] = Div(%x, %s) name "d"',
           '  %s: float32[4,1] = Sqrt(%v) name "sqrt"\n'
           '  %d.Reciprocal: float32[4,1] = Reciprocal(%s) name "d.Reciprocal"\n'
           '  %y: float32[4,8] = Mul(%x, %d.Reciprocal) name "d.Mul"')


def test_elementwise_division_stays():
    sig = "(%x: float32[4,8], %v: float32[4,8]) -> (%y)"
    _check(sig, '  %y: float32[4,8] = Div(%x, %v) name "d"', None)


def test_double_negation_disappears():
    sig = "(%x: float32[2,3]) -> (%y)"
    _check(sig, '  %t: float32[2,3] = Neg(%x) name "n1"\n'
                '  %u: float32[2,3] = Neg(%t) name "n2"\n'
                '  %y: float32[2,3] = Relu(%u) name "relu"',
           '  %y: float32[2,3] = Relu(%x) name "relu"')


def test_chain_reaches_a_fixpoint():
    """x/2 - 1 + 3 * ... : divisions become products, then constants gather."""
    sig = "(%x: float32[2,3]) -> (%y)"
    _check(sig, '  %a: float32[2,3] = Div(%x, %two) name "a"\n'
                '  %y: float32[2,3] = Mul(%a, %four) name "b"',
           '  %y: float32[2,3] = Mul(%x, %b.c) name "b.Mul"',
           two=F(2), four=F(4), **{"b.c": F(2)})


@pytest.mark.parametrize("mul", ["Mul(%x, %s)", "Mul(%s, %x)"])
def test_x_times_its_sigmoid_is_one_swish(mul):
    sig = "(%x: float32[2,3,5]) -> (%y)"
    _check(sig, '  %s: float32[2,3,5] = Sigmoid(%x) name "sig"\n'
                f'  %y: float32[2,3,5] = {mul} name "m"',
           '  %y: float32[2,3,5] = Swish(%x) name "m.Swish"')


def test_sigmoid_read_elsewhere_or_of_another_value_stays():
    sig = "(%x: float32[2,3], %z: float32[2,3]) -> (%y, %s)"
    _check(sig, '  %s: float32[2,3] = Sigmoid(%x) name "sig"\n'
                '  %y: float32[2,3] = Mul(%x, %s) name "m"', None)
    sig = "(%x: float32[2,3], %z: float32[2,3]) -> (%y)"
    _check(sig, '  %s: float32[2,3] = Sigmoid(%z) name "sig"\n'
                '  %y: float32[2,3] = Mul(%x, %s) name "m"', None)
