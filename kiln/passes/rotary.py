"""Rotary embedding recognition: Llama-style `x * cos + rotate_half(x) * sin` becomes one op.

    rotate_half(x) = Concat(Neg(Slice(x, D/2 .. D)), Slice(x, 0 .. D/2), axis = -1)
    y = x * cos + rotate_half(x) * sin

→ `kiln::RotaryHalf(x, cos, sin)` (kiln.ops.rotary): one injective kernel, which the head
split in front of it (Reshape, Transpose) joins, instead of four (the two products, and the
slices the rotation reads x through). This is how Hugging Face's `apply_rotary_pos_emb`
exports with both torch.onnx exporters (the slice bounds computed from Shape are constants
by now: fold_constants). The slices must cut the last axis exactly in half with step 1, cos
and sin must broadcast to x without widening it, and every value inside must be read only
by the chain; each product and the sum still round in x's dtype, so results are unchanged.
"""

from __future__ import annotations

from kiln.graph.ir import Graph, Node
from kiln.passes.edit import hoist
from kiln.passes.pattern import Op, Rule, Var, apply_rules
from kiln.passes.registry import PassContext, graph_pass

X = Var("x")
HALF = Op("Concat", Op("Neg", Op("Slice", X, name="second")), Op("Slice", X, name="first"), name="cat")
ROTARY = Op("Add", Op("Mul", X, Var("cos")), Op("Mul", HALF, Var("sin")))

DOMAIN = "kiln"
DTYPES = ("float32", "float64")   # each op rounds in x's dtype in the kernel as in the graph


def _ints(node: Node, k: int, attr: str):
    """A Slice's starts/ends/axes/steps as a list (input k from opset 10, else attribute), or
    None when not constant; [] when absent."""
    if len(node.inputs) > 1:
        v = node.inputs[k] if k < len(node.inputs) else None
        if v is None:
            return []
        return None if v.const is None else [int(a) for a in v.const.reshape(-1)]
    return [int(a) for a in node.attrs.get(attr, [])]


def _window(node: Node, rank: int, d: int) -> tuple[int, int] | None:
    """The [start, end) a one-axis, step-1 Slice keeps of the last axis (length d), or None."""
    starts, ends, axes, steps = (_ints(node, k, a) for k, a in ((1, "starts"), (2, "ends"), (3, "axes"), (4, "steps")))
    if starts is None or ends is None or axes is None or steps is None or len(starts) != 1 or len(ends) != 1:
        return None
    if (axes or [0])[0] % rank != rank - 1 or len(axes) > 1 or (steps or [1]) != [1]:
        return None
    clamp = lambda i: min(max(i + d if i < 0 else i, 0), d)  # noqa: E731
    return clamp(starts[0]), clamp(ends[0])


def _broadcasts_to(v, shape) -> bool:
    """v's shape broadcasts (numpy, right-aligned) to `shape` without widening it."""
    t = v.type
    if getattr(t, "shape", None) is None or len(t.shape) > len(shape):
        return False
    return all(c == 1 or c == s for c, s in zip(t.shape[::-1], shape[::-1]))


def _rotary(m, b):
    x, cos, sin = m["x"], m["cos"], m["sin"]
    shape = x.type.shape if x.type is not None else None
    if shape is None or not shape or x.type.dtype.name not in DTYPES or cos is x or sin is x:
        return None
    d, rank = shape[-1], len(shape)
    if not isinstance(d, int) or d % 2 or any(v.type.dtype != x.type.dtype or not _broadcasts_to(v, shape)
                                             for v in (cos, sin)):
        return None
    cat = m.node("cat")
    if cat.attrs.get("axis", 0) % rank != rank - 1 or len(cat.inputs) != 2:
        return None
    if _window(m.node("first"), rank, d) != (0, d // 2) or _window(m.node("second"), rank, d) != (d // 2, d):
        return None
    return b.op("RotaryHalf", [x, cos, sin], {}, domain=DOMAIN)


RULES = [Rule("RotaryHalf", ROTARY, _rotary, private=True)]


@graph_pass("recognize_rotary")
def recognize_rotary(graph: Graph, ctx: PassContext) -> Graph:
    """Replace x*cos + rotate_half(x)*sin (Slice/Neg/Concat) by one kiln::RotaryHalf."""
    fired = apply_rules(graph, RULES, reverse=True)
    if fired:
        graph.opsets.setdefault(DOMAIN, 1)
    for n in [n for n in graph.nodes if n.op == "RotaryHalf" and n.domain == DOMAIN]:
        hoist(graph, n)   # right after x's head split, whose kernel it joins
    ctx.tally(fired)
    return graph
