"""A model's tuning tasks: its distinct kernel workloads, each weighted by its repeats.

A specialised graph (kiln.tuning.specialized_graph: the compiler's own stages) is
partitioned, each fusion group is lowered once with the default decisions, and groups
with the same workload key (kiln.lower.workload: what is computed, on which shapes)
become one task whose weight is how many kernels of the model it stands for. Kernels
without decisions are not tasks; hand-written C kernels with decisions (the fused attention's
tile, kiln.lower.fused_attention) are.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kiln.tune.space import GroupContext, decision_space, lower_with


@dataclass
class Task:
    key: str                   # workload key
    ctx: GroupContext          # how to lower it again (one representative group)
    defaults: dict             # the default lowering's decisions
    space: dict                # decision -> candidate values (defaults first)
    weight: int = 1            # kernels of the model with this workload
    description: str = ""
    inputs: list = field(default_factory=list)   # per kernel input param: its compile-time data or None
    flops: int = 0

    @property
    def size(self) -> int:
        """How many decision combinations there are."""
        n = 1
        for vals in self.space.values():
            n *= len(vals)
        return n


def _describe(nodes, func) -> str:
    ins = ", ".join(f"{p.dtype}{list(p.shape)}" for p in func.params)
    return f"{' + '.join(n.op for n in nodes)} ({ins})"


def group_contexts(graph, known: dict) -> list[GroupContext]:
    """Each fusion group that becomes a kernel, with what lowering it again takes."""
    from kiln.lower.module import group_inputs  # noqa: PLC0415
    from kiln.codegen.fork_cost import calibrated  # noqa: PLC0415
    from kiln.targets.target import Target  # noqa: PLC0415
    target = calibrated(Target.host())   # tuning measures on this machine, for this machine (as kiln.compile)
    return [GroupContext(g.nodes, g.opsets, g.values, g.needed_outside, f"k{g.index}_{g.nodes[-1].op}", target,
                         known) for g in group_inputs(graph, known)]


def tasks_of(graph, known: dict) -> list[Task]:
    """The distinct tunable workloads of a specialised graph, heaviest (most repeated) first."""
    from kiln.loops.stmt import ExternFunc, PrimFunc  # noqa: PLC0415
    from kiln.lower.kernel import Unfusable  # noqa: PLC0415
    from kiln.lower.workload import workload_key  # noqa: PLC0415
    tasks: dict[str, Task] = {}
    for ctx in group_contexts(graph, known):
        try:
            kernel = lower_with(ctx, None)
        except Unfusable:
            continue    # a hand-written member: its group is lowered node by node, no decisions
        if not isinstance(kernel.func, (PrimFunc, ExternFunc)) or getattr(kernel.func, "dynamic", False):
            continue   # (a hand-written kernel is a task too when it has decisions: its tiles)
        space = decision_space(kernel.decisions)
        if not space or all(len(v) == 1 for v in space.values()):
            continue
        key = workload_key(ctx.nodes, ctx.opsets, ctx.values, ctx.needed_outside)
        if key in tasks:
            tasks[key].weight += 1
            continue
        data = {v.id: (v.const if v.const is not None else known.get(v.id)) for v in kernel.inputs}
        tasks[key] = Task(key, ctx, dict(kernel.decisions), space, 1, _describe(ctx.nodes, kernel.func),
                          [data[v.id] for v in kernel.inputs])
    return sorted(tasks.values(), key=lambda t: -t.weight)


def random_inputs(func, data: list, seed: int = 0) -> list[np.ndarray]:
    """Arrays for a kernel's params: compile-time data where known, else fresh random values
    (normal floats, small non-negative integers), then uninitialised outputs."""
    rng = np.random.default_rng(seed)
    out = []
    for k, p in enumerate(func.params):
        shape, dt = tuple(p.shape), p.dtype.np
        if k < len(data) and data[k] is not None:
            out.append(np.array(np.asarray(data[k], dtype=dt).reshape(shape), order="C"))  # 0-d stays 0-d
        elif k < len(data):
            if np.issubdtype(dt, np.floating):
                out.append(rng.standard_normal(shape).astype(dt))
            elif dt == np.bool_:
                out.append(rng.random(shape) < 0.5)
            else:
                out.append(rng.integers(0, 2, size=shape).astype(dt))
        else:
            out.append(np.zeros(shape, dt))
    return out
