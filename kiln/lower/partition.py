"""Operator fusion: partition a (specialised) graph into groups, each lowered as one kernel.

The first stage of lowering (kiln.compiler: partition -> lower each group -> plan memory
-> emit). What each op is (its kind) is declared with the op (OpDef.fusion, read through
kiln.ops.kinds); which anchors take epilogues and prologues is what lowering can schedule.

Decisions follow op pattern kinds, as in TVM (elementwise < broadcast <
injective < reduction < out-elementwise-fusable < opaque): a node joins the
group of the producer of one of its inputs when that edge is the producer's
only use, and the kinds allow it — elementwise/broadcast/injective chains fuse
into one loop nest; elementwise epilogues fuse into a Conv/MatMul/Gemm anchor
when the anchor's lowering can take them. The other way round, an injective
*prologue* (a group of index-remapping ops: Transpose, Reshape, Slice, Expand, ...)
whose only reader is a MatMul/Gemm or a reduction folds into that consumer's
group: lowering inlines it, so it becomes index arithmetic in the anchor's reads
(the GEMM's packing of B, the reduction's loads) instead of a copy kernel. Every
edge that is not fused is logged with its reason (`FusionPlan.why_not`), like
Inductor's WhyNoFuse.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kiln.graph.ir import Graph, Node, Value
from kiln.graph.types import TensorType
from kiln.lower.concat_parts import part_offsets
from kiln.ops.kinds import PROLOGUE_OPS, VIEW_OPS, Kind, declared_kind

# Anchors whose lowering's schedule tiles a fused elementwise epilogue (kiln.lower.gemm,
# the conv schedules; the packed MatMul's: bias, GELU, residual Add)
EPILOGUE_ANCHORS = {("", "MatMul"), ("", "Gemm"), ("", "Conv"), ("kiln", "ConvNCHWc"), ("kiln", "MatMulPacked")}

# Anchors whose lowering reads its inputs only through compute loads (so an inlined
# prologue becomes index arithmetic) and whose schedule leaves inlined stages alone:
# the GEMM (kiln.lower.gemm inlines operand producers, into B's packing) and the ONNX
# reductions (every op declaring REDUCTION: their schedules skip inlined stages; see
# `prologue_anchor`). Conv is not one: its schedule builds padded planes of a placeholder
# input. The packed MatMul reads its activations through inlined index remapping
# (attention's head-merge Transpose + Reshape).
PROLOGUE_ANCHORS = {("", "MatMul"), ("", "Gemm"), ("kiln", "MatMulPacked")}


MAX_GROUP = 16  # nodes per group: long chains compile slowly and gain little more


def kind_of(node: Node) -> Kind:
    """The node's fusion kind as its op declares it (a node with subgraphs is opaque)."""
    if list(node.subgraphs()):
        return Kind.OPAQUE
    return declared_kind(node.domain or "", node.op)


def prologue_anchor(node: Node) -> bool:
    """Whether `node`'s lowering may read its inputs through an inlined index-remapping prologue."""
    key = _key(node)
    return key in PROLOGUE_ANCHORS or (key[0] == "" and kind_of(node) == Kind.REDUCTION)


def group_anchor(nodes: list[Node]) -> Node:
    """The node that decides a group's kernel schedule: its most complex member, the first
    of the highest kind (the MatMul/Conv/reduction between its prologues and epilogue)."""
    return max(nodes, key=kind_of)


@dataclass
class Group:
    nodes: list[Node]
    kind: Kind

    @property
    def anchor(self) -> Node:
        return group_anchor(self.nodes)

    @property
    def name(self) -> str:
        return "_".join(n.op for n in self.nodes[:4]) + ("_etc" if len(self.nodes) > 4 else "")


@dataclass
class FusionPlan:
    groups: list[Group]
    why_not: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"{len(self.groups)} kernels"]
        lines += [f"  [{g.kind.name.lower()}] " + " -> ".join(f"{n.op}({n.name})" for n in g.nodes)
                  for g in self.groups]
        return "\n".join(lines)


