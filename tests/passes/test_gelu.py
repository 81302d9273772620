"""GELU written out (erf and tanh forms, any association) becomes one Gelu op."""

import math

import numpy as np
import pytest

from tests.passes.util import assert_equivalent, check, graph, prog, run_pass

F = np.float32
SIG = "(%x: float32[4,6]) -> (%y)"
T = "float32[4,6]"
ERF = dict(rt2=F(math.sqrt(2)), one=F(1), half=F(0.5))
TANH = dict(k=F(math.sqrt(2 / math.pi)), cub=F(0.044715), three=F(3), one=F(1), half=F(0.5))


def _erf_chain(arg=f'  %a: {T} = Div(%x, %rt2) name "div"', product=None):
    product = product or [f'  %m: {T} = Mul(%x, %p) name "mul1"',
                          f'  %y: {T} = Mul(%m, %half) name "mul2"']
    return prog(SIG, "\n".join([arg, f'  %e: {T} = Erf(%a) name "erf"',
                                f'  %p: {T} = Add(%e, %one) name "add"'] + product))


def test_bert_erf_gelu_is_one_op():
    after = prog(SIG, f'  %y: {T} = Gelu(%x) name "mul2.Gelu"')
    _, stats = check("recognize_gelu", _erf_chain(), after, **ERF)
    assert stats.removed == 5 and stats.added == 1


@pytest.mark.parametrize("product", [
    [f'  %m: {T} = Mul(%x, %half) name "mul1"', f'  %y: {T} = Mul(%m, %p) name "mul2"'],   # HF
    [f'  %m: {T} = Mul(%half, %p) name "mul1"', f'  %y: {T} = Mul(%x, %m) name "mul2"'],
])
def test_other_associations(product):
    g = graph(_erf_chain(product=product), **ERF)
    out, _ = run_pass("recognize_gelu", g)
    assert [n.op for n in out.nodes] == ["Gelu"]
    assert_equivalent(g, out)


def test_erf_argument_as_a_product_after_algebraic_simplification():
    text = _erf_chain(arg=f'  %a: {T} = Mul(%x, %irt2) name "div"')
    g = graph(text, irt2=F(1 / math.sqrt(2)), **ERF)
    out, _ = run_pass("recognize_gelu", g)
    assert [n.op for n in out.nodes] == ["Gelu"]


def test_gpt2_tanh_gelu_is_one_op():
    body = [f'  %c: {T} = Pow(%x, %three) name "pow"',
            f'  %d: {T} = Mul(%cub, %c) name "mul0"',
            f'  %i: {T} = Add(%x, %d) name "add0"',
            f'  %s: {T} = Mul(%k, %i) name "mul1"',
            f'  %t: {T} = Tanh(%s) name "tanh"',
            f'  %h: {T} = Mul(%half, %x) name "mul2"',
            f'  %p: {T} = Add(%one, %t) name "add1"',
            f'  %y: {T} = Mul(%h, %p) name "mul3"']
    after = prog(SIG, f'  %y: {T} = Gelu(%x) {{approximate = "tanh"}} name "mul3.Gelu"')
    check("recognize_gelu", prog(SIG, "\n".join(body)), after, **TANH)


def test_cube_as_products():
    body = [f'  %x2: {T} = Mul(%x, %x) name "sq"',
            f'  %c: {T} = Mul(%x2, %x) name "cube"',
            f'  %d: {T} = Mul(%c, %cub) name "mul0"',
            f'  %i: {T} = Add(%d, %x) name "add0"',
            f'  %s: {T} = Mul(%i, %k) name "mul1"',
            f'  %t: {T} = Tanh(%s) name "tanh"',
            f'  %p: {T} = Add(%t, %one) name "add1"',
            f'  %h: {T} = Mul(%x, %p) name "mul2"',
            f'  %y: {T} = Mul(%h, %half) name "mul3"']
    g = graph(prog(SIG, "\n".join(body)), **TANH)
    out, _ = run_pass("recognize_gelu", g)
    assert [n.op for n in out.nodes] == ["Gelu"]
    assert_equivalent(g, out)


@pytest.mark.parametrize("change", [dict(half=F(0.6)), dict(rt2=F(1.5)), dict(one=F(2))])
def test_wrong_constants_stay(change):
    g = graph(_erf_chain(), **{**ERF, **change})
    out, stats = run_pass("recognize_gelu", g)
    assert not stats.changed


def test_inner_value_read_elsewhere_stays():
    g = graph(_erf_chain().replace("-> (%y)", "-> (%y, %e)"), **ERF)
    out, stats = run_pass("recognize_gelu", g)
    assert not stats.changed
