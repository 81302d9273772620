"""Concats that need no kernel: each input is written by its producer straight into its part
of the result.

A Concat whose result has only size-1 axes before the concatenation axis (batch 1 along the
channels, NCHW or the blocked NCHW[c]c layout: YOLO's CSP and SPPF blocks, FPN/PAN necks,
U-Net's skips) lays its inputs end to end: input k's bytes are one contiguous run of the
result's, at the sum of the inputs before it. So each input becomes a view of the result at
that offset (the memory planner's `alias` / `view_offsets`, as for a contiguous Slice),
its producer's kernel writes there, its other readers read there, and the copy kernel goes:
one pass over the concatenated bytes less per Concat (read and written once each).

Applies to a Concat fused with nothing (its own fusion group: kiln.lower.partition), with a
static, non-string result (a graph output too: its parts are then written straight into the
caller's output array, YOLO's per-scale heads), whose inputs are distinct values each computed
by a kernel (not a graph input, constant, view or graph output, nor another such Concat's
result) and start on the arena's alignment. Any other Concat copies as before.
"""

from __future__ import annotations

import math

from kiln.dtypes import DType
from kiln.graph.ir import Graph, Node, Value
from kiln.graph.types import TensorType

ARENA_ALIGN = 64    # the workspace arena's alignment (kiln.lower.module.ALIGN)


def _static(v: Value | None) -> TensorType | None:
    t = None if v is None else v.type
    return t if isinstance(t, TensorType) and t.is_static and t.dtype is not DType.string else None


def part_offsets(node: Node, producer: dict[int, Node], outputs: set[int], align: int = ARENA_ALIGN,
                 viewed: frozenset | set = frozenset(), taken: dict | None = None) -> list[int] | None:
    """Byte offset of each input of Concat `node` in its result, when the inputs can be its parts
    (`viewed`: values that are views, `taken`: values already parts of another Concat; the
    partition asks without them, before views are known)."""
    taken = taken or {}
    if node.op != "Concat" or node.domain or len(node.outputs) != 1:
        return None
    y = _static(node.outputs[0])
    if y is None or not node.inputs:
        return None
    axis = int(node.attrs.get("axis", 0)) % len(y.shape)
    if math.prod(y.shape[:axis]) != 1:
        return None
    ins = node.inputs
    if any(v is None for v in ins) or len({v.id for v in ins}) != len(ins):
        return None
    inner = math.prod(y.shape[axis + 1:]) * y.dtype.itemsize
    offsets, at = [], 0
    for v in ins:
        t = _static(v)
        if (t is None or t.dtype != y.dtype or v.is_const or v.id not in producer or v.id in outputs
                or v.id in viewed or v.id in taken or at % align):
            return None
        offsets.append(at)
        at += t.shape[axis] * inner
    return offsets


def concat_parts(graph: Graph, groups: list, view_groups: set[int], align: int
                 ) -> tuple[set[int], dict[int, Value], dict[int, int]]:
    """(id() of each Concat group that needs no kernel, input id -> the Concat's result,
    input id -> its byte offset there), of the fusion groups `groups` (kiln.lower.partition's,
    which asks `part_offsets` whether a Concat may stand alone). `view_groups`: id() of the groups that are views
    (no kernel: their outputs alias their inputs, so they cannot be parts)."""
    producer = {v.id: n for n in graph.nodes for v in n.outputs if v is not None}
    outputs = {v.id for v in graph.outputs}
    viewed = {v.id for g in groups if id(g) in view_groups for n in g.nodes for v in n.outputs
              if v is not None}
    skipped: set[int] = set()
    alias: dict[int, Value] = {}
    offsets: dict[int, int] = {}
    results: set[int] = set()

    def one_concat(g) -> Node | None:
        n = g.nodes[0] if len(g.nodes) == 1 else None
        return n if n is not None and n.op == "Concat" and not n.domain else None
    for g in groups:
        n = one_concat(g)
        if n is None:
            continue
        offs = part_offsets(n, producer, outputs, align, viewed | results, alias)
        if offs is None:
            continue
        skipped.add(id(g))
        results.add(n.outputs[0].id)
        for v, off in zip(n.inputs, offs):
            alias[v.id] = n.outputs[0]
            offsets[v.id] = off
    return skipped, alias, offsets