def _same_shape(a: Value, b: Value) -> bool:
    return isinstance(a.type, TensorType) and isinstance(b.type, TensorType) and \
        a.type.shape is not None and a.type.shape == b.type.shape


def _key(n: Node) -> tuple[str, str]:
    return (n.domain or "", n.op)


def partition(graph: Graph, fuse_anchors: bool = False, fuse_prologues: bool | None = None) -> FusionPlan:
    """Group the graph's nodes (in order) for kernel generation.

    `fuse_anchors`: also take elementwise epilogues into Conv/MatMul/Gemm groups
    (only when the lowering layer can schedule anchor + epilogue together).
    `fuse_prologues` (default: as `fuse_anchors`): fold injective index-remapping
    groups into the MatMul/Gemm/reduction that is their only reader.
    """
    if fuse_prologues is None:
        fuse_prologues = fuse_anchors
    consumers = graph.consumers()
    outputs = {v.id for v in graph.outputs}
    group_of: dict[int, Group] = {}   # node id -> group
    producer: dict[int, Node] = {v.id: n for n in graph.nodes for v in n.outputs if v is not None}
    groups: list[Group] = []
    why: list[str] = []
    for n in graph.nodes:
        k = kind_of(n)
        target = None
        # an anchor or reduction joins no producer; it may take producers in as prologues
        folded, refused = _prologues(n, producer, group_of, consumers, outputs) \
            if fuse_prologues and k > Kind.INJECTIVE else ([], {})
        # a Concat laid out as its inputs' runs joins no producer: they write their parts in place
        # (unless one is a view, which has no kernel to write it: a group of view ops only)
        parts = n.op == "Concat" and part_offsets(n, producer, outputs, viewed={
            v.id for v in n.inputs if v is not None and v.id in producer
            and all(_key(m) in VIEW_OPS for m in group_of[id(producer[v.id])].nodes)}) is not None
        for v in n.inputs:
            if v is None or v.is_const or v.id not in producer:
                continue
            if parts:
                why.append(f"{producer[v.id].op}({producer[v.id].name}) -> {n.op}({n.name}): its inputs are "
                           "contiguous runs of its result, written there by their producers (kiln.lower.concat_parts)")
                continue
            p = producer[v.id]
            g = group_of[id(p)]
            if any(g is f for f in folded):
                continue
            reason = _refuse(n, k, v, p, g, consumers, outputs, fuse_anchors)
            if id(g) in refused:
                reason = f"{n.op} joins no producer, and not as a prologue: {refused[id(g)]}"
            if reason is None and g is groups[-1]:
                target = g
                break
            why.append(f"{p.op}({p.name}) -> {n.op}({n.name}): "
                       f"{reason or 'producer group is not the latest kernel (would reorder)'}")
        if target is None:
            target = Group([], k)
            for g in folded:  # moved to just before n: nothing but n reads them
                groups[:] = [x for x in groups if x is not g]
                target.nodes.extend(g.nodes)
                target.kind = max(target.kind, g.kind)
                for m in g.nodes:
                    group_of[id(m)] = target
            groups.append(target)
        target.nodes.append(n)
        target.kind = max(target.kind, k)
        group_of[id(n)] = target
    return FusionPlan(groups, why)


