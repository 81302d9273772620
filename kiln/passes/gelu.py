"""GELU recognition: the exported formulas become one `Gelu` op (opset 20 semantics).

    x * 0.5 * (1 + erf(x / sqrt(2)))                            → Gelu(x)
    0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))    → Gelu(x) {approximate = "tanh"}

Exporters associate the three factors every way ((x*0.5)*p, (x*p)*0.5,
0.5*(x*p)...), so the product is flattened through Muls read only inside it
and matched as a set of factors; x/sqrt(2) may also be x*(1/sqrt(2)), and x**3
may be x*x*x. Constants must agree to float32 precision. kiln's Gelu op serves
any graph opset.
"""

from __future__ import annotations

import math

from kiln.graph.ir import Graph, Value
from kiln.passes.edit import const_scalar
from kiln.passes.pattern import Match, Op, Rule, Var, apply_rules
from kiln.passes.registry import PassContext, graph_pass

SQRT2 = math.sqrt(2.0)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
CUBIC = 0.044715


def near(v: Value | None, target: float, rtol: float = 1e-6) -> bool:
    c = const_scalar(v)
    return c is not None and abs(c - target) <= rtol * abs(target)


def factors(m: Match, v: Value) -> list[Value]:
    """The leaves of the Mul tree at `v`, descending through Muls read only once."""
    n = m.producer(v)
    if n is None or n.op != "Mul" or n.domain or (v is not m.root and m.uses(v) != 1):
        return [v]
    m.claim(n)
    return [f for u in n.inputs for f in factors(m, u)]


def _erf_argument(m: Match, arg: Value, x: Value) -> bool:
    """arg is x / sqrt(2) or x * (1/sqrt(2))."""
    n = m.producer(arg)
    if n is None or len(n.inputs) != 2:
        return False
    m.claim(n)
    a, c = n.inputs
    if n.op == "Div":
        return a is x and near(c, SQRT2)
    return n.op == "Mul" and ((a is x and near(c, 1 / SQRT2)) or (c is x and near(a, 1 / SQRT2)))


def _x_power(m: Match, v: Value, x: Value) -> int | None:
    """k if `v` is x**k (as x, Pow(x, k) or a product of those), else None."""
    if v is x:
        return 1
    n = m.producer(v)
    if n is not None and n.op == "Pow" and n.inputs[0] is x and const_scalar(n.inputs[1]) in (2.0, 3.0):
        m.claim(n)
        return int(const_scalar(n.inputs[1]))
    if n is not None and n.op == "Mul" and m.uses(v) == 1:
        m.claim(n)
        ks = [_x_power(m, u, x) for u in n.inputs]
        return None if None in ks else sum(ks)
    return None


def _tanh_argument(m: Match, arg: Value, x: Value) -> bool:
    """arg is sqrt(2/pi) * (x + 0.044715 * x**3)."""
    fs = factors(m, arg) if m.producer(arg) is not None and m.producer(arg).op == "Mul" else []
    scale = [f for f in fs if near(f, SQRT_2_OVER_PI)]
    if len(fs) != 2 or len(scale) != 1:
        return False
    inner = m.producer(fs[1 - fs.index(scale[0])])
    if inner is None or inner.op != "Add" or x not in inner.inputs:
        return False
    m.claim(inner)
    cubic = inner.inputs[1 - inner.inputs.index(x)]
    cf = factors(m, cubic) if m.producer(cubic) is not None and m.producer(cubic).op == "Mul" else []
    coef = [f for f in cf if near(f, CUBIC)]
    return len(coef) == 1 and sum(_x_power(m, f, x) or 99 for f in cf if f is not coef[0]) == 3


def _gelu(m: Match, b):
    fs = factors(m, m.root)
    half = [f for f in fs if near(f, 0.5)]
    if len(fs) != 3 or len(half) != 1:
        return None
    for p in fs:
        add = m.producer(p)
        if add is None or add.op != "Add" or len(add.inputs) != 2 or m.uses(p) != 1:
            continue
        one = [u for u in add.inputs if near(u, 1.0)]
        fn = m.producer(add.inputs[1] if one and add.inputs[0] is one[0] else add.inputs[0])
        x = next((f for f in fs if f is not p and f is not half[0]), None)
        if not one or fn is None or x is None or x.const is not None:
            continue
        mark = len(m.nodes)
        m.claim(add, fn)
        if fn.op == "Erf" and _erf_argument(m, fn.inputs[0], x):
            return b.op("Gelu", [x])
        if fn.op == "Tanh" and _tanh_argument(m, fn.inputs[0], x):
            return b.op("Gelu", [x], {"approximate": "tanh"})
        del m.nodes[mark:]  # not this factor: forget what its check claimed
    return None


RULES = [Rule("Gelu", Op("Mul", Var(), Var()), _gelu, private=True)]


@graph_pass("recognize_gelu")
def recognize_gelu(graph: Graph, ctx: PassContext) -> Graph:
    """Replace GELU written out with Erf or Tanh by one Gelu op."""
    ctx.tally(apply_rules(graph, RULES, reverse=True))
    return graph
