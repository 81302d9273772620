"""GEMMs that read the same activation merged into one: Q/K/V projections, gate and up.

    y_i = MatMulPacked(x, Wp_i, c_i) {n}   [+ Add(y_i, bias_i)]      i = 1..k, x shared

(constant weights already packed by kiln.passes.pack_weights, each [K, n] with the same K,
n and panel width; c_i and the bias constant vectors over n) become

    Y = MatMulPacked(x, stack(alpha_i * Wp_i), stack(beta_i * c_i + bias_i)) {n}   [k, ..., M, n]
    y_i = Reshape(Slice(Y, i, i + 1, axis 0))

The weights are stacked along a new leading axis at compile time, the GEMM's batch loop
runs over it (its tile loops are one parallel loop: one fork for the k products, and k
times the tiles to share between threads where one product has too few: a decoder step at
M = 1), and each y_i is plane i of Y, one contiguous run: the Slice and Reshape are views of
Y's bytes (kiln.lower.module's view chains), never copies. The bias Adds that followed each
GEMM go into the merged GEMM's epilogue (as before the merge, they were each GEMM's).

Planes, not N concatenated ([..., M, k * n]): a column range of that is strided, so its
consumers would read it through a copy. Planes need equal n, so a grouped-query attention's
Q (more heads) stays alone while its K and V merge. Static shapes only: a symbolic one
would make the slices' offsets symbolic, and the module's views take static offsets.

What an elementwise consumer loses is its place in the GEMM's epilogue (a SiLU-gated MLP's
Swish and product, kiln.passes.swiglu): they run as one elementwise kernel over the two
planes instead, a few bytes per output element against the fork and the better split.
Each merge (or why a group sharing an input was left alone) is a finding in the report.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kiln.dtypes import DType
from kiln.graph.ir import Graph, Node, Value
from kiln.graph.types import TensorType
from kiln.lower.gemm import pack_weight
from kiln.ops.packed import DOMAIN, unpack_weight
from kiln.passes.edit import Namer, new_const, new_node, use_counts
from kiln.passes.registry import PassContext, graph_pass


@dataclass
class MergedGemms:
    nodes: tuple[str, ...]      # the GEMMs (MatMulPacked nodes) merged, or the one left alone
    n: int                      # columns of each
    decision: str               # "merged into ..." or "not merged: why"

    def __str__(self) -> str:
        return f"GEMM{'s' * (len(self.nodes) > 1)} sharing an input ({', '.join(self.nodes)}), n={self.n}: " \
               f"{self.decision}"


@dataclass
class _Member:
    node: Node
    wp: np.ndarray              # [P, K, nr], alpha folded in
    bias: np.ndarray            # [n]: beta * c + the absorbed Add's constant (zeros if none)
    out: Value                  # the value plane i stands for (the Add's output if absorbed)
    add: Node | None            # the absorbed bias Add


def _static(v: Value | None) -> bool:
    t = getattr(v, "type", None)
    return isinstance(t, TensorType) and t.shape is not None and t.is_static


def _vector(c: np.ndarray, n: int, rank: int) -> np.ndarray | None:
    """c as a [n] vector when it broadcasts over the last axis of a rank-`rank` output only."""
    c = np.asarray(c)
    if c.dtype != np.float32 or c.ndim > rank or any(d != 1 for d in c.shape[:-1]) \
            or (c.ndim and c.shape[-1] not in (1, n)):
        return None
    return np.broadcast_to(c.reshape(-1) if c.ndim else c, (n,)).astype(np.float32)


def _member(node: Node, counts, consumers, outputs: set) -> _Member | str:
    """node (a MatMulPacked) as a merge candidate (float32, a constant 2-D weight, static
    shapes, its c a constant vector), its following bias Add absorbed; else why not."""
    a, wp = node.inputs[0], node.inputs[1]
    c = node.inputs[2] if len(node.inputs) > 2 else None
    y = node.outputs[0] if len(node.outputs) == 1 else None
    if y is None or wp is None or wp.const is None or np.asarray(wp.const).ndim != 3 \
            or wp.const.dtype != np.float32 or getattr(a.type, "dtype", None) != DType.float32:
        return "not a float32 GEMM with one constant weight matrix"
    if not _static(a) or not _static(y) or len(a.type.shape) < 2:
        return "symbolic shape (the planes' offsets would be symbolic: no views)"
    n, rank = int(node.attrs["n"]), len(y.type.shape)
    alpha, beta = float(node.attrs.get("alpha", 1.0)), float(node.attrs.get("beta", 1.0))
    bias = np.zeros(n, np.float32) if c is None else _vector(c.const, n, rank) if c.const is not None else None
    if bias is None:
        return "its c is not a constant vector over the columns"
    bias = bias * np.float32(beta) if c is not None else bias
    out, add = y, None
    users = consumers.get(y.id, [])
    if counts[y.id] == 1 and y.id not in outputs and len(users) == 1:
        u = users[0]
        other = [v for v in u.inputs if v is not y]
        if (u.op == "Add" and not u.domain and len(u.inputs) == 2 and len(other) == 1 and other[0] is not None
                and other[0].const is not None and len(u.outputs) == 1 and u.outputs[0] is not None
                and u.outputs[0].type == y.type):
            extra = _vector(other[0].const, n, rank)
            if extra is not None:
                bias, out, add = bias + extra, u.outputs[0], u
    w = np.asarray(wp.const)
    return _Member(node, w * np.float32(alpha) if alpha != 1.0 else w, bias.astype(np.float32), out, add)


def _views(graph: Graph, namer: Namer, y: Value, i: int, out: Value, base: str) -> list[Node]:
    """Slice(y, i, i + 1, axis 0) then Reshape to `out` (its value reused, so readers are unchanged)."""
    if graph.opset("") >= 10:
        idx = [new_const(namer, f"{base}.plane{i}.{k}", np.array([v], np.int64))
               for k, v in (("start", i), ("end", i + 1), ("axis", 0))]
        sl = new_node(graph, "Slice", [y, *idx], namer.fresh(f"{base}/plane{i}"), [namer.fresh(f"{base}.plane{i}")])
    else:
        sl = new_node(graph, "Slice", [y], namer.fresh(f"{base}/plane{i}"), [namer.fresh(f"{base}.plane{i}")],
                      {"starts": [i], "ends": [i + 1], "axes": [0]})
    shape = new_const(namer, f"{base}.plane{i}.shape", np.array(out.type.shape, np.int64))
    return [sl, Node("Reshape", [sl.outputs[0], shape], [out], {}, namer.fresh(f"{base}/view{i}"), "")]


def merge(graph: Graph, findings: list) -> int:
    """Merge every group of candidate GEMMs sharing an input in place; the number of groups."""
    counts, consumers, outputs = use_counts(graph), graph.consumers(), {v.id for v in graph.outputs}
    groups: dict[tuple, list[_Member]] = {}
    alone: dict[int, list[tuple[Node, str]]] = {}   # input id -> GEMMs reading it, not merged, why
    for node in graph.nodes:
        if node.domain != DOMAIN or node.op != "MatMulPacked" or node.inputs[0] is None:
            continue
        m = _member(node, counts, consumers, outputs)
        if isinstance(m, str):
            alone.setdefault(node.inputs[0].id, []).append((node, m))
        else:
            groups.setdefault((node.inputs[0].id, int(node.attrs["n"]), m.wp.shape), []).append(m)
    for (a_id, n, shape), ms in groups.items():
        if len(ms) == 1 and any(k[0] == a_id and k != (a_id, n, shape) for k in groups):
            alone.setdefault(a_id, []).append((ms[0].node, "no other GEMM of its width and weight shape "
                                               "reads the input (planes need equal shapes)"))
    for a_id, why in alone.items():
        if len(why) + sum(len(ms) for k, ms in groups.items() if k[0] == a_id) > 1:
            findings += [MergedGemms((node.name,), int(node.attrs["n"]), f"not merged: {w}") for node, w in why]
    namer, done, replace = Namer(graph), 0, {}
    stacked: dict[tuple, Value] = {}   # the members' weights (and scales) -> their planes, stacked once
    for (_, n, _), ms in groups.items():
        if len(ms) < 2:
            continue
        a = ms[0].node.inputs[0]
        rank = len(a.type.shape)
        base = namer.fresh(ms[0].node.name + ".merged")
        # layers sharing their weights (ALBERT) share the merged planes too
        key = (rank, *((m.node.inputs[1].id, float(m.node.attrs.get("alpha", 1.0))) for m in ms))
        wp = stacked.get(key)
        if wp is None:
            wp = stacked[key] = new_const(namer, f"{base}.panels", np.stack([m.wp for m in ms]).reshape(
                len(ms), *([1] * (rank - 2)), *ms[0].wp.shape))
        c = new_const(namer, f"{base}.bias", np.stack([m.bias for m in ms]).reshape(len(ms), *([1] * (rank - 1)), n))
        mm = new_node(graph, "MatMulPacked", [a, wp, c], base, [namer.fresh(base)], {"n": n}, DOMAIN)
        made = [mm]
        for i, m in enumerate(ms):
            made += _views(graph, namer, mm.outputs[0], i, m.out, base)
        replace[id(ms[0].node)] = made
        for m in ms[1:]:
            replace[id(m.node)] = []
        for m in ms:
            if m.add is not None:
                replace[id(m.add)] = []
        findings.append(MergedGemms(tuple(m.node.name for m in ms), n, f"merged into {base} ({len(ms)} planes)"))
        done += 1
    if done:
        graph.nodes = [x for node in graph.nodes for x in replace.get(id(node), [node])]
    return done


def split_planes(graph: Graph, findings: list) -> int:
    """The other way round: one GEMM whose output is only cut into k equal column ranges by a
    Split on its last axis (GPT-2's c_attn: [M, 3 * 768] -> Q, K, V; a Reshape that keeps the
    last axis may come between) computes the k ranges as planes [k, ..., M, n / k] of the
    same weights, and the Split's outputs become views of them: no copy, as for GEMMs merged
    above. Rewritten in place; the number rewritten."""
    counts, consumers, outputs = use_counts(graph), graph.consumers(), {v.id for v in graph.outputs}
    namer, replace, done = Namer(graph), {}, 0

    def only_user(v: Value) -> Node | None:
        users = consumers.get(v.id, [])
        return users[0] if counts[v.id] == 1 and v.id not in outputs and len(users) == 1 else None

    for node in graph.nodes:
        if node.domain != DOMAIN or node.op != "MatMulPacked" or node.inputs[0] is None or id(node) in replace:
            continue
        m = _member(node, counts, consumers, outputs)
        if isinstance(m, str):
            continue
        n, user, reshape = int(node.attrs["n"]), only_user(m.out), None
        if user is not None and user.op == "Reshape" and not user.domain and user.outputs[0] is not None \
                and _static(user.outputs[0]) and user.outputs[0].type.shape[-1] == n:
            reshape, user = user, only_user(user.outputs[0])
        if user is None or user.op != "Split" or user.domain or len(user.outputs) < 2:
            continue
        rank = len((reshape.outputs[0] if reshape else m.out).type.shape)
        parts = user.outputs
        k = len(parts)
        if int(user.attrs.get("axis", 0)) % rank != rank - 1 or n % k \
                or any(o is None or not _static(o) or o.type.shape[-1] != n // k for o in parts):
            continue
        w = unpack_weight(m.wp, n)
        nr, a = m.wp.shape[-1], node.inputs[0]
        arank = len(a.type.shape)
        base = namer.fresh(node.name + ".planes")
        wp = new_const(namer, f"{base}.panels", np.stack([pack_weight(w[:, i * (n // k):(i + 1) * (n // k)], nr)
                                                          for i in range(k)]).reshape(k, *([1] * (arank - 2)), -1, w.shape[0], nr))
        c = new_const(namer, f"{base}.bias", m.bias.reshape(k, *([1] * (arank - 1)), n // k))
        mm = new_node(graph, "MatMulPacked", [a, wp, c], base, [namer.fresh(base)], {"n": n // k}, DOMAIN)
        made = [mm]
        for i, o in enumerate(parts):
            made += _views(graph, namer, mm.outputs[0], i, o, base)
        replace[id(node)] = made
        for gone in (m.add, reshape, user):
            if gone is not None:
                replace[id(gone)] = []
        findings.append(MergedGemms((node.name,), n, f"split into {k} planes of {n // k} columns ({base}): "
                                    f"{user.name}'s outputs are views"))
        done += 1
    if done:
        graph.nodes = [x for node in graph.nodes for x in replace.get(id(node), [node])]
    return done


@graph_pass("merge_gemms")
def merge_gemms(graph: Graph, ctx: PassContext) -> Graph:
    """Merge GEMMs with constant weights that read the same input into one (planes, as views);
    a GEMM cut into equal column ranges by a Split becomes planes the same way."""
    found: list = []
    n = merge(graph, found) + split_planes(graph, found)
    for f in found:
        ctx.report(f)
    if n:
        ctx.tally({"merged GEMM groups": n})
    return graph
