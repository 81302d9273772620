"""NOP elimination: ops that hand back their input unchanged are removed.

Every rule rewrites the node to its input `x`; the rule driver commits that only
when the node's output type is exactly `x`'s (so `x + zeros(4, 1)`, which
broadcasts, stays). Type equality alone suffices for ops that never move data
(Reshape, Expand, Squeeze, Unsqueeze, Flatten, Cast); Transpose, Slice and Pad
also need their perm, steps or pads checked, since a square Transpose or a
reversing Slice keeps the type but not the data.
"""

from __future__ import annotations

import numpy as np

from kiln.graph.ir import Graph, Node
from kiln.passes.pattern import Const, Op, Rule, Var, apply_rules
from kiln.passes.registry import PassContext, graph_pass


def _all_equal(value: float):
    def test(a: np.ndarray) -> bool:
        return a.size > 0 and a.dtype.kind not in "OSU" and bool(np.all(a.astype(np.float64) == value))
    return test


def _input(m, b):
    return m["x"]


def _identity_perm(n: Node) -> bool:
    perm = n.attrs.get("perm")
    if perm is None:
        rank = getattr(n.inputs[0].type, "rank", None)
        return rank is not None and rank <= 1
    return list(perm) == list(range(len(perm)))


def _unit_steps(n: Node) -> bool:
    steps = n.inputs[4] if len(n.inputs) > 4 else None
    return steps is None or (steps.const is not None and bool(np.all(steps.const == 1)))


def _zero_pads(n: Node) -> bool:
    pads = n.inputs[1].const if len(n.inputs) > 1 and n.inputs[1] is not None else n.attrs.get("pads")
    return pads is not None and bool(np.all(np.asarray(pads) == 0))


def _dropout_in_inference(m, b):
    """Dropout-12+ trains only when its training_mode input says so; older forms never do here."""
    n = m.root_node
    training = n.inputs[2] if len(n.inputs) > 2 else None
    if b.opset() >= 12 and training is not None:
        t = training.const
        if t is None or t.size != 1 or bool(t.reshape(())):
            return None
    return m["x"]


ZERO, ONE = _all_equal(0), _all_equal(1)

RULES = [
    Rule("x+0", Op("Add", Var("x"), Const(when=ZERO)), _input),
    Rule("x-0", Op("Sub", Var("x"), Const(when=ZERO)), _input),
    Rule("x*1", Op("Mul", Var("x"), Const(when=ONE)), _input),
    Rule("x/1", Op("Div", Var("x"), Const(when=ONE)), _input),
    Rule("x**1", Op("Pow", Var("x"), Const(when=ONE)), _input),
    Rule("Identity", Op("Identity", Var("x")), _input),
    Rule("Dropout (inference)", Op("Dropout", Var("x")), _dropout_in_inference),
    Rule("same-type Cast", Op(("Cast", "CastLike"), Var("x")), _input),
    Rule("same-shape reshape", Op(("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Expand"),
                                  Var("x")), _input),
    Rule("identity Transpose", Op("Transpose", Var("x"), when=_identity_perm), _input),
    Rule("whole Slice", Op("Slice", Var("x"), when=_unit_steps), _input),
    Rule("zero Pad", Op("Pad", Var("x"), when=_zero_pads), _input),
    Rule("one-input variadic", Op(("Concat", "Sum", "Mean", "Max", "Min"), Var("x"),
                                  when=lambda n: len(n.inputs) == 1), _input),
]


@graph_pass("eliminate_nops")
def eliminate_nops(graph: Graph, ctx: PassContext) -> Graph:
    """Remove x+0, x*1, x/1, Identity, inference Dropout and same-type Cast/Reshape/Transpose/..."""
    ctx.tally(apply_rules(graph, RULES))
    return graph
