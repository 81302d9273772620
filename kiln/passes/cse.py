"""Common subexpression elimination: one node per (op, inputs, attributes).

Constants are merged first by content (dtype, shape and a hash of the bytes), so
two `1.0` scalars or a weight listed twice become one value; then, in
topological order, a node equal to an earlier one (same op and domain, same
input values, equal attributes, same outputs present) is dropped and its readers
read the earlier node's outputs. Random ops and nodes with subgraphs are left
alone.
"""

from __future__ import annotations

import hashlib

import numpy as np

from kiln.graph.ir import Graph, Node, Value
from kiln.passes.constant_folding import NONDETERMINISTIC
from kiln.passes.edit import can_replace, remove_nodes, replace_value, replace_values
from kiln.passes.registry import PassContext, graph_pass


def content_key(a: np.ndarray) -> tuple:
    """A key equal for arrays of equal dtype, shape and bytes."""
    if a.dtype.kind in "OSU":
        payload = repr(a.tolist()).encode()
    else:
        payload = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    return (a.dtype.str, a.shape, hashlib.blake2b(payload, digest_size=20).digest())


@graph_pass("eliminate_common_subexpressions")
def eliminate_common_subexpressions(graph: Graph, ctx: PassContext) -> Graph:
    """Merge equal constants, then nodes with the same op, inputs and attributes."""
    ctx.tally({"constant": _merge_constants(graph)})
    seen: dict[tuple, Node] = {}
    dead: set[int] = set()
    for n in graph.nodes:
        key = _node_key(n)
        if key is None:
            continue
        first = seen.setdefault(key, n)
        if first is n:
            continue
        pairs = [(old, new) for old, new in zip(n.outputs, first.outputs) if old is not None]
        if all(can_replace(graph, old, new) for old, new in pairs):
            for old, new in pairs:
                replace_value(graph, old, new)
            dead.add(id(n))
            ctx.tally({n.op: 1})
    remove_nodes(graph, dead)
    return graph


def _merge_constants(graph: Graph) -> int:
    """Read one value per constant content. Constants of the same dtype and shape are
    bucketed by a hash of a strided sample and compared bit for bit, so large
    weights are read at most once and unique shapes not at all."""
    outputs = {v.id for v in graph.outputs}
    groups: dict[tuple, list[Value]] = {}
    for v in graph.constants():
        if v.id not in outputs:
            groups.setdefault((v.const.dtype.str, v.const.shape), []).append(v)
    mapping: dict[int, Value] = {}
    for group in groups.values():
        buckets: dict[bytes, list[Value]] = {}
        for v in group if len(group) > 1 else ():
            reps = buckets.setdefault(_sample_key(v.const), [])
            same = next((r for r in reps if _bits_equal(r.const, v.const)), None)
            if same is None:
                reps.append(v)
            else:
                mapping[v.id] = same
    replace_values(graph, mapping)
    return len(mapping)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def _sample_key(a: np.ndarray) -> bytes:
    if a.dtype.kind in "OSU":
        return content_key(a)[2]
    flat = np.ascontiguousarray(a).reshape(-1)
    sample = flat[::max(1, flat.size // 1024)]
    return hashlib.blake2b(np.ascontiguousarray(sample).view(np.uint8), digest_size=16).digest()


def _bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype.kind in "OSU":
        return a.tolist() == b.tolist()
    return bool(np.array_equal(_bits(a), _bits(b)))


def _node_key(n: Node) -> tuple | None:
    if n.op in NONDETERMINISTIC or any(True for _ in n.subgraphs()):
        return None
    try:
        attrs = tuple(sorted((k, _freeze(a)) for k, a in n.attrs.items()))
        key = (n.domain, n.op, tuple(None if v is None else v.id for v in n.inputs), attrs,
               tuple(v is None for v in n.outputs))
        hash(key)
    except TypeError:
        return None
    return key


def _freeze(a):
    if isinstance(a, np.ndarray):
        return ("tensor",) + content_key(a)
    if isinstance(a, list):  # homogeneous: a list of scalars (100,000s of tree nodes) as is
        return tuple(_freeze(x) for x in a) if a and isinstance(a[0], (list, np.ndarray)) else tuple(a)
    return a