def _refuse(n: Node, k: Kind, v: Value, p: Node, g: Group, consumers, outputs, fuse_anchors) -> str | None:
    """Why `n` may not join `p`'s group through edge `v` (None: it may)."""
    if k > Kind.INJECTIVE:
        return f"{n.op} is {kind_of(n).name.lower()}; only elementwise/broadcast/injective ops join a producer"
    uses = consumers.get(v.id, [])
    if len(uses) != 1 or v.id in outputs:
        return f"%{v.name} has {len(uses)} consumers{' and is a graph output' if v.id in outputs else ''}"
    if len(g.nodes) >= MAX_GROUP:
        return f"group already has {MAX_GROUP} nodes"
    if g.kind == Kind.REDUCTION:
        return "producer group is a reduction (its epilogue is not fused yet)"
    if g.kind == Kind.OUT_FUSABLE:
        if not fuse_anchors:
            return f"anchor {g.anchor.op} epilogue fusion is off"
        if (g.anchor.domain or "", g.anchor.op) not in EPILOGUE_ANCHORS:
            return f"{g.anchor.op}'s schedule does not take an epilogue yet"
        if k > Kind.BROADCAST or not _same_shape(v, n.outputs[0]):
            return "only same-shape elementwise epilogues fuse into an anchor"
    if g.kind == Kind.OPAQUE:
        return f"producer {p.op} is opaque"
    if len(n.outputs) != 1:
        return f"{n.op} has several outputs"
    if _key(n) in VIEW_OPS and _dead_end_view(n, g, consumers):
        return (f"{n.op} is read only by ops that take no producer, and its producer group computes "
                "values: alone it is an alias of their buffer, joined it would make the group index "
                "its result through the view (a division per element where it merges dims)")
    return None


def _dead_end_view(n: Node, g: Group, consumers) -> bool:
    """Whether view `n` joining group `g` could gain nothing: no reader of its result can join
    the group after it (all are reductions, anchors or opaque), and `g` cannot fold into a
    reader as an index-remapping prologue (it computes values). Standalone, the view aliases
    g's output at no cost. Measured: a small CNN's Flatten after the blocked layout's
    FromNCHWc, joined, copied 8x32x7x7 floats in 45 us (one thread) through 4 divisions per
    element; apart, FromNCHWc runs its row-copy schedule."""
    readers = consumers.get(n.outputs[0].id, []) if n.outputs and n.outputs[0] is not None else []
    return bool(readers) and all(kind_of(r) > Kind.INJECTIVE for r in readers) \
        and any(_key(m) not in PROLOGUE_OPS for m in g.nodes)


def _prologues(n: Node, producer, group_of, consumers, outputs) -> tuple[list[Group], dict[int, str]]:
    """The producer groups of `n` that fold into its group as prologues (in input order:
    none reads another's outputs, so any order is topological), and why each other
    producer group does not (by id(group))."""
    found: list[Group] = []
    refused: dict[int, str] = {}
    for v in n.inputs:
        if v is None or v.is_const or v.id not in producer:
            continue
        g = group_of[id(producer[v.id])]
        if any(g is f for f in found) or id(g) in refused:
            continue
        reason = _refuse_prologue(n, g, consumers, outputs, sum(len(f.nodes) for f in found))
        if reason is None:
            found.append(g)
        else:
            refused[id(g)] = reason
    return found, refused


def _refuse_prologue(n: Node, g: Group, consumers, outputs, taken: int) -> str | None:
    """Why group `g` may not fold into `n`'s group as a prologue (None: it may)."""
    if g.kind > Kind.INJECTIVE:
        return f"the producer's group is {g.kind.name.lower()}"
    if not prologue_anchor(n):
        return f"{n.op}'s lowering does not read through an inlined prologue"
    bad = next((m for m in g.nodes if _key(m) not in PROLOGUE_OPS), None)
    if bad is not None:
        return (f"{bad.op}({bad.name}) computes values (they would be recomputed at every read); "
                "only index-remapping ops fold into a consumer")
    if len(g.nodes) == 1 and _key(g.nodes[0]) in VIEW_OPS:
        return "a view of its input (no kernel, no copy): nothing to gain"
    inside = {id(m) for m in g.nodes} | {id(n)}
    for m in g.nodes:
        for v in m.outputs:
            if v is None:
                continue
            if v.id in outputs:
                return f"%{v.name} is a graph output"
            readers = consumers.get(v.id, [])
            if any(id(c) not in inside for c in readers):
                return f"%{v.name} has {len(readers)} consumers"
    if len(g.nodes) + taken + 1 > MAX_GROUP:
        return f"group would exceed {MAX_GROUP} nodes"
    return None
