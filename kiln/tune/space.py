"""THE SEAM between the tuner and lowering: a task's decisions, and the kernel built with them.

Everything the tuner knows about schedules goes through three functions here, written
against kiln.lower.decisions (templates declare named decisions with a domain and a
heuristic default; `lower_group(..., decisions={kernel: {...}})` replays them):

- `candidates(name, default)`: the finite values a search tries for one decision;
- `decision_space(kernel)`: per decision the default lowering took, its candidates;
- `lower_with(ctx, decisions)`: the kernel lowered with `decisions` (a KilnError names an
  illegal one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from kiln.errors import KilnError


@dataclass
class GroupContext:
    """What kiln.lower.kernel.lower_group needs to lower one fusion group again."""
    nodes: list
    opsets: dict
    values: dict
    needed_outside: Callable
    name: str
    target: object = None
    known: dict = field(default_factory=dict)


def _pow2_around(default: int, lo: int, hi: int | None, span: int = 4) -> list[int]:
    vals = {default, lo}
    for k in range(1, span + 1):
        vals |= {default << k, default >> k, default + k, default - k}
        vals.add(1 << (max(default, 1).bit_length() - 1 + k))
    return sorted(v for v in vals if v >= lo and (hi is None or v <= hi))


def candidates(name: str, default) -> list:
    """The values a search tries for decision `name` (default first)."""
    from kiln.lower.decisions import DECISIONS, Ints, OneOf  # noqa: PLC0415
    d = DECISIONS.get(name)
    if d is None:
        raise KilnError(f"unknown schedule decision {name!r}")
    dom = d.domain
    if isinstance(dom, OneOf):
        vals = list(dom.values)
    elif isinstance(dom, Ints):
        if dom.hi is not None and dom.hi - dom.lo <= 32:
            vals = list(range(dom.lo, dom.hi + 1))
        elif name == "parallel_min_work":   # thresholds: powers of two, and never / always
            vals = [0, *(1 << k for k in range(8, 25, 2)), 1 << 62]
        else:
            vals = _pow2_around(int(default), dom.lo, dom.hi)
    else:
        raise KilnError(f"decision {name!r} has a domain the tuner cannot enumerate: {dom}")
    vals = [v for v in vals if v in dom]
    return [default] + [v for v in vals if v != default]


# Decisions a graph pass makes before partitioning (a kernel records the value it was built
# for): searched on the whole model (kiln.tune.pass_tasks), never per kernel
GRAPH_DECISIONS = frozenset({"conv.algorithm", "conv.inverted_residual", "gemm.weight_nr"})


def decision_space(decisions: dict) -> dict[str, list]:
    """name -> candidate values, for the decisions a kernel's default lowering took
    (`Kernel.decisions`); entries starting with "#" are annotations, not decisions, and
    GRAPH_DECISIONS keep the value the kernel was built for."""
    return {n: [v] if n in GRAPH_DECISIONS else candidates(n, v)
            for n, v in sorted(decisions.items()) if not n.startswith("#")}


def lower_with(ctx: GroupContext, decisions: dict | None):
    """The group lowered as one kernel with `decisions` (None: the defaults). Some decisions
    exist only for some values of others (the micro-tile only where there is a column
    panel): those the kernel did not take are ignored here, and `Kernel.decisions` says
    which it took: what a record keeps, so that replaying it asks for exactly those."""
    from kiln.lower.kernel import lower_group  # noqa: PLC0415
    return lower_group(ctx.nodes, ctx.opsets, ctx.values, ctx.needed_outside, ctx.name,
                       ctx.target, dict(decisions or {}))


def taken(kernel) -> dict:
    """The decisions a lowered kernel took (notes such as "#record" left out)."""
    return {k: v for k, v in kernel.decisions.items() if not k.startswith("#")}
