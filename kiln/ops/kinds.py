"""What each operator is for fusion, as the partitioner (kiln.lower.partition) asks it.

An op's pattern kind (TVM's elementwise < broadcast < injective < reduction <
out-elementwise-fusable < opaque) is declared with the op itself (`fusion=` on
`@op`/`register`, kiln.ops.registry.OpDef.fusion; registering an op without one is an
error), never in a table here. This module reads it (`declared_kind`, `ops_of_kind`) and
names the two groups of index-only ops prologue fusion cares about.
"""

from __future__ import annotations

from kiln.ops.registry import REGISTRY, FusionKind, lookup

Kind = FusionKind


def declared_kind(domain: str, op: str) -> Kind:
    """The fusion kind op (`domain`, `op`) declares (opaque for an op kiln does not know)."""
    d = lookup(domain, op)
    return Kind.OPAQUE if d is None else d.fusion


def ops_of_kind(kind: Kind, domain: str = "") -> list[str]:
    """The names of `domain`'s ops that declare `kind`, sorted."""
    return sorted(name for (d, name), od in REGISTRY.items() if d == domain and od.fusion == kind)


# Ops that only remap indices (no arithmetic on values), which may fold into a consumer
PROLOGUE_OPS = {("", o) for o in "Transpose Reshape Flatten Squeeze Unsqueeze Identity Expand Slice".split()}

# ... of which these only reinterpret a contiguous buffer: alone they cost no kernel
# (lowering aliases them), so folding them gains nothing
VIEW_OPS = {("", o) for o in "Reshape Flatten Squeeze Unsqueeze Identity".split()}
