"""The pattern matcher and rule driver that the rewriting passes are written in."""

import numpy as np

from kiln.graph import print_graph
from kiln.passes.edit import producers
from kiln.passes.pattern import Const, Op, Or, Rule, Var, apply_rules, match
from tests.passes.util import graph, prog

F = np.float32
SIG = "(%x: float32[3], %z: float32[3]) -> (%y)"


def _matches(pattern, text, **consts):
    g = graph(prog(SIG, text), **consts)
    root = g.nodes[-1].outputs[0]
    return [env for env, _ in match(pattern, root, {}, (), producers(g))]


def test_commutative_ops_match_either_way_round():
    p = Op("Mul", Const("c"), Var("x"))
    (env,) = _matches(p, '  %y: float32[3] = Mul(%x, %two) name "m"', two=F(2))
    assert env["x"].name == "x" and env["c"].name == "two"
    assert _matches(Op("Sub", Const("c"), Var("x")), '  %y: float32[3] = Sub(%x, %two) name "s"',
                    two=F(2)) == []


def test_a_repeated_name_binds_the_same_value():
    square = Op("Mul", Var("a"), Var("a"))
    assert len(_matches(square, '  %y: float32[3] = Mul(%x, %x) name "m"')) == 2  # both orders
    assert _matches(square, '  %y: float32[3] = Mul(%x, %z) name "m"') == []


def test_or_and_nested_ops():
    p = Op("Relu", Or(Op("Neg", Var("v")), Op("Abs", Var("v"))), name="r")
    for op in ("Neg", "Abs"):
        (env,) = _matches(p, f'  %t: float32[3] = {op}(%x) name "n"\n'
                             '  %y: float32[3] = Relu(%t) name "r"')
        assert env["v"].name == "x" and env["r"].name == "y"


def _relu_of_neg_to_neg_of_relu(m, b):
    return b.op("Neg", [b.op("Relu", [m["x"]])])


RULE = Rule("swap", Op("Relu", Op("Neg", Var("x"))), _relu_of_neg_to_neg_of_relu, private=True)


def test_built_value_takes_over_the_root():
    g = graph(prog(SIG, '  %t: float32[3] = Neg(%x) name "n"\n  %y: float32[3] = Relu(%t) name "r"'))
    assert apply_rules(g, [RULE]) == {"swap": 1}
    assert print_graph(g) == print_graph(graph(prog(SIG, (
        '  %r.Relu: float32[3] = Relu(%x) name "r.Relu"\n'
        '  %y: float32[3] = Neg(%r.Relu) name "r.Neg"'))))


def test_private_rule_leaves_shared_inner_values_alone():
    sig = "(%x: float32[3], %z: float32[3]) -> (%y, %t)"
    text = prog(sig, '  %t: float32[3] = Neg(%x) name "n"\n  %y: float32[3] = Relu(%t) name "r"')
    g = graph(text)
    assert apply_rules(g, [RULE]) == {}
    assert print_graph(g) == print_graph(graph(text))


def test_a_rewrite_that_changes_the_type_is_refused():
    def widen(m, b):
        return b.op("Concat", [m["x"], m["x"]], {"axis": 0})
    g = graph(prog(SIG, '  %y: float32[3] = Relu(%x) name "r"'))
    assert apply_rules(g, [Rule("widen", Op("Relu", Var("x")), widen)]) == {}
