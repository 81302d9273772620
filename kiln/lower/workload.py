"""Workloads: a kernel's structural key, and decision overrides keyed by it.

Two fused groups with the same key lower to the same loops (the same ops, attributes,
types, wiring and small compile-time values), whatever their node names and weights,
so one tuning record serves every repeat of a layer and every model that has it.
Large constants (weights) and float arrays of any size (a layer's bias) count by dtype
and shape only: their values change the numbers, not the loop nest; small integer arrays
(shapes, axes, pads) and scalars count by value.

Decision overrides (kiln.lower.decisions) may be keyed by workload as well as by kernel
name: {"@<workload key>": {decision: value}} applies to every kernel of that workload
(kiln.tune.apply puts a tuning record's decisions there; they are in the module cache
key like any override). A workload's overrides that no longer fit its kernel (a stale
record: the template changed) are dropped with a warning and the defaults are built.
"""

from __future__ import annotations

import hashlib
import warnings

import numpy as np

from kiln.errors import KilnError
from kiln.graph.canonical import canonical_bytes
from kiln.graph.deferred import Deferred

SMALL_CONST = 64  # elements: an integer constant this small (or a scalar) may steer lowering (shapes, axes, pads)
KEY_VERSION = "kiln-workload 1"


def _value_part(v, refs: dict, data) -> tuple:
    if v is None:
        return ("none",)
    t = str(v.type)
    if v.id in refs:
        return ("ref", refs[v.id], t)
    ref = refs[v.id] = ("in", sum(1 for r in refs.values() if r[0] == "in"))
    if data is None:
        return (*ref, t)
    if isinstance(data, Deferred):      # (big transformed weights, not made for a key)
        return (*ref, t, "const")
    arr = np.asarray(data)
    if arr.dtype != object and arr.size <= SMALL_CONST and (arr.size == 1 or not np.issubdtype(arr.dtype, np.floating)):
        return (*ref, t, "=", hashlib.sha256(canonical_bytes(arr)).hexdigest())
    return (*ref, t, "const")


def workload_key(nodes: list, opsets: dict, values: dict, needed_outside) -> str:
    """sha256 of the group `nodes` (in order) as kiln.lower.kernel.lower_group sees it:
    `opsets`/`values` keyed by id(node) (values: per input, compile-time data or None),
    `needed_outside(value)`: whether a result leaves the kernel."""
    refs: dict = {}
    parts: list = [KEY_VERSION]
    for k, n in enumerate(nodes):
        ins = [_value_part(v, refs, d) for v, d in zip(n.inputs, values.get(id(n), [None] * len(n.inputs)))]
        outs = []
        for j, v in enumerate(n.outputs):
            if v is None:
                outs.append(("none",))
                continue
            refs[v.id] = ("node", k, j)
            outs.append((str(v.type), bool(needed_outside(v))))
        attrs = hashlib.sha256(canonical_bytes(dict(sorted(n.attrs.items())))).hexdigest()
        parts.append((n.domain or "", n.op, opsets.get(id(n)), attrs, ins, outs))
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


def node_key(node, opset: int, prefix: str) -> str:
    """One node's workload key, `prefix` before it ("conv:", "gemm:"): the key of a decision a
    graph pass makes per node (kiln.lower.conv_algo, kiln.passes.pack_weights), the same for
    every node computing the same thing on the same shapes, whatever its name and weights' values."""
    return prefix + workload_key([node], {id(node): opset}, {id(node): [v.const if v is not None else None
                                                                        for v in node.inputs]}, lambda v: True)


def pass_override(decisions: dict | None, key: str, decision) -> tuple:
    """The value of `decision` (kiln.lower.decisions.Decision) asked of the node of workload `key`
    ({"@<key>": {name: value}}), else asked of every node ({name: value}), and the tuning record
    it comes from (None: asked by hand); (None, None) when none is. Outside the domain: a KilnError."""
    own = (decisions or {}).get("@" + key) or {}
    v, record = own.get(decision.name), own.get("#record")
    if v is None:
        v, record = (decisions or {}).get(decision.name), None
    if v is not None and v not in decision.domain:
        raise KilnError(f"illegal value {v!r} for decision {decision.name!r} in workload {key!r}: it must be "
                        f"{decision.domain}", stage="schedule")
    return v, record


def workload_decisions(decisions: dict, nodes, opsets, values, needed_outside) -> dict | None:
    """The overrides keyed by this group's workload, if there are any."""
    if not any(k.startswith("@") for k in decisions):
        return None
    return decisions.get("@" + workload_key(nodes, opsets, values, needed_outside))


def lower_with_workload(lower, name: str, decisions: dict, own: dict):
    """`lower(decisions)` with the workload's overrides `own` under kernel `name`'s own; keys
    starting with "#" are notes (a tuning record's id), kept in the kernel's decisions so
    the build lists them."""
    asked = {k: v for k, v in own.items() if not k.startswith("#")}
    try:
        kernel = lower({**decisions, name: {**asked, **decisions.get(name, {})}})
    except KilnError as e:
        warnings.warn(f"decisions for workload (record {own.get('#record')}) not applied to kernel "
                      f"{name!r}: {e}", stacklevel=2)
        return lower(decisions)
    kernel.decisions.update({k: v for k, v in own.items() if k.startswith("#")})
    return kernel
