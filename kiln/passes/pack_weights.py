"""Pack constant GEMM weights at compile time: MatMul/Gemm → kiln::MatMulPacked.

The native GEMM (kiln.lower.gemm) reads its B operand as panels of nr columns
[ceil(N / nr), K, nr], so each k step of the micro-kernel loads contiguous
vectors. For a weight that is a constant, packing it on every inference is
wasted work (the whole weight is read, written and read again): this pass packs
it once, here, and rewrites

    MatMul(a, W)                 a: [..., M, K] (rank >= 2), W: [K, N] constant
    MatMul(a, Transpose(W'))     W' = W^T [N, K] constant (a tied embedding)
    Gemm(a, W, c) {transB, alpha, beta}   transA = 0

into `kiln::MatMulPacked(a, Wp[, c]) {n = N[, alpha, beta]}` (kiln.ops.packed).
The panel width nr depends on the target CPU's vector width (kiln.lower.gemm.
weight_panel_width of the pass context's Target), so the packed graph is specific
to the target, as the native code is. Float32 only (other dtypes keep their GEMM).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from kiln.dtypes import DType
from kiln.errors import KilnError
from kiln.graph.ir import Graph, Node
from kiln.lower.gemm import WEIGHT_NR, pack_weight, weight_panel_width
from kiln.lower.workload import node_key, pass_override
from kiln.ops.packed import DOMAIN
from kiln.passes.edit import Namer, new_const, producers
from kiln.passes.registry import PassContext, graph_pass
from kiln.targets.target import Target


def _weight(node: Node, prod: dict) -> np.ndarray | None:
    """The [K, N] constant weight node reads as B, or None."""
    if len(node.inputs) < 2 or node.inputs[1] is None:
        return None
    v = node.inputs[1]
    if v.const is not None:
        w = v.const
    else:
        p = prod.get(v.id)
        if (p is None or p.op != "Transpose" or p.domain or p.inputs[0] is None
                or p.inputs[0].const is None or p.inputs[0].const.ndim != 2
                or list(p.attrs.get("perm", [1, 0])) != [1, 0]):
            return None
        w = p.inputs[0].const.T
    if w.ndim != 2:
        return None
    if node.op == "Gemm" and node.attrs.get("transB", 0):
        w = w.T
    return w


def _source(node: Node, prod: dict) -> tuple:
    """What `_weight` read, as a key: the constant's value id and whether it came transposed."""
    v = node.inputs[1]
    flip = bool(node.op == "Gemm" and node.attrs.get("transB", 0))
    if v.const is None:   # Transpose(W')
        v, flip = prod[v.id].inputs[0], not flip
    return v.id, flip


def _packable(node: Node) -> bool:
    if node.domain or node.op not in ("MatMul", "Gemm") or not node.outputs or node.outputs[0] is None:
        return False
    a = node.inputs[0]
    t = getattr(a, "type", None)
    if t is None or getattr(t, "dtype", None) != DType.float32 or getattr(t, "shape", None) is None:
        return False
    if len(t.shape) < 2 or not isinstance(t.shape[-1], int):
        return False
    if node.op == "Gemm" and (node.attrs.get("transA", 0) or len(t.shape) != 2):
        return False
    return True


@dataclass(frozen=True)
class PanelChoice:
    """A finding: the panel width (columns) a GEMM's constant weight was packed with (a decision:
    gemm.weight_nr, per GEMM keyed by `key`, which `kiln tune` searches over `options`)."""
    node: str
    key: str
    value: int
    options: tuple
    shape: str
    reason: str
    decision = WEIGHT_NR.name

    def __str__(self) -> str:
        return f"gemm {self.node!r} [{self.shape}]: weight panels of {self.value} columns ({self.reason})"


def panel_options(rule: int, lanes: int) -> tuple:
    """The panel widths a GEMM's weight may take: the rule's (kiln.lower.gemm.weight_panel_width,
    fewer than a vector for a narrow weight), or 1-4 whole vectors."""
    return tuple(dict.fromkeys([rule, *(lanes * k for k in range(1, 5))]))


