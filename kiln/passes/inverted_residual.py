"""Fused inverted residuals: expand 1x1 -> act -> depthwise -> act -> project 1x1 -> act (+ r)
in the blocked layout becomes one kiln::InvertedResidual (kiln.ops.inverted_residual).

Runs after the layout pass, on ConvNCHWc nodes. The chain matches by structure alone, whatever
the channel counts, kernel size (KxK depthwise, any stride, no dilation) or activations:

- the expand conv: 1x1, stride 1, unpadded, dense (not grouped), no squeeze-excite `scale`, a
  whole block of input channels per block (not a stem's narrow block);
- the depthwise conv: undilated, no `scale` (a squeeze-excite gate between the depthwise and
  the project conv needs the whole plane first: such a block's expand -> depthwise part alone
  becomes one kiln::ExpandDepthwise, below);
- the project conv: as the expand conv;
- after each conv at most one activation of ACTS (Relu, Clip with min <= 0 <= max, HardSwish,
  Swish): each maps 0 to 0, so the padding channels stay zero; then at most one Add of a
  tensor shaped like the result (the residual);
- every value inside the chain read only by the chain (and no graph output).

Whether a match is fused is kiln.lower.conv_algo.choose_inverted_residual's rule; every match
is listed in the pass's findings (`model.report`) with the choice and why.

An expand -> depthwise pair left over (its depthwise result read by a squeeze-excite gate and
the project conv, as in EfficientNet and MobileNetV3, or by anything else) becomes one
kiln::ExpandDepthwise by choose_expand_depthwise's rule, with a global average pool of its
result (the gate's) as the kernel's second output: the expanded tensor then stays in L1/L2
too, and the pool needs no pass of its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kiln.graph.ir import Graph, Node, Value
from kiln.lower.conv_algo import Choice, asked_inverted_residual, choose_expand_depthwise, choose_inverted_residual
from kiln.ops.layout import DOMAIN
from kiln.passes.edit import Namer, const_scalar, new_const, new_node, producers, remove_nodes, static_shape, use_counts
from kiln.passes.registry import PassContext, graph_pass


@dataclass(frozen=True)
class InvertedResidualChoice:
    """A finding: one expand/depthwise/project chain, fused or not, and why."""
    node: str                     # the project conv's node
    shape: str
    choice: Choice

    def __str__(self) -> str:
        return f"inverted residual ending at {self.node!r} [{self.shape}]: {self.choice.algorithm} " \
               f"({self.choice.reason})"


def activation(node: Node) -> tuple[str, float, float] | None:
    """(name, min, max) of an activation the fused kernel runs, or None."""
    if node.domain or len(node.outputs) != 1:
        return None
    if node.op == "Relu":
        return ("relu", 0.0, 0.0)
    if node.op == "HardSwish":
        return ("hardswish", 0.0, 0.0)
    if node.op == "Swish" and float(node.attrs.get("alpha", 1.0)) == 1.0:
        return ("swish", 0.0, 0.0)
    if node.op == "Clip":
        bounds = []
        for i, key, dflt in ((1, "min", -math.inf), (2, "max", math.inf)):
            v = node.inputs[i] if len(node.inputs) > i else None
            if v is None:
                bounds.append(float(node.attrs.get(key, dflt)))
                continue
            c = const_scalar(v)
            if c is None:
                return None
            bounds.append(c)
        lo, hi = bounds
        return ("clip", lo, hi) if lo <= 0 <= hi else None
    return None


def _conv(node: Node | None, depthwise: bool) -> bool:
    if node is None or node.op != "ConvNCHWc" or node.domain != DOMAIN or len(node.inputs) > 3:
        return False
    if bool(node.attrs.get("depthwise", 0)) != depthwise or node.inputs[1].const is None:
        return False
    if len(node.inputs) == 3 and node.inputs[2] is not None and node.inputs[2].const is None:
        return False
    w = node.inputs[1].const
    xs = static_shape(node.inputs[0])
    if xs is None or w.dtype.name != "float32" or str(node.inputs[0].type.dtype) != "float32":
        return False
    if list(node.attrs.get("dilations", [1, 1])) != [1, 1] or int(node.attrs.get("groups", 1)) != 1 \
            or int(node.attrs.get("rotate", 1)) != 1:     # (rotate: a grouped conv, not depthwise)
        return False
    if depthwise:
        return True
    return (tuple(w.shape[2:4]) == (1, 1) and w.shape[1] == xs[1] and w.shape[4] == w.shape[5] == xs[4]
            and list(node.attrs.get("strides", [1, 1])) == [1, 1] and not any(node.attrs.get("pads", [0] * 4)))


class Chains:
    """The walk up from a value through single-use producers."""

    def __init__(self, graph: Graph):
        self.made, self.uses = producers(graph), use_counts(graph)
        self.outputs = {v.id for v in graph.outputs}

    def private(self, v: Value) -> bool:
        return self.uses[v.id] == 1 and v.id not in self.outputs

    def conv_and_act(self, v: Value, depthwise: bool):
        """(conv, act node or None, act) producing `v`, or None."""
        n = self.made.get(v.id)
        act = activation(n) if n is not None else None
        a = None
        if act is not None:
            a, n = n, self.made.get(n.inputs[0].id)
            if not self.private(a.inputs[0]):
                return None
        if not _conv(n, depthwise):
            return None
        return n, a, act or ("", 0.0, 0.0)

    def match(self, last: Node):
        """The chain ending at node `last` (an Add, an activation or the project conv), or None:
        (nodes, convs, acts, residual)."""
        residual, v = None, last.outputs[0]
        nodes = []
        if last.op == "Add" and not last.domain and len(last.inputs) == 2:
            out = static_shape(last.outputs[0])
            for i in (0, 1):
                a, r = last.inputs[i], last.inputs[1 - i]
                if a is not None and r is not None and static_shape(a) == static_shape(r) == out \
                        and self.private(a) and self.conv_and_act(a, False) is not None:
                    residual, v = r, a
                    nodes.append(last)
                    break
            else:
                return None
        third = self.conv_and_act(v, False)
        if third is None:
            return None
        c3, a3, act3 = third
        if not self.private(c3.inputs[0]):
            return None
        second = self.conv_and_act(c3.inputs[0], True)
        if second is None:
            return None
        c2, a2, act2 = second
        if not self.private(c2.inputs[0]):
            return None
        first = self.conv_and_act(c2.inputs[0], False)
        if first is None:
            return None
        c1, a1, act1 = first
        if residual is not None and residual.id == c1.outputs[0].id:
            return None
        nodes += [n for n in (a3, c3, a2, c2, a1, c1) if n is not None]
        return nodes, (c1, c2, c3), (act1, act2, act3), residual


def _bias(namer: Namer, conv: Node, blocks: int, lanes: int) -> Value:
    """The conv's packed bias, or zeros (the kernel always adds one)."""
    if len(conv.inputs) > 2 and conv.inputs[2] is not None:
        return conv.inputs[2]
    return new_const(namer, f"{conv.name}.bias.zero", np.zeros((blocks, lanes), np.float32))


