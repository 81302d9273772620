"""The text of one pipeline stage, for `kiln compile --emit`: every stage can be looked at.

graph: the imported graph; optimized: the graph after the passes of its -O level;
partition: its fusion groups; loops: the loop IR of its native module; c: the C
source that module is built from. Each is the pipeline's own intermediate
(kiln.compiler.run_stages runs the stages in order, keeping each result), not a
second lowering.
"""

from __future__ import annotations

from kiln.compiler import STAGES, run_stages
from kiln.errors import KilnError


def stage_text(graph, stage: str, dims: dict[str, int] | None, *, target: str = "cpu",
               opt_level: int | None = None, decisions: dict | None = None, cpu=None) -> str:
    """`graph` is the imported graph (or anything kiln.compile accepts); `cpu` the CPU
    (kiln.targets.Target or a name; None: this host) native stages are made for."""
    if stage not in STAGES:
        raise KilnError(f"unknown stage {stage!r}; choose one of {list(STAGES)}")
    if stage not in ("graph", "optimized") and target != "cpu":
        raise KilnError(f"--emit {stage} shows native code, which target {target!r} has none "
                        "of; use --target cpu")
    return run_stages(graph, stage, opt_level=opt_level, dims=dims, decisions=decisions, cpu=cpu).text(stage)
