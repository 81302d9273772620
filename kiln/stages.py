"""The text of one pipeline stage, for `kiln compile --emit`: every stage can be looked at.

graph: the imported graph; optimized: the graph the compiled model runs (after
the passes of its -O level); loops: the loop IR of its native module; c: the C
source the library was built from (read back from the build, so it is exactly
what runs).
"""

from __future__ import annotations

from kiln.errors import KilnError
from kiln.export import bind_shapes, c_source_of, native_module


def stage_text(graph, compiled, stage: str, dims: dict[str, int] | None) -> str:
    """`graph` is the imported graph; `compiled` the CompiledModel made from it (None for 'graph')."""
    if stage == "graph":
        return str(graph)
    if stage == "optimized":
        return str(compiled.graph)
    if compiled.target != "cpu":
        raise KilnError(f"--emit {stage} shows native code, which target {compiled.target!r} has none "
                        "of; use --target cpu")
    shapes = bind_shapes(compiled, dims)
    if stage == "c":
        return c_source_of(native_module(compiled, shapes))
    if stage == "loops":
        from kiln.lower.module import lower_graph
        from kiln.lower.specialize import specialize
        g, known = specialize(compiled.graph, shapes, {})
        return str(lower_graph(g, known, compiled.program.target).module) + "\n"
    raise KilnError(f"unknown stage {stage!r}; choose graph, optimized, loops or c")