@graph_pass("fuse_inverted_residual")
def fuse_inverted_residual(graph: Graph, ctx: PassContext) -> Graph:
    """Expand 1x1 -> depthwise -> project 1x1 chains (blocked) as one kiln::InvertedResidual."""
    override = asked_inverted_residual(ctx.decisions)
    chains, namer, fused = Chains(graph), Namer(graph), 0
    taken: set[int] = set()
    for last in reversed(list(graph.nodes)):      # an Add before the conv it may end with
        if id(last) in taken or last.op not in ("Add", "ConvNCHWc", "Relu", "Clip", "HardSwish", "Swish"):
            continue
        m = chains.match(last)
        if m is None:
            continue
        nodes, (c1, c2, c3), acts, residual = m
        if any(id(n) in taken for n in nodes):
            continue
        xs = static_shape(c1.inputs[0])
        es = static_shape(c1.outputs[0])
        ys = static_shape(c3.outputs[0])
        expanded = math.prod(es[1:]) * 4
        desc = (f"{xs[1] * xs[4]}->{es[1] * es[4]}->{ys[1] * ys[4]} "
                f"dw {'x'.join(map(str, c2.attrs['kernel_shape']))} s{c2.attrs.get('strides', [1, 1])[0]} "
                f"on {xs[2]}x{xs[3]}{' +residual' if residual is not None else ''}")
        choice = choose_inverted_residual(expanded, ctx.target, override, tuple(a[0] for a in acts),
                                          (xs[3], ys[3]), es[0])
        ctx.report(InvertedResidualChoice(c3.name, desc, choice))
        if choice.algorithm != "inverted-residual":
            taken.update(id(n) for n in nodes)      # (reported once, not again without its Add)
            continue
        lanes = xs[4]
        ins = [c1.inputs[0], c1.inputs[1], _bias(namer, c1, es[1], lanes), c2.inputs[1],
               _bias(namer, c2, es[1], lanes), c3.inputs[1], _bias(namer, c3, ys[1], lanes)]
        if residual is not None:
            ins.append(residual)
        attrs = {"kernel_shape": list(c2.attrs["kernel_shape"]), "strides": list(c2.attrs.get("strides", [1, 1])),
                 "pads": list(c2.attrs.get("pads", [0, 0, 0, 0])), "act": [a[0] for a in acts],
                 "clip": [float(b) for a in acts for b in a[1:]]}
        out = last.outputs[0]
        node = new_node(graph, "InvertedResidual", ins, namer.fresh(f"{c3.name}.inverted_residual"),
                        [namer.fresh(out.name + ".ir")], attrs, DOMAIN)
        if node.outputs[0].type != out.type:
            continue
        node.outputs = [out]
        taken.update(id(n) for n in nodes)
        at = graph.nodes.index(last)
        graph.nodes.insert(at, node)
        remove_nodes(graph, {id(n) for n in nodes})
        fused += 1
    found = _fuse_expand_depthwise(graph, ctx, override, taken)
    ctx.tally({k: v for k, v in (("InvertedResidual", fused), ("ExpandDepthwise", found)) if v})
    return graph


