"""LayerNorm written out as primitives becomes LayerNormalization; look-alikes stay."""

import numpy as np
import pytest

from kiln.graph import print_graph
from tests.passes.util import check, graph, prog, run_pass

F, I = np.float32, np.int64
rng = np.random.default_rng(0)
GAMMA, BETA = rng.uniform(0.5, 1.5, 8).astype(F), rng.normal(0, 0.1, 8).astype(F)
SIG = "(%x: float32[2,3,8]) -> (%y)"


def chain(axes="[-1]", square='Pow(%d, %two)', divide="Div(%d, %std)", tail="scale+bias",
          opset=17):
    """The chain as exporters write it (opset 17: ReduceMean axes as an attribute)."""
    red = (lambda v, out: f'  %{out}: float32[2,3,1] = ReduceMean(%{v}) {{axes = {axes}}} name "{out}"')
    lines = [red("x", "mean"),
             '  %d: float32[2,3,8] = Sub(%x, %mean) name "sub"',
             f'  %sq: float32[2,3,8] = {square} name "sq"',
             red("sq", "var"),
             '  %ve: float32[2,3,1] = Add(%var, %eps) name "add_eps"',
             '  %std: float32[2,3,1] = Sqrt(%ve) name "sqrt"']
    if divide.startswith("Mul"):
        lines.append('  %r: float32[2,3,1] = Reciprocal(%std) name "rcp"')
    out = {"none": "y", "scale": "y", "scale+bias": "n"}[tail]
    lines.append(f'  %{out if tail == "none" else "n"}: float32[2,3,8] = {divide} name "div"')
    if tail == "scale":
        lines.append('  %y: float32[2,3,8] = Mul(%n, %gamma) name "mul"')
    if tail == "scale+bias":
        lines += ['  %s: float32[2,3,8] = Mul(%gamma, %n) name "mul"',
                  '  %y: float32[2,3,8] = Add(%s, %beta) name "add"']
    return prog(SIG, "\n".join(lines), opset)


CONSTS = dict(two=F(2), eps=F(1e-5), gamma=GAMMA, beta=BETA)


def test_exported_layernorm_is_one_op():
    after = prog(SIG, '  %y: float32[2,3,8] = LayerNormalization(%x, %gamma, %beta) '
                      '{axis = 2, epsilon = 1e-05} name "add.LayerNormalization"')
    _, stats = check("recognize_layernorm", chain(), after, rtol=1e-5, atol=1e-5, **CONSTS)
    assert stats.removed == 9 and stats.added == 1


@pytest.mark.parametrize("square, divide", [
    ("Mul(%d, %d)", "Div(%d, %std)"),
    ("Pow(%d, %two)", "Mul(%d, %r)"),        # after algebraic simplification
])
def test_simplified_forms_are_recognized(square, divide):
    g = graph(chain(square=square, divide=divide), **CONSTS)
    out, _ = run_pass("recognize_layernorm", g)
    assert [n.op for n in out.nodes] == ["LayerNormalization"]


@pytest.mark.parametrize("tail, inputs", [("scale", 2), ("none", 2)])
def test_without_bias_or_scale(tail, inputs):
    g = graph(chain(tail=tail), **CONSTS)
    out, _ = run_pass("recognize_layernorm", g)
    assert [n.op for n in out.nodes] == ["LayerNormalization"]
    assert len(out.nodes[0].inputs) == inputs
    from tests.passes.util import assert_equivalent
    assert_equivalent(g, out, 1e-5, 1e-5)


def test_axes_as_an_input_opset_18():
    text = chain(opset=18).replace(" {axes = [-1]}", "").replace("ReduceMean(%x)", "ReduceMean(%x, %ax)")
    text = text.replace("ReduceMean(%sq)", "ReduceMean(%sq, %ax)")
    g = graph(text, ax=np.array([-1], I), **CONSTS)
    out, _ = run_pass("recognize_layernorm", g)
    assert [n.op for n in out.nodes] == ["LayerNormalization"]


def test_non_trailing_axes_stay():
    text = chain(axes="[1]").replace("float32[2,3,1]", "float32[2,1,8]")
    g = graph(text, **CONSTS)
    out, stats = run_pass("recognize_layernorm", g)
    assert not stats.changed


def test_chain_with_a_value_read_elsewhere_stays():
    text = chain().replace("-> (%y)", "-> (%y, %d)")
    g = graph(text, **CONSTS)
    out, _ = run_pass("recognize_layernorm", g)
    assert print_graph(out) == print_graph(g)
