"""Rewrites as data: patterns over values, rules `(pattern, rewrite)`, a driver.

A pattern describes the expression that produced a value:

    Op("Mul", Op("Mul", Var("x"), Const("c1"), name="inner"), Const("c2"))

`Var` matches any value, `Const` a constant (optionally satisfying a test on its
data), `Op` a value produced (as output 0) by a node of that op whose first
inputs match the sub-patterns (extra inputs are the rule's business; binary
commutative ops are tried both ways round), `Or` any of its alternatives. A
name used twice must bind the same value (`Op("Mul", Var("x"), Var("x"))` is a
square). This is the shape of tinygrad's PatternMatcher and TVM's dataflow
patterns, small enough to read in one sitting.

A `Rule` pairs a pattern with `rewrite(match, builder) -> Value | None`: the
value the root should become (an existing value, or one built with `builder`),
or None to decline. `apply_rules` walks the top-level nodes, tries the rules
whose root op matches, and commits a rewrite only if it keeps the root's type:
a value built by the rule *takes over* the root value (same object, same name,
so graph outputs and later readers are untouched); an existing value replaces
every read of the root. Matched nodes that nothing reads any more are removed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from kiln.graph.ir import Graph, Node, Value
from kiln.passes.edit import (Namer, can_replace, new_const, new_node, producers, reads,
                              refines, remove_nodes, replace_value, same_type, use_counts)

COMMUTATIVE = {"Add", "Mul", "Max", "Min", "And", "Or", "Xor", "Equal", "BitwiseAnd",
               "BitwiseOr", "BitwiseXor"}


@dataclass(frozen=True, eq=False)
class Pat:
    kind: str                                  # "var" | "const" | "op" | "or"
    name: str | None = None
    ops: tuple[str, ...] = ()
    inputs: tuple["Pat", ...] = ()
    when: Callable | None = None
    alts: tuple["Pat", ...] = ()


def Var(name: str | None = None, when: Callable[[Value], bool] | None = None) -> Pat:
    return Pat("var", name, when=when)


def Const(name: str | None = None, when: Callable[[np.ndarray], bool] | None = None) -> Pat:
    return Pat("const", name, when=when)


def Op(op: str | tuple[str, ...], *inputs: Pat, name: str | None = None,
       when: Callable[[Node], bool] | None = None) -> Pat:
    return Pat("op", name, (op,) if isinstance(op, str) else tuple(op), tuple(inputs), when)


def Or(*alts: Pat, name: str | None = None) -> Pat:
    return Pat("or", name, alts=alts)


def root_ops(p: Pat) -> set[str]:
    if p.kind == "op":
        return set(p.ops)
    if p.kind == "or":
        return set().union(*(root_ops(a) for a in p.alts))
    raise ValueError("a rule's pattern must be rooted at an op")


Env = dict[str, Value]


def match(p: Pat, v: Value | None, env: Env, nodes: tuple[Node, ...],
          producers: dict[int, Node]) -> Iterator[tuple[Env, tuple[Node, ...]]]:
    """Every way `v` matches `p` extending bindings `env`: (bindings, matched nodes)."""
    if v is None:
        return
    if p.name is not None and p.name in env:
        if env[p.name] is v:
            yield env, nodes
        return
    env = {**env, p.name: v} if p.name is not None else env
    if p.kind == "or":
        for a in p.alts:
            yield from match(a, v, env, nodes, producers)
    elif p.kind == "var":
        if p.when is None or p.when(v):
            yield env, nodes
    elif p.kind == "const":
        if v.const is not None and (p.when is None or p.when(v.const)):
            yield env, nodes
    else:
        n = producers.get(v.id)
        if (n is None or n.domain or n.op not in p.ops or n.outputs[0] is not v
                or len(n.inputs) < len(p.inputs) or (p.when is not None and not p.when(n))):
            return
        ins = n.inputs[:len(p.inputs)]
        orders = [ins, ins[::-1]] if n.op in COMMUTATIVE and len(ins) == 2 else [ins]
        for order in orders:
            yield from _match_all(p.inputs, order, env, nodes + (n,), producers)


def _match_all(pats, vals, env, nodes, producers):
    if not pats:
        yield env, nodes
        return
    for env2, nodes2 in match(pats[0], vals[0], env, nodes, producers):
        yield from _match_all(pats[1:], vals[1:], env2, nodes2, producers)


class Match:
    """One match of a rule: bound values by name, the matched nodes, use counts."""

    def __init__(self, root_node: Node, env: Env, nodes: tuple[Node, ...],
                 producers: dict[int, Node], counts):
        self.root_node = root_node
        self.root = root_node.outputs[0]
        self.env = env
        self.nodes = list({id(n): n for n in nodes}.values())
        self.producers = producers
        self.counts = counts

    def __getitem__(self, name: str) -> Value:
        return self.env[name]

    def get(self, name: str) -> Value | None:
        return self.env.get(name)

    def node(self, name: str) -> Node:
        """The node that produced the value bound to `name`."""
        return self.producers[self.env[name].id]

    def const(self, name: str) -> np.ndarray:
        return self.env[name].const

    def producer(self, v: Value | None) -> Node | None:
        return None if v is None else self.producers.get(v.id)

    def uses(self, v: Value) -> int:
        return self.counts[v.id]

    def claim(self, *nodes: Node) -> None:
        """Add nodes a rewrite found by hand to the match (for the privacy check and cleanup)."""
        for n in nodes:
            if all(n is not m for m in self.nodes):
                self.nodes.append(n)

    def private(self) -> bool:
        """Is every value the matched nodes produce (but the root) read only inside the match?"""
        inside: dict[int, int] = {}
        for n in self.nodes:
            for v in n.inputs:
                if v is not None:
                    inside[v.id] = inside.get(v.id, 0) + 1
        return all(v is None or v is self.root or self.counts[v.id] == inside.get(v.id, 0)
                   for n in self.nodes for v in n.outputs)


class Builder:
    """Makes the nodes and constants of a replacement, named after the node they replace."""

    def __init__(self, graph: Graph, namer: Namer, anchor: Node):
        self.graph = graph
        self.namer = namer
        self.anchor = anchor
        self.nodes: list[Node] = []

    def opset(self, domain: str = "") -> int:
        return self.graph.opset(domain)

    def op(self, op: str, inputs: list[Value | None], attrs: dict | None = None,
           name: str | None = None, domain: str = "") -> Value:
        """A new single-output node. `name` may only reuse the name of a matched node that
        the rewrite replaces (a folded Conv keeps its name); by default the name is
        fresh, after the root node: `Add_3.LayerNormalization`. `domain`: an op of kiln's own
        ("kiln") or another domain."""
        if name is None:
            name = out = self.namer.fresh(f"{self.anchor.name or self.anchor.op}.{op}")
        else:
            out = self.namer.fresh(name)
        node = new_node(self.graph, op, inputs, name, [out], attrs, domain)
        self.nodes.append(node)
        return node.outputs[0]

    def const(self, data: np.ndarray, base: str | None = None) -> Value:
        return new_const(self.namer, base or f"{self.anchor.name or self.anchor.op}.c", data)


Rewrite = Callable[[Match, Builder], "Value | None"]


@dataclass(frozen=True)
class Rule:
    name: str
    pattern: Pat
    rewrite: Rewrite
    private: bool = False   # values inside the match may not be read outside it


def apply_rules(graph: Graph, rules: list[Rule], *, reverse: bool = False,
                max_sweeps: int = 32) -> dict[str, int]:
    """Apply `rules` over the top-level nodes until none fires; returns firings per rule.

    `reverse` walks consumers before producers, so a rule rooted at the end of a
    long chain (LayerNorm's final Add) sees the chain before a shorter rule
    rooted inside it does.
    """
    by_op: dict[str, list[Rule]] = {}
    for r in rules:
        for op in sorted(root_ops(r.pattern)):
            by_op.setdefault(op, []).append(r)
    namer = Namer(graph)
    fired: dict[str, int] = {}
    for _ in range(max_sweeps):
        before = sum(fired.values())
        order = graph.nodes[::-1] if reverse else list(graph.nodes)
        state = _State(graph)
        for node in order:
            if id(node) not in state.alive or node.domain or not node.outputs:
                continue
            for rule in by_op.get(node.op, ()):
                if _try(graph, rule, node, state, namer):
                    fired[rule.name] = fired.get(rule.name, 0) + 1
                    state = _State(graph)
                    break
        if sum(fired.values()) == before:
            break
    return fired


class _State:
    def __init__(self, graph: Graph):
        self.producers = producers(graph)
        self.counts = use_counts(graph)
        self.alive = {id(n) for n in graph.nodes}


def _try(graph: Graph, rule: Rule, node: Node, state: _State, namer: Namer) -> bool:
    root = node.outputs[0]
    if root is None:
        return False
    for env, nodes in match(rule.pattern, root, {}, (), state.producers):
        m = Match(node, env, nodes, state.producers, state.counts)
        b = Builder(graph, namer, node)
        result = rule.rewrite(m, b)
        if result is None or result is root or (rule.private and not m.private()):
            continue
        if _commit(graph, m, b, result):
            return True
    return False


def _commit(graph: Graph, m: Match, b: Builder, result: Value) -> bool:
    root, rnode = m.root, m.root_node
    if any(v is not None and v is not root and m.counts[v.id] for v in rnode.outputs):
        return False  # the root's node goes away, and something reads its other outputs
    made = {v.id: n for n in b.nodes for v in n.outputs if v is not None}
    if result.id in made:
        if not refines(result.type, root.type):
            return False
        n = made[result.id]
        n.outputs = [root if v is result else v for v in n.outputs]
        result = root
    elif not (same_type(result.type, root.type) and can_replace(graph, root, result)):
        return False
    needed = _needed(b.nodes, result)
    pos = next(i for i, n in enumerate(graph.nodes) if n is rnode)
    graph.nodes[pos:pos + 1] = needed
    if result is not root:
        replace_value(graph, root, result)
    drop_unread(graph, m.nodes)
    return True


def _needed(nodes: list[Node], result: Value) -> list[Node]:
    """The built nodes `result` depends on, in build order."""
    want, keep = {result.id}, []
    for n in reversed(nodes):
        if any(v is not None and v.id in want for v in n.outputs):
            keep.append(n)
            want.update(v.id for v in n.inputs if v is not None)
    return keep[::-1]


def drop_unread(graph: Graph, candidates: list[Node]) -> None:
    """Remove those of `candidates` (still in the graph) whose outputs nothing reads."""
    counts = use_counts(graph)
    pos = {id(n): i for i, n in enumerate(graph.nodes)}
    dead: set[int] = set()
    for n in sorted((n for n in candidates if id(n) in pos), key=lambda n: -pos[id(n)]):
        if all(v is None or counts[v.id] == 0 for v in n.outputs):
            dead.add(id(n))
            for v in reads(n):
                counts[v.id] -= 1
    remove_nodes(graph, dead)
