"""Default schedules: what a kernel gets when its op's lowering does not choose one.

Heuristics, hardware-aware through the target's vector width and fork cost; tuned schedules
(kiln.tune) replace them later. Small kernels stay serial: below the `parallel_min_work`
floor (kiln.lower.decisions), or where the time threads would save is less than the
target's fork and join (kiln.lower.nnutil.parallel_worth, at its "copy" rate).
"""

from __future__ import annotations

import math

from kiln.loops import Schedule
from kiln.loops.symbols import extent, hint, static
from kiln.lower.nnutil import parallel_worth, schedule_rows
from kiln.targets.target import Target



def default_schedule(sch: Schedule, outputs, target: Target) -> None:
    """Injective stages: fuse, vectorize the inner lanes (`target`'s), parallelize the outer
    part. Reduction stages: parallelize the outermost spatial loop when there is work."""
    for stage in sch.stages:
        if stage.attach is not None:
            continue
        axes = list(stage.axis)
        if not axes:
            continue
        extents = [hint(v.arg.dom[1] - v.arg.dom[0]) for v in axes]
        points = math.prod(extents)
        red = math.prod(hint(v.arg.dom[1] - v.arg.dom[0]) for v in stage.reduce_axis) if stage.reduce_axis else 1
        # past the serial floor, and the time threads save worth the target's fork and join
        parallel = parallel_worth(points * red, target, "copy")
        if stage.reduce_axis:
            if parallel and extents[0] > 1:
                stage.parallel(axes[0])
            continue
        lanes = target.vector_lanes(stage.tensor.dtype.itemsize)
        if not all(static(v.arg.dom[1]) for v in axes):
            symbolic_rows(stage, parallel)
            continue
        if len(axes) > 1 and extents[-1] >= 2 * lanes:
            # rows × vectorized last axis: index math on the outer dims happens once per row
            outer = stage.fuse(*axes[:-1]) if len(axes) > 2 else axes[0]
            lo, li = stage.split(axes[-1], lanes)
            stage.vectorize(li)
            if parallel:
                stage.parallel(outer)
            continue
        fused = stage.fuse(*axes) if len(axes) > 1 else axes[0]
        if points >= 4 * lanes and lanes > 1:
            outer, inner = stage.split(fused, lanes)
            stage.vectorize(inner)
            if parallel:
                stage.parallel(outer)
        elif parallel:
            stage.parallel(fused)


def symbolic_rows(stage, parallel: bool) -> None:
    """An injective stage with a symbolic extent (kiln.loops.symbols): the outer loops fused
    into one (parallel when there is work), the innermost vectorized whole, never split (a
    split of a symbolic extent guards its last tile, a branch in the vector loop)."""
    *outer, inner = stage.axis
    if outer:
        o = stage.fuse(*outer) if len(outer) > 1 else outer[0]
        if parallel and extent(o) > 1:
            stage.parallel(o)
    if extent(inner) > 1:
        stage.vectorize(inner)


def default_then(extra, target: Target):
    """A schedule: the default one for every stage, then `extra(sch)` adjustments."""
    def fn(sch, outputs):
        extra(sch)
        done = {s for s in sch.stages if s.relations or s.kinds or s.attach is not None}
        rest = [s for s in sch.stages if s not in done]
        saved = sch.stages
        sch.stages = rest
        try:
            default_schedule(sch, outputs, target)
        finally:
            sch.stages = saved
    return fn


def norm_schedule(out_tensors, lead: int, work: int, target: Target):
    """Statistics stages by default; the normalized outputs as rows (lead axes parallel)."""
    def extra(sch):
        for t in out_tensors:
            schedule_rows(sch[t], lead, target, work)
    return default_then(extra, target)