def panel_width(node: Node, key: str, rule: int, lanes: int, decisions: dict | None) -> tuple[int, str]:
    """The panel width for the GEMM `node` and why: asked of it (or of all), else `rule`; one
    outside `panel_options` is a KilnError naming the decision and the GEMM (a tuning record's: a
    warning and the rule, kiln may have changed)."""
    try:
        v, record = pass_override(decisions, key, WEIGHT_NR)
        if v is not None and v not in panel_options(rule, lanes):
            raise KilnError(f"illegal value {v!r} for decision {WEIGHT_NR.name!r} in workload {key!r}: it must be "
                            f"one of {list(panel_options(rule, lanes))} (the rule's, or 1-4 vectors of {lanes})")
    except KilnError as e:
        if "#record" not in ((decisions or {}).get("@" + key) or {}):
            raise KilnError(f"{e.raw_message} (GEMM {node.name!r})", stage="schedule") from None
        warnings.warn(f"tuning record not applied to GEMM {node.name!r}: {e}", stacklevel=2)   # kiln changed
        v, record = None, None
    if v is None:
        return rule, "the rule (kiln.lower.gemm.weight_panel_width)"
    return v, f"asked for ({'tuning record ' + str(record) if record is not None else WEIGHT_NR.name})"


def pack(graph: Graph, target: Target, decisions: dict | None = None, findings: list | None = None) -> int:
    """Rewrite every packable MatMul/Gemm in place (panels for `target`, of the widths `decisions`
    ask, see `panel_width`); the number rewritten. Each choice is appended to `findings`."""
    namer, prod, count, nodes = Namer(graph), producers(graph), 0, []
    packed: dict[tuple, object] = {}   # (weight source, transposed, nr) -> its panels, packed once
    lanes, opset = target.vector_lanes(4), graph.opset("")
    for node in graph.nodes:
        w = _weight(node, prod) if _packable(node) else None
        if w is None or w.dtype != np.float32 or w.shape[0] != node.inputs[0].type.shape[-1] or 0 in w.shape:
            nodes.append(node)
            continue
        k, n = w.shape
        key, rule = node_key(node, opset, "gemm:"), weight_panel_width(n, k, DType.float32, target)
        nr, why = panel_width(node, key, rule, lanes, decisions)
        if findings is not None:
            findings.append(PanelChoice(node.name, key, nr, panel_options(rule, lanes), f"K {k} x N {n}", why))
        # a weight shared by several GEMMs (ALBERT's layers, a tied embedding) is one constant:
        # one packed copy, read by all (twelve copies were 12x the weight bytes to stream)
        src = _source(node, prod)
        wp = packed.get((src, nr))
        if wp is None:
            wp = packed[(src, nr)] = new_const(namer, f"{node.inputs[1].name}.panels{nr}", pack_weight(np.asarray(w), nr))
        ins, attrs = [node.inputs[0], wp], {"n": int(n)}
        if node.op == "Gemm":
            attrs.update(alpha=float(node.attrs.get("alpha", 1.0)), beta=float(node.attrs.get("beta", 1.0)))
            if len(node.inputs) > 2 and node.inputs[2] is not None:
                ins.append(node.inputs[2])
        nodes.append(Node("MatMulPacked", ins, list(node.outputs), attrs, node.name, DOMAIN))
        count += 1
    graph.nodes = nodes
    if count:
        graph.opsets.setdefault(DOMAIN, 1)
    return count


@graph_pass("pack_weights")
def pack_weights(graph: Graph, ctx: PassContext) -> Graph:
    """Pack constant MatMul/Gemm weights into the GEMM's panel layout, once."""
    n = pack(graph, ctx.target, ctx.decisions, ctx.findings)
    if n:
        ctx.tally({"MatMulPacked": n})
    return graph
