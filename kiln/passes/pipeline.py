"""The pass pipeline: which named passes run, in which order, at each -O level.

    -O0  nothing
    -O1  cleanup: NOP elimination, constant folding, dead code elimination
    -O2  -O1 + CSE, algebraic simplification, transpose sinking, BatchNorm folding,
         non-overlapping ConvTranspose → 1x1 Conv + DepthToSpace, MatMul+Add → Gemm
    -O3  -O2 + pattern recognition (LayerNorm, RMSNorm, GELU, rotary embeddings, SiLU-gated
         MLPs placed to fuse into their GEMMs), attention fused into one kernel
         (kiln::FusedAttention, online softmax), NCHWc layout for convolutions,
         expand/depthwise/project chains fused into one kernel (kiln::InvertedResidual),
         recurrent layers' input projections taken out of the time loop (one GEMM) and their
         recurrent weights packed, constant GEMM weights packed into panels at compile time,
         GEMMs that read one input (Q/K/V, gate/up) merged into one whose outputs are views

The default (`DEFAULT_LEVEL`, used by kiln.compile and the CLI) is the fastest
level, -O3: the lower levels are there to debug a rewrite, not to trade speed
for anything.

`run_passes` runs a level on a clone of the graph, records what each pass
changed (`PassStats`), verifies the graph after each pass when asked (tests do;
`KILN_VERIFY=1` turns it on elsewhere) and writes the text IR after each pass to
`dump_dir` or `$KILN_DUMP_IR` as `NN_passname.txt` (`00_input.txt` first).
"""

from __future__ import annotations

import os
import time

from kiln.errors import KilnError
from kiln.graph.ir import Graph
from kiln.graph.text import print_graph
from kiln.ops.verify import verify as verify_graph
from kiln.passes.registry import PassContext, get_pass
from kiln.targets.target import Target
from kiln.passes.stats import PassStats, diff, snapshot


def level0() -> list[str]:
    return []


def level1() -> list[str]:
    return ["eliminate_nops", "fold_constants", "eliminate_dead_code"]


def level2() -> list[str]:
    return ["eliminate_nops", "fold_constants", "eliminate_common_subexpressions",
            "simplify_algebra", "sink_transposes", "fold_batchnorm", "conv_transpose_to_conv",
            "matmul_add_to_gemm", "eliminate_nops", "eliminate_dead_code"]


def level3() -> list[str]:
    # recognition runs before algebraic simplification rewrites the exported forms
    # (it also accepts the simplified ones)
    return ["eliminate_nops", "fold_constants", "eliminate_common_subexpressions",
            "recognize_layernorm", "recognize_rmsnorm", "recognize_gelu", "recognize_rotary",
            "simplify_algebra", "sink_transposes", "recognize_swiglu", "fold_batchnorm", "conv_transpose_to_conv",
            "matmul_add_to_gemm", "transform_layout", "fuse_inverted_residual",
            "decompose_recurrent", "pack_weights", "fuse_attention", "merge_gemms", "eliminate_nops",
            "eliminate_dead_code"]


LEVELS = {0: level0, 1: level1, 2: level2, 3: level3}
DEFAULT_LEVEL = 3


def passes_for(level: int) -> list[str]:
    if level not in LEVELS:
        raise KilnError(f"unknown optimization level {level!r}; choose one of {sorted(LEVELS)}")
    return LEVELS[level]()


def run_passes(graph: Graph, level: int = DEFAULT_LEVEL, *, passes: list[str] | None = None,
               dump_dir: str | None = None, verify: bool | None = None, target: Target | None = None,
               decisions: dict | None = None) -> tuple[Graph, list[PassStats]]:
    """Run the passes of `level` (or the named `passes`) on a clone of `graph`, for CPU
    `target` (a kiln.targets.Target; None: this host).

    Returns the optimized graph and one PassStats per pass run; the given graph
    is never changed. `decisions`: kiln.compile's decision overrides (a pass may read its own).
    """
    names = passes_for(level) if passes is None else list(passes)
    steps = [get_pass(n) for n in names]
    dump_dir = dump_dir or os.environ.get("KILN_DUMP_IR") or None
    if verify is None:
        verify = os.environ.get("KILN_VERIFY", "0") not in ("", "0")
    if not steps:
        return graph, []
    target = Target.of(target)
    graph = graph.clone()
    if dump_dir:
        os.makedirs(dump_dir, exist_ok=True)
        _dump(dump_dir, "00_input.txt", graph)
    stats = []
    for i, p in enumerate(steps, 1):
        before, ctx, t0 = snapshot(graph), PassContext(target, decisions=dict(decisions or {})), time.perf_counter()
        try:
            graph = p(graph, ctx)
        except KilnError as e:
            if e.stage:
                raise
            raise KilnError(e.raw_message, node=e.node, op=e.op, stage=p.name) from e
        except Exception as e:
            raise KilnError(f"pass failed: {type(e).__name__}: {e}", stage=p.name) from e
        stats.append(diff(p.name, before, graph, time.perf_counter() - t0, ctx.fired, ctx.findings))
        if verify:
            verify_graph(graph, stage=f"verify after {p.name}")
        if dump_dir:
            _dump(dump_dir, f"{i:02d}_{p.name}.txt", graph)
    return graph, stats


def _dump(folder: str, name: str, graph: Graph) -> None:
    with open(os.path.join(folder, name), "w") as f:
        f.write(print_graph(graph))
