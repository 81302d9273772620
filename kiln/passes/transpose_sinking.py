"""Transpose sinking: move Transposes down past layout-agnostic ops until pairs meet.

An op that treats every element alike does not care in which order the axes are
laid out, so a Transpose feeding it can move to its output:

- unary elementwise ops (Relu, Exp, Cast, ...; Clip and CastLike, whose extra
  inputs are scalars or only a dtype): op(T(x)) → T(op(x));
- binary elementwise/broadcast ops (Add, Mul, Where-less comparisons, PRelu, ...)
  whose other operand is
  * a constant: permuted at compile time, T(x) + c → T(x + c') with c' the
    constant (broadcast to the rank) under the inverse perm;
  * a one-element value of no higher rank: it broadcasts in any layout;
  * the same Transpose of another value: T(x) + T(y) → T(x + y), one transpose
    instead of two.

A Reshape sinks past a unary elementwise op the same way (op(R(x)) → R(op(x))), so that
the op reaches the producer of a pure data-movement chain: a detector head's Conv →
Reshape → Transpose → Reshape → Sigmoid becomes Conv → Sigmoid → ..., the Sigmoid then an
epilogue of the (blocked) conv, computed once per element in its vector registers, and the
chain a plain copy (it had evaluated the Sigmoid per gathered element, and again per
element of every Concat branch that read it).

When a sunk Transpose reaches another one, the pair composes (the transpose-pair
rule of `simplify_algebra`, reused here): into one Transpose, or into nothing when
the perms are inverse. A Transpose is only moved when the op it passes is its only
reader (and, for T(x) + T(y), both are), so work is never duplicated; the moved
Transpose takes over the op's output value, so graph outputs keep their names.
"""

from __future__ import annotations

import numpy as np

from kiln.graph.ir import Graph, Value
from kiln.passes.algebraic import RULES as ALGEBRA_RULES, transpose_perm
from kiln.ops.kinds import Kind, ops_of_kind
from kiln.passes.pattern import Match, Op, Rule, Var, apply_rules
from kiln.passes.registry import PassContext, graph_pass

UNARY = tuple(ops_of_kind(Kind.ELEMWISE)) + (
    "Clip", "CastLike")
BINARY = ("Add", "Sub", "Mul", "Div", "Pow", "Mod", "PRelu", "And", "Or", "Xor", "Equal", "Less",
          "LessOrEqual", "Greater", "GreaterOrEqual", "Max", "Min", "BitShift", "BitwiseAnd",
          "BitwiseOr", "BitwiseXor")
# the unary ops a Reshape sinks past: not the casts (a mask's Reshape -> Cast, which the
# attention patterns read in that order; nothing to gain by moving a cast to its producer)
RESHAPE_UNARY = tuple(op for op in UNARY if op not in ("Cast", "CastLike"))
NOT_FIRST = {"PRelu"}   # broadcast one way only: the transposed operand must be the data

TRANSPOSE_PAIR = next(r for r in ALGEBRA_RULES if r.name == "transpose pair")


def _rank(v: Value | None) -> int | None:
    return getattr(v.type, "rank", None) if v is not None else None


def _sunk(m: Match, b, inputs: list[Value | None]) -> Value | None:
    """T(op(inputs)), with the matched Transpose's perm, replacing the root."""
    root = m.root_node
    rank = _rank(m["x"])
    if rank is None or _rank(m.root) != rank:
        return None
    inner = b.op(root.op, inputs, dict(root.attrs))
    return b.op("Transpose", [inner], {"perm": transpose_perm(m.node("t"), rank)})


def _sink_unary(m: Match, b):
    return _sunk(m, b, [m["x"], *m.root_node.inputs[1:]])


def _moved_operand(m: Match, b, other: Value, perm: list[int]) -> Value | None:
    """`other` as it must read once the Transpose moves past the op (None: it cannot)."""
    rank = len(perm)
    r = _rank(other)
    if r is None or r > rank:
        return None
    p = m.producer(other)
    if p is not None and p.op == "Transpose" and not p.domain and r == rank \
            and transpose_perm(p, rank) == perm and m.uses(other) == 1:
        m.claim(p)
        return p.inputs[0]
    if other.const is not None:
        if other.const.size == 1:
            return other
        c = other.const.reshape((1,) * (rank - r) + other.const.shape)
        return b.const(np.transpose(c, np.argsort(perm)))
    shape = getattr(other.type, "shape", None)
    if shape is not None and all(d == 1 for d in shape):
        return other
    return None


def _sink_binary(m: Match, b):
    root = m.root_node
    if len(root.inputs) != 2:
        return None
    # which input is the matched Transpose (commutative ops match either way round)
    pos = 0 if root.inputs[0] is m["t"] else 1
    rank = _rank(m["x"])
    if rank is None or (pos and root.op in NOT_FIRST):
        return None
    other = _moved_operand(m, b, root.inputs[1 - pos], transpose_perm(m.node("t"), rank))
    if other is None:
        return None
    return _sunk(m, b, [m["x"], other] if pos == 0 else [other, m["x"]])


def _sink_reshape_unary(m: Match, b):
    """R(op(x)): the matched Reshape's shape input and attributes, the op's own extra inputs."""
    root, r = m.root_node, m.node("r")
    if len(root.outputs) != 1 or len(r.inputs) != 2:
        return None
    inner = b.op(root.op, [m["x"], *root.inputs[1:]], dict(root.attrs))
    return b.op("Reshape", [inner, r.inputs[1]], dict(r.attrs))


def _transposed(name: str = "t") -> Op:
    return Op("Transpose", Var("x"), name=name)


RULES = [
    Rule("sink past unary", Op(UNARY, _transposed()), _sink_unary, private=True),
    Rule("sink reshape past unary", Op(RESHAPE_UNARY, Op("Reshape", Var("x"), name="r")), _sink_reshape_unary,
         private=True),
    Rule("sink past binary", Op(BINARY, _transposed(), Var()), _sink_binary, private=True),
    Rule("sink past binary", Op(BINARY, Var(), _transposed()), _sink_binary, private=True),
    TRANSPOSE_PAIR,
]


@graph_pass("sink_transposes")
def sink_transposes(graph: Graph, ctx: PassContext) -> Graph:
    """Move Transposes past elementwise ops so that pairs meet and cancel."""
    ctx.tally(apply_rules(graph, RULES))
    return graph