def _fuse_expand_depthwise(graph: Graph, ctx: PassContext, override, taken: set[int]) -> int:
    """The expand 1x1 -> depthwise part of chains not taken above (their project conv does not
    follow row by row: a squeeze-excite gate, as in EfficientNet, or another reader of the
    depthwise result) as one kiln::ExpandDepthwise, by the same rule; a global average pool of
    the result (the gate's) becomes the kernel's second output. Returns how many."""
    chains, namer, fused = Chains(graph), Namer(graph), 0
    readers = graph.consumers()
    for last in reversed(list(graph.nodes)):
        if id(last) in taken or last.op not in ("ConvNCHWc", "Relu", "Clip", "HardSwish", "Swish"):
            continue
        second = chains.conv_and_act(last.outputs[0], True)
        if second is None or (second[1] or second[0]) is not last or not chains.private(second[0].inputs[0]):
            continue
        c2, a2, act2 = second
        first = chains.conv_and_act(c2.inputs[0], False)
        if first is None:
            continue
        c1, a1, act1 = first
        nodes = [n for n in (a2, c2, a1, c1) if n is not None]
        if any(id(n) in taken for n in nodes):
            continue
        d = last.outputs[0]
        pools = [n for n in readers.get(d.id, []) if n.op == "GlobalAveragePoolNCHWc" and n.domain == DOMAIN
                 and id(n) not in taken]
        xs, es, ds = static_shape(c1.inputs[0]), static_shape(c1.outputs[0]), static_shape(d)
        desc = (f"{xs[1] * xs[4]}->{es[1] * es[4]} dw {'x'.join(map(str, c2.attrs['kernel_shape']))} "
                f"s{c2.attrs.get('strides', [1, 1])[0]} on {xs[2]}x{xs[3]}, no project"
                f"{' (+ its global average pool)' if pools else ''}")
        strided = any(int(s) > 1 for s in c2.attrs.get("strides", [1, 1]))
        choice = choose_expand_depthwise(math.prod(es[1:]) * 4, strided, ctx.target, override, (act1[0], act2[0]),
                                         (xs[3], ds[3]), es[0])
        ctx.report(InvertedResidualChoice(c2.name, desc, choice))
        taken.update(id(n) for n in nodes)
        if choice.algorithm != "inverted-residual":
            continue
        ins = [c1.inputs[0], c1.inputs[1], _bias(namer, c1, es[1], xs[4]), c2.inputs[1],
               _bias(namer, c2, es[1], xs[4])]
        attrs = {"kernel_shape": list(c2.attrs["kernel_shape"]), "strides": list(c2.attrs.get("strides", [1, 1])),
                 "pads": list(c2.attrs.get("pads", [0, 0, 0, 0])), "act": [act1[0], act2[0], ""],
                 "clip": [float(b) for b in (*act1[1:], *act2[1:], 0.0, 0.0)], "pool": int(bool(pools))}
        outs = [d] + [p.outputs[0] for p in pools[:1]]
        node = new_node(graph, "ExpandDepthwise", ins, namer.fresh(f"{c2.name}.expand_depthwise"),
                        [namer.fresh(v.name + ".ed") for v in outs], attrs, DOMAIN)
        if [v.type for v in node.outputs] != [v.type for v in outs] or ds is None:
            continue
        node.outputs = outs
        graph.nodes.insert(graph.nodes.index(last), node)
        remove_nodes(graph, {id(n) for n in nodes + pools[:1]})
        fused += 1
    return fused
