"""Named graph passes: `@graph_pass("name")` registers a rewrite `Graph -> Graph`.

Contract of every pass: it may rewrite the graph it is given *in place* and
returns the graph to use from then on (the same object, for every pass here).
Callers that must keep their graph hand in `graph.clone()`; `run_passes` does
that once. A pass rewrites the top-level graph; If/Loop/Scan bodies are left as
they are, but their reads of outer values count as uses.

A pass may leave findings (analyses that change nothing, such as the attention
groups) in its `PassContext`; `run_passes` records them with the pass's stats.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from kiln.errors import KilnError
from kiln.graph.ir import Graph
from kiln.targets.target import Target


@dataclass
class PassContext:
    """What a pass may read besides the graph (the CPU `target` the graph is compiled for:
    the NCHWc block and packed-weight panels follow its vector width), and what it may
    report: findings, and how often each of its rules fired. Made without a target (a
    pass run alone), it is this host's."""
    target: Target = field(default_factory=Target.host)
    findings: list[Any] = field(default_factory=list)
    # decision overrides asked of kiln.compile (kiln.lower.decisions): the few a pass makes
    # (the conv algorithm, read by the layout pass) are read from here
    decisions: dict = field(default_factory=dict)
    fired: dict[str, int] = field(default_factory=dict)

    def report(self, finding: Any) -> None:
        self.findings.append(finding)

    def tally(self, fired: dict[str, int]) -> None:
        for k, n in fired.items():
            self.fired[k] = self.fired.get(k, 0) + n


PassFn = Callable[[Graph, PassContext], Graph]


@dataclass(frozen=True)
class GraphPass:
    name: str
    fn: PassFn
    doc: str

    def __call__(self, graph: Graph, ctx: PassContext | None = None) -> Graph:
        return self.fn(graph, ctx if ctx is not None else PassContext())


PASSES: dict[str, GraphPass] = {}


def graph_pass(name: str):
    """Decorator registering `fn(graph, ctx) -> graph` under `name`."""
    def deco(fn: PassFn) -> GraphPass:
        if name in PASSES:
            raise RuntimeError(f"graph pass {name!r} registered twice")
        p = GraphPass(name, fn, (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else "")
        PASSES[name] = p
        return p
    return deco


def get_pass(name: str) -> GraphPass:
    # PASSES is complete here: importing this module from outside ran kiln/passes/__init__.py,
    # which imports every pass module, first
    if name not in PASSES:
        raise KilnError(f"unknown graph pass {name!r}; known: {sorted(PASSES)}")
    return PASSES[name]
