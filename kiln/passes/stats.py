"""What a pass changed: nodes removed, added and rewritten, from snapshots before and after.

A node is *rewritten* when it survives the pass (same object) but reads other
values, writes other values or has other attributes; e.g. the readers of an
eliminated Identity now read its input.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kiln.graph.ir import Graph, Node


@dataclass
class PassStats:
    name: str
    nodes_before: int
    nodes_after: int
    removed: int
    added: int
    rewritten: int
    seconds: float
    fired: dict[str, int] = field(default_factory=dict)    # rule or op -> times
    findings: list[Any] = field(default_factory=list)      # e.g. attention groups

    @property
    def changed(self) -> bool:
        return bool(self.removed or self.added or self.rewritten)

    def __str__(self) -> str:
        s = (f"{self.name}: {self.nodes_before} -> {self.nodes_after} nodes "
             f"(-{self.removed} +{self.added} ~{self.rewritten}) {self.seconds * 1e3:.1f} ms")
        if self.fired:
            s += " [" + ", ".join(f"{k} x{n}" for k, n in sorted(self.fired.items())) + "]"
        return s + "".join(f"\n    {f}" for f in self.findings)


Snapshot = dict[int, tuple[Node, tuple]]


def snapshot(graph: Graph) -> Snapshot:
    """Every node (subgraphs included) with what it reads, writes and its attributes."""
    return {id(n): (n, _signature(n)) for _, n in graph.walk()}


def _signature(n: Node) -> tuple:
    return (n.op, n.domain, tuple(None if v is None else v.id for v in n.inputs),
            tuple(None if v is None else v.id for v in n.outputs),
            tuple((k, id(a)) for k, a in n.attrs.items()))


def diff(name: str, before: Snapshot, graph: Graph, seconds: float, fired=None,
         findings=None) -> PassStats:
    after = snapshot(graph)
    return PassStats(
        name, len(before), len(after),
        removed=sum(1 for k in before if k not in after),
        added=sum(1 for k in after if k not in before),
        rewritten=sum(1 for k, (_, sig) in after.items() if k in before and before[k][1] != sig),
        seconds=seconds, fired=dict(fired or {}), findings=list(findings or []))
