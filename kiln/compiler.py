"""`kiln.compile`: the one readable pipeline. Read this file top to bottom.

    model
      │ frontend       an .onnx path, bytes, ModelProto (or a Graph) → Graph        kiln.frontends
      │ optimize       the passes of the -O level → Optimized                       kiln.passes
      ▼ per input shapes: at compile time when every input size is static, else at the
        first run with each new shape key (kiln.targets.cpu keeps one runner per key)
      │ specialize     shapes bound, types re-inferred (passes run again where sizes were
      │                symbolic) → Specialized; its `breaks` (control flow, data-dependent
      │                sizes) make the graph run in stages, each a module made as below
      │ partition      fusion groups → FusionPlan                                   kiln.lower.partition
      │ lower_groups   each group → a kernel, schedule trace and decisions kept     kiln.lower.kernel
      │ plan_memory    weights blob, workspace arena → MemoryPlan                   kiln.lower.memory
      │ emit_module    kernels + entry function → LoweredModule (loop IR)           kiln.lower.module
      │ generate       loop IR → C translation units → CSource                      kiln.codegen
      │ build          compile (cached), describe → Built (the module cache entry)  kiln.codegen.build
      ▼ load           → NativeModule: one foreign call per inference               kiln.runtime

A model whose input sizes are all static is first looked up whole (`whole_key`: the
graph as given, options, target, toolchain; `cached_model`): a hit loads its library and
weights blob as built, and no pass runs. On a miss its module is cached under that key.
`native` runs partition → build behind the module cache (kiln.targets.cache); a big module
(tier "auto") is built and loaded at -Og first, its -O3 build then made in the background
and swapped in when ready (kiln.codegen.tiers, kiln.targets.tiered); only -O3 is cached.
`run_stages` runs the same functions, keeping each result, for `kiln compile --emit`.
With shapes="generic" (or "tiered"), `generic` instead lowers the optimized graph once with
its symbols kept symbolic (kiln.lower.generic: the same partition → lower_groups → memory →
emit_module, kernels taking the symbols' values, the arena planned per shape at run time)
→ generate → build → load a kiln.runtime.generic.GenericModule that runs every shape.
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kiln.errors import KilnError
from kiln.graph.ir import Graph, Value
from kiln.graph.types import OptionalType, SequenceType, TensorType
from kiln.limits import Limits, check_planned
from kiln.limits import use as use_limits
from kiln.runtime.model import CompiledModel, TensorSpec
from kiln.targets.loaded import cached, cached_whole, load, native_module  # noqa: F401 (load: a stage)
from kiln.timing import StageTimes, recording, stage
from kiln.timing import current as current_times

TARGETS = ("interpreter", "cpu")
SHAPES = ("specialize", "generic", "tiered")
STATIC_REASON = "every input size is static: one module"
STAGES = ("graph", "optimized", "partition", "loops", "c")


def compile(model: Any, target: Any = "cpu", *, cpu: Any = None, opt_level: int | None = None,  # noqa: A001
            report: bool = False, limits: Limits | dict | None = None, example_inputs=None,
            dynamic_shapes=None, decisions: dict | None = None, tuning: str | None = None,
            shapes: str = "specialize", tier: str | None = None, **options) -> CompiledModel:
    """Compile a model for `target` and return a runnable CompiledModel.

    `target`: "cpu" (native code), "interpreter" (the NumPy reference), or a CPU to build
    native code for: a kiln.targets.Target or a CPU name (`x86-64-v3`, `znver4`, ...).
    `cpu`: the same CPU choice with target "cpu" (default: this host, -march=native); the
    code then runs on any CPU with that CPU's features.

    A torch.nn.Module (or torch.export.ExportedProgram) is exported with
    `example_inputs` (and torch.export's `dynamic_shapes`) and translated by
    kiln.frontends.torch; the result is a TorchModel, callable like the module.

    `opt_level` picks the graph passes (kiln.passes.pipeline: 0 none ... 3 all;
    None, the default, is the fastest level, -O3);
    `report=True` attaches `model.report`, a CompileReport of what was done;
    `limits` caps constants, planned memory and loop trip counts (kiln.limits:
    a Limits, or a dict overriding some of the defaults), at compile and run time;
    `decisions` overrides schedule decisions (kiln.lower.decisions: {name: value} for
    every kernel, {kernel: {name: value}} for one);
    `tuning`: a records database (`kiln tune`; default $KILN_TUNING_DB): each kernel gets the
    best record of its workload measured on this machine (kiln.tune.apply).
    `shapes` (models with symbolic input dims, target "cpu"): "specialize" (the default) builds
    a module per new input shape at its first run; "generic" builds one module now that runs
    every value of the symbols (kiln.lower.generic), or, where the model cannot be generic,
    specialises as before; "tiered": that generic module serves each new shape at once while
    the module specialised to it is built in a background thread and swapped in when ready
    (JIT tiering). `model.shapes` says which ("generic" | "tiered" | "specialize" | "static")
    and `model.shapes_reason` why not generic (also in the report).
    `tier` (default $KILN_TIER, else "auto"): "auto" returns a big module built at a quick tier
    (-Og) while its -O3 build runs in the background and is swapped in between two runs when
    ready (kiln.codegen.tiers; `model.wait_optimized()` waits for it); "full" returns the -O3
    build, as timing tools must.
    """
    from kiln.codegen.tiers import tier_of  # noqa: PLC0415
    target, cpu, tier = *_split_target(target, cpu), tier_of(tier)
    if shapes not in SHAPES:
        raise KilnError(f"unknown shapes={shapes!r}; choose one of {list(SHAPES)}")
    if options:
        raise KilnError(f"unknown compile option(s) {sorted(options)}")
    if _is_torch(model):   # the torch frontend hands back a Graph, compiled as any other
        from kiln.frontends.torch import TorchModel, export_module  # noqa: PLC0415
        if decisions:
            raise KilnError("decisions are not passed through the torch frontend yet; export to ONNX")
        if shapes != "specialize":
            raise KilnError("shapes= is not passed through the torch frontend yet; export to ONNX")
        graph, spec = export_module(model, example_inputs, dynamic_shapes)
        compiled = compile(graph, target, opt_level=opt_level, report=report, limits=limits, cpu=cpu,
                           tuning=tuning)
        return TorchModel(compiled, spec, graph)
    if example_inputs is not None or dynamic_shapes is not None:
        raise KilnError("example_inputs and dynamic_shapes are for torch modules; an ONNX model "
                        "declares its own input shapes")
    if decisions:   # (kiln.lower is imported only when needed: a warm compile may need none of it)
        from kiln.lower.decisions import normalize  # noqa: PLC0415
        decisions = normalize(decisions)
    decisions = decisions or {}
    from kiln.tune.apply import tuning_path  # noqa: PLC0415
    tuning = tuning_path(tuning)
    lim = Limits.of(limits)
    with use_limits(lim), recording(current_times()) as times:   # (into the caller's, if open)
        compiled = _compile(model, target, opt_level, report, cpu, decisions, tuning, shapes, times, tier)
    compiled.limits = lim
    return compiled.wait_optimized() if tier == "full" else compiled   # (one built "auto" may be under way)


def level_of(opt_level: int | None) -> int:
    """The -O level asked for; None: the default (kiln.passes.pipeline.DEFAULT_LEVEL)."""
    if opt_level is None:
        from kiln.passes.pipeline import DEFAULT_LEVEL  # noqa: PLC0415
        return DEFAULT_LEVEL
    return opt_level


def _split_target(target: Any, cpu: Any):
    """("cpu" | "interpreter", the CPU Target or None): a CPU given as `target` means "cpu"."""
    from kiln.targets.target import NAMED, Target  # noqa: PLC0415
    if isinstance(target, Target) or (isinstance(target, str) and target in (*NAMED, "host", "native")):
        if cpu is not None:
            raise KilnError(f"target {target!r} is already a CPU; leave cpu= out")
        return "cpu", Target.of(target)
    if target not in TARGETS:
        raise KilnError(f"unknown target {target!r}; choose one of {list(TARGETS)} or a CPU name "
                        f"({', '.join(sorted(NAMED))})")
    if cpu is not None and target != "cpu":
        raise KilnError(f"cpu={cpu!r} is for target 'cpu', not {target!r}")
    return target, None if cpu is None else Target.of(cpu)


def _is_torch(model: Any) -> bool:
    """A torch module or exported program (checked without importing torch for ONNX users)."""
    import sys  # noqa: PLC0415
    if "torch" not in sys.modules:
        return False
    from kiln.frontends.torch import is_torch_model  # noqa: PLC0415
    return is_torch_model(model)


def _compile(model: Any, target: str, opt_level: int, report: bool, cpu, decisions: dict,
             tuning: str | None = None, shapes: str = "specialize",
             times: StageTimes | None = None, tier: str = "auto") -> CompiledModel:
    from kiln.codegen.fork_cost import calibrated  # noqa: PLC0415
    from kiln.targets.target import Target  # noqa: PLC0415
    cpu = Target.of(cpu)    # the one place the host is asked (when no CPU was named)
    cpu = calibrated(cpu) if target == "cpu" else cpu   # its fork cost, measured once per machine
    if target == "cpu":   # (before the lookups: a cold compile's first C compiler run starts sooner)
        from kiln.codegen.toolchain import start_probes  # noqa: PLC0415
        start_probes(cpu)
    # a model file compiled before, unchanged since: its module loaded, the file not even read
    file = None if report else model_file(model, target, opt_level, cpu, decisions, tuning)
    builds: list = []
    try:
        if file is not None:
            with stage("cache load"):
                key = file.compile_key()
            compiled = key and cached_model(key, lambda: frontend(file.unchanged(model)), opt_level, cpu, decisions)
            if compiled is not None:
                return compiled
            _start_builds(target, cpu, builds)   # a file not found: started while it is read
        source = frontend(model)
        # (None, the default level, is keyed as such: the level it is is kiln's source, in the key)
        key = whole_key(source, target, opt_level, cpu, decisions, tuning)
        if key is not None and not report:   # a static model compiled before: load it, run no pass
            compiled = cached_model(key, lambda: source, opt_level, cpu, decisions)
            if compiled is not None:
                return _remembered(file, source, key, compiled)
        _start_builds(target, cpu, builds)
        return _passes_on(source, file, key, target, level_of(opt_level), cpu, decisions, tuning, shapes,
                          report, times, tier)
    finally:   # no compiler process outlives the compile that started it (a failed one too)
        for pool in builds:
            if pool is not None:
                pool.join()


def _start_builds(target: str, cpu, builds: list) -> None:
    """On a cache miss (once: `builds` keeps the pool's thread, or None): kiln's pool is
    compiled (once per machine) once the toolchain's probes (started by `_compile`) have
    answered, while the frontend and the passes run."""
    if target == "cpu" and not builds:
        from kiln.codegen.build import prebuild_pool  # noqa: PLC0415
        builds.append(prebuild_pool(cpu))


def _passes_on(source, file, key, target, opt_level, cpu, decisions, tuning, shapes, report, times, tier):
    """_compile past the caches: the passes, then the model for `target`."""
    if tuning is not None:   # the passes' tuned decisions: conv algorithms, weight panels (kiln.tune.apply)
        from kiln.tune.apply import with_pass_records  # noqa: PLC0415
        decisions = with_pass_records(tuning, decisions, cpu)
    optimized = optimize(source, opt_level, cpu, decisions)
    graph = optimized.graph
    ins, outs = [spec_of(v) for v in graph.inputs], [spec_of(v) for v in graph.outputs]
    if target == "interpreter":
        compiled = InterpretedModel(graph)
    else:
        compiled = _remembered(file, source, key, _cpu_model(optimized, decisions, tuning, shapes, ins, outs, key, tier))
    if report:
        compiled.report = _report(optimized, compiled if target == "cpu" else None, times)
        for m in (compiled, getattr(compiled, "special", None)):   # passes run again per input
            if hasattr(m, "program"):                                # shape add their findings
                m.program.report = compiled.report
    return compiled


def _cached_whole_ok(target: str, tuning) -> bool:
    """Whether a compile may be served whole from the cache (not: tuning records, which are
    not in the key; KILN_DUMP_IR, which must run the passes)."""
    return target == "cpu" and tuning is None and not os.environ.get("KILN_DUMP_IR")


def whole_key(graph: Graph, target: str, level: int | None, cpu, decisions: dict, tuning) -> str | None:
    """The compile key (kiln.targets.cache.compile_key) under which a static model's module
    is cached whole, or None where there is none (`_cached_whole_ok`; some input size
    unknown: built per shape at run time)."""
    if not _cached_whole_ok(target, tuning) or not all(
            isinstance(v.type, TensorType) and v.type.is_static for v in graph.inputs):
        return None
    from kiln.limits import current  # noqa: PLC0415
    from kiln.targets import cache  # noqa: PLC0415
    with stage("cache key"):
        return cache.compile_key(graph, level, cpu, decisions, current())


def model_file(model: Any, target: str, level: int | None, cpu, decisions: dict, tuning):
    """A model given as a path as a kiln.targets.cache.ModelFile (found by its identity), or None."""
    if not isinstance(model, (str, os.PathLike)) or not _cached_whole_ok(target, tuning):
        return None
    from kiln.limits import current  # noqa: PLC0415
    from kiln.targets.cache import ModelFile  # noqa: PLC0415
    with stage("cache key"):
        return ModelFile.of(model, level, cpu, decisions, current())


def _remembered(file, source: Graph, key: str | None, compiled: CompiledModel) -> CompiledModel:
    """`compiled`, the model file `file` (`model_file`) read as `source` having been cached
    whole under compile key `key` (when both are given), remembered as such."""
    if file is not None and key is not None:
        file.remember(getattr(source, "data_files", ()), key)
    return compiled


def cached_model(key: str, graph, level: int | None, cpu, decisions: dict) -> CompiledModel | None:
    """The model compiled under `key` before, loaded from the module cache (its library and
    its weights blob as built), or None. Its pipeline (the passes over `graph()`) runs only
    if something later needs the optimized graph (an artifact, `kiln compile --emit`)."""
    from kiln.targets.cpu import CpuModel, Deferred  # noqa: PLC0415
    module = cached_whole(key)
    if module is None:
        return None
    ins, outs = ([TensorSpec(n, d, None if s is None else tuple(s), k) for n, d, s, k in specs]
                 for specs in module.specs)

    pipeline = Deferred(lambda: ShapePipeline(optimize(graph(), level_of(level), cpu, decisions), decisions), cpu)
    model = CpuModel(pipeline, ins, outs, built=module)
    model.shapes, model.shapes_reason = "static", STATIC_REASON
    return model


def _cpu_model(optimized: Optimized, decisions: dict, tuning, shapes: str, ins, outs,
               key: str | None = None, tier: str = "auto") -> CompiledModel:
    """The cpu target's model: one shape-generic module when asked and the graph allows it,
    else specialised per input shape (static inputs: built now, and cached whole under
    `key` when that is given: `whole_key`)."""
    from kiln.targets.cpu import CpuModel  # noqa: PLC0415
    static = optimized.source is None and all(s.shape is not None and all(isinstance(d, int) for d in s.shape)
                                              for s in ins)
    reason = None
    if shapes in ("generic", "tiered") and not static:
        from kiln.lower.generic import NotGeneric  # noqa: PLC0415
        try:
            from kiln.targets.generic import GenericModel, TieredModel  # noqa: PLC0415
            module = generic(optimized, decisions)
            special = CpuModel(ShapePipeline(optimized, decisions, tuning=tuning), ins, outs)
            return (TieredModel if shapes == "tiered" else GenericModel)(module, optimized, ins, outs, special)
        except NotGeneric as e:
            reason = f"shapes={shapes!r} asked for, but one module cannot serve every shape: {e.raw_message}"
    whole = (key, ins, outs) if static and key is not None else None
    model = CpuModel(ShapePipeline(optimized, decisions, tuning=tuning, whole=whole, tier=tier), ins, outs)
    model.shapes = "static" if static else "specialize"
    model.shapes_reason = reason or (STATIC_REASON if static else
                                     "shapes='specialize' (the default): one module per input shape, built at "
                                     "its first run; shapes='generic' or 'tiered' builds one for every shape")
    return model


def generic(optimized: Optimized, decisions: dict | None = None):
    """The optimized graph (symbolic input dims) as one shape-generic native module:
    lower_generic → generate → build → load (kiln.runtime.generic.GenericModule).
    Raises kiln.lower.generic.NotGeneric saying why the graph cannot be one."""
    from kiln.codegen import build_c, func_symbol  # noqa: PLC0415
    from kiln.limits import check_memory  # noqa: PLC0415
    from kiln.lower.generic import lower_generic  # noqa: PLC0415
    from kiln.runtime.generic import GenericModule  # noqa: PLC0415
    findings: list = []
    graph = resolved(optimized, findings)
    with stage("lower"):
        sg = lower_generic(graph, optimized.target, decisions)
    lm = sg.lowered
    source = generate(lm, optimized.target)
    lib = build_c(lm.module, optimized.target, units=source.units)
    with stage("load"):
        module = GenericModule(str(lib.path), lib.sha256, func_symbol(lm.module.entry), sg.symbols,
                               sg.inputs, sg.outputs, lm.weights, sg.layout, lm.call_nodes, lm.call_errors,
                               check_bytes=lambda n, what: check_memory(n, what, stage="run"),
                               derived=sg.derived, atoms=sg.atoms)
    module.info = {"kernels": len(lm.module.funcs) - 1, "calls": sg.steps, "variants": sg.variants,
                   "row_tiles": sg.row_tiles, "guards": len(sg.guards),
                   "why_not_fused": lm.fusion.why_not if lm.fusion else [], "decisions": lm.decisions,
                   "findings": findings}
    return module


def resolved(optimized: Optimized, findings: list | None = None) -> Graph:
    """The graph a generic module is lowered from: the source with the sizes it computes
    named by polynomials of its symbols (kiln.lower.symbolic_shapes: batch*seq), then its
    passes run again, so the rewrites that match shapes (attention fusion) see sizes that
    agree, not a fresh symbol per computed size. Without a source: the optimized graph.
    The passes' findings (each conv's algorithm, chosen for every value of the symbols)
    are appended to `findings`."""
    if optimized.source is None:
        return optimized.graph
    from kiln.lower.generic import graph_symbols  # noqa: PLC0415
    from kiln.lower.symbolic_shapes import Undecided, resolve  # noqa: PLC0415
    from kiln.passes import run_passes  # noqa: PLC0415
    with stage("optimize"):
        try:
            source = resolve(optimized.source, graph_symbols(optimized.source), for_lowering=False).graph
        except (Undecided, KilnError):
            return optimized.graph
        graph, stats = run_passes(source, optimized.level, target=optimized.target, decisions=optimized.decisions)
        if findings is not None:
            findings.extend(f for p in stats for f in p.findings)
        return graph


# -- frontend, passes ----------------------------------------------------------------------

def frontend(model: Any) -> Graph:
    """Accept a path, bytes, an onnx.ModelProto or a Graph; return a typed Graph."""
    if isinstance(model, Graph):
        return model
    from kiln.frontends.onnx import load_onnx  # noqa: PLC0415
    if isinstance(model, (str, os.PathLike, bytes)) or type(model).__name__ == "ModelProto":
        with stage("frontend"):
            return load_onnx(model)
    raise KilnError(f"cannot compile a {type(model).__name__}: pass a path to an .onnx file, "
                    "an onnx.ModelProto or a kiln Graph")


to_graph = frontend


@dataclass(frozen=True)
class Optimized:
    """Stage "optimize": the graph after the passes of -O`level` for CPU `target`."""
    graph: Graph
    stats: list                  # kiln.passes PassStats, one per pass run
    level: int
    target: Any                  # kiln.targets.Target: the CPU the code is for
    # the unoptimised graph, kept when some input size is unknown: the passes that need
    # static shapes run again on it per input shapes (see `specialize`)
    source: Graph | None = None
    decisions: dict | None = None   # the decision overrides the passes read (the conv algorithm)


def optimize(graph: Graph, level: int, target, decisions: dict | None = None) -> Optimized:
    from kiln.passes import run_passes  # noqa: PLC0415
    with stage("optimize"):
        optimized, stats = run_passes(graph, level, target=target, decisions=decisions)
    static = all(isinstance(v.type, TensorType) and v.type.is_static for v in optimized.inputs)
    return Optimized(optimized, stats, level, target, None if static or not level else graph, decisions)


# -- per input shapes ----------------------------------------------------------------------

@dataclass(frozen=True)
class Specialized:
    """Stage "specialize": the graph for one shape key, and what is known at compile time."""
    graph: Graph
    known: dict                  # value id -> compile-time data (constants' and shape inputs')
    breaks: list                 # kiln.lower.specialize.Break: where it must run in stages
    stats: list = field(default_factory=list)  # PassStats of the passes run again at these sizes


def specialize(optimized: Optimized, shapes: list, values: dict | None = None) -> Specialized:
    """`optimized` specialised to input `shapes` (and input `values`: small shape-giving inputs);
    with a source to re-optimise, the source specialised, its passes run with the sizes known,
    then specialised again (the passes make fresh values, and `known` is keyed by value).
    The one specialisation path: compile, export and `kiln compile --emit` all come here."""
    from kiln.lower.specialize import specialize as bind, stage_breaks  # noqa: PLC0415
    values = values or {}
    graph, stats = optimized.graph, []
    with stage("specialize"):
        if optimized.source is not None:
            from kiln.passes import run_passes  # noqa: PLC0415
            graph, stats = run_passes(bind(optimized.source, shapes, values)[0], optimized.level,
                                      target=optimized.target, decisions=optimized.decisions)
        g, known = bind(graph, list(shapes), values)
        return Specialized(g, known, stage_breaks(g), stats)


@dataclass(frozen=True)
class ShapePipeline:
    """What one compiled graph runs per input shapes (kiln.targets.cpu calls it with each
    new shape key): `specialize`, then `native` for each stage that is one static module."""
    optimized: Optimized
    decisions: dict = field(default_factory=dict)
    complete: bool = True        # the whole model (else a stage or body: some kernels are elsewhere)
    tuning: str | None = None    # a tuning records database (kiln.tune.apply)
    # a static model's (compile key, input specs, output specs): its module is cached whole
    # under that key (kiln.compiler.whole_key), found by a warm compile before any pass runs
    whole: tuple | None = None
    tier: str = "auto"           # kiln.codegen.tiers: "auto" (a quick tier first where it pays) or "full"

    @property
    def target(self):
        """The CPU every module is built for (kiln.targets.Target)."""
        return self.optimized.target

    def specialize(self, shapes: list, values: dict | None = None) -> Specialized:
        return specialize(self.optimized, shapes, values)

    def native(self, graph: Graph, known: dict, whole: bool = False):
        """The native module of a specialised `graph`; `whole`: it is the whole static model's
        (cached under the model's compile key when there is one)."""
        from kiln.tune.apply import with_records  # noqa: PLC0415
        decisions = with_records(self.tuning, graph, known, self.decisions, self.target)
        return native(graph, known, self.target, decisions, strict=self.complete,
                      whole=self.whole if whole else None, tier=self.tier)

    def part(self, graph: Graph) -> ShapePipeline:
        """The pipeline for a part of the graph (a stage before or after a break, a body)."""
        return ShapePipeline(Optimized(graph, [], self.optimized.level, self.target), self.decisions, False,
                             self.tuning, tier=self.tier)


def lower(graph: Graph, known: dict | None = None, target=None, decisions: dict | None = None,
          strict: bool = True, place=None, on_kernel=None):
    """partition → lower_groups → plan_memory → emit_module: a static graph as loop IR for CPU
    `target` (None: this host). `strict`: a decision override for a kernel the module does
    not have is an error. `place(nbytes, pieces)`: where the weights blob is made
    (kiln.lower.module.weights_blob; default: memory);
    `on_kernel(func)`: called with each kernel as it is lowered (`native`: builds start)."""
    from kiln.lower.module import check_static, emit_module, lower_groups, plan_memory  # noqa: PLC0415
    from kiln.lower.partition import partition  # noqa: PLC0415
    check_static(graph)
    with stage("partition"):
        fusion = partition(graph, fuse_anchors=True)
    with stage("lower"):
        groups = lower_groups(graph, fusion, known or {}, target, decisions, on_kernel=on_kernel)
    if strict:
        from kiln.lower.decisions import check_kernels  # noqa: PLC0415
        check_kernels(decisions or {}, [k.func.name for k in groups.kernels])
    with stage("plan memory"):
        memory = plan_memory(graph, groups, place)
    with stage("emit module"):
        lowered = emit_module(graph, groups, memory, fusion)
    check_planned(int(lowered.weights.size), lowered.workspace_bytes,
                  [(v.type.shape, v.type.dtype.name) for v in lowered.outputs], graph, lowered.arena)
    return lowered


@dataclass(frozen=True)
class CSource:
    """Stage "generate": the module's C, as translation units (compiled in parallel)."""
    units: list

    @property
    def text(self) -> str:
        from kiln.codegen.build import joined_source  # noqa: PLC0415
        return joined_source(self.units)


def generate(lowered, target) -> CSource:
    """C for `target`: its threads_impl (set from $KILN_THREADS_IMPL once, when the Target
    was made) runs the parallel loops, as it did the lowering's fork decisions."""
    from kiln.codegen.build import c_units  # noqa: PLC0415
    with stage("generate C"):
        return CSource(c_units(lowered.module, target))


@dataclass(frozen=True)
class Built:
    """Stage "build": the library and what the runtime and reports need of the module. Stored
    as the module cache entry (`manifest()`, checked by kiln.targets.cache.MODULE_ENTRY)."""
    library_key: str             # the C build cache's key (the library's file name)
    library_sha256: str
    entry: str                   # the entry function's symbol
    outputs: list                # [[shape], dtype name] per graph output
    weights_bytes: int
    weights: list                # [[constant index, blob offset], ...]
    workspace_bytes: int
    calls: list                  # call k -> the nodes it computes
    errors: list                 # call k -> its kernel's [[status, message], ...]
    kernels: int
    arena: str
    arena_bytes: int
    arena_peak_live_bytes: int
    intermediate_bytes: int
    inplace_kernels: int
    why_not_fused: list
    call_args: list              # per call: [kernel symbol, [[base, byte offset], ...]]
    decisions: dict              # kernel -> the schedule decisions it took

    def manifest(self) -> dict:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}

    @staticmethod
    def of(manifest: dict) -> Built:
        return Built(**manifest)


def build(graph: Graph, lowered, source: CSource, target, quick=None) -> Built:
    """Stage "build" (at `quick`'s flags: a kiln.codegen.tiers.QuickTier)."""
    from kiln.codegen import build_c, func_symbol  # noqa: PLC0415
    lib = build_c(lowered.module, target, units=source.units, cflags=quick and quick.flags,
                  reuse=quick and quick.final)
    index = {v.id: i for i, v in enumerate(graph.constants())}
    lm = lowered
    return Built(
        library_key=lib.path.stem, library_sha256=lib.sha256, entry=func_symbol(lm.module.entry),
        outputs=[[list(v.type.shape), v.type.dtype.name] for v in lm.outputs],
        weights_bytes=int(lm.weights.size),
        weights=[[index[vid], off] for vid, off in lm.weight_offsets.items()],
        workspace_bytes=lm.workspace_bytes, calls=lm.call_nodes, errors=lm.call_errors,
        kernels=len(lm.module.funcs) - 1, arena=str(lm.arena),
        arena_bytes=lm.arena.total, arena_peak_live_bytes=lm.arena.lower_bound,
        intermediate_bytes=lm.arena.unshared, inplace_kernels=len(lm.arena.inplace),
        why_not_fused=lm.fusion.why_not if lm.fusion else [],
        call_args=_call_args(lm, func_symbol), decisions=lm.decisions)


def native(graph: Graph, known: dict, target, decisions: dict | None = None, strict: bool = True,
           whole: tuple | None = None, tier: str = "full"):
    """One native module for a specialised graph whose sizes are all known: lower → generate
    → build → load, cached across processes by everything that determines the module (a
    damaged cache entry is built again). `whole`: (compile key, input specs, output specs)
    of the static model this graph is all of (`whole_key`): its module is then cached under
    that key with its weights blob, and no digest of this graph (its transformed weights
    included) is taken. `tier` "auto" (the pipeline's; "full" by default, what the tuner
    measures): a module whose -O3 build pays for it is built at a quick tier first and served while the -O3 build runs in the background, then swapped in
    (kiln.codegen.tiers, kiln.targets.tiered); only the -O3 module is cached."""
    from kiln.codegen.build import prebuild_shared, shared_known  # noqa: PLC0415
    from kiln.codegen.cachedir import building  # noqa: PLC0415
    from kiln.codegen.tiers import quick_tier, worth  # noqa: PLC0415
    from kiln.targets import cache  # noqa: PLC0415
    if whole is not None:
        key = whole[0]
        found = cached_whole(key)
    else:
        with stage("cache key"):
            key = cache.graph_key(graph, known, target, decisions)
        found = cached(graph, key)
    if found is not None:
        return found
    with contextlib.ExitStack() as held:   # (handed to the -O3 build's thread when it runs there)
        held.enter_context(building("modules", key))   # threads or processes meeting it build it once
        found = cached_whole(key) if whole is not None else cached(graph, key)
        if found is not None:      # built while this one waited
            return found
        quick = quick_tier(tier, target)
        # a shared kernel's object (kept per machine) is compiled as soon as lowering meets it,
        # while the rest of the module is lowered and emitted
        prebuild = functools.partial(prebuild_shared, target=target, cflags=quick and quick.flags,
                                     final=quick and quick.final)
        # whole: the weights blob written into the cache's file while the C compiler runs
        file = held.enter_context(cache.WeightsFile(key)) if whole is not None else None
        lowered = lower(graph, known, target, decisions, strict, place=file and file.place, on_kernel=prebuild)
        source = generate(lowered, target)
        if file is not None:
            file.start()   # (not before: its thread would take the GIL from code generation)
        inputs = [(v.type.shape, v.type.dtype.name) for v in graph.inputs]

        def final():   # the -O3 module, cached
            built = build(graph, lowered, source, target)
            if file is None:
                cache.store(key, built.manifest())
            else:
                weights_sum = file.written()
                file.keep()
                cache.store_whole(key, built.manifest(), *specs, weights_sum)
            with stage("load"):   # the blob lowering made (whole: the cache file's pages), not copied
                return native_module(built.manifest(), inputs, lowered.weights)
        specs = whole and [[_spec_json(s) for s in specs] for specs in whole[1:]]
        if quick is None or not worth(source.units, lambda u: not shared_known(u, target, quick.final)):
            return final()
        from kiln.targets.tiered import TieredModule  # noqa: PLC0415
        built = build(graph, lowered, source, target, quick)
        if file is not None:
            file.written()
        with stage("load"):
            module = native_module(built.manifest(), inputs, lowered.weights)
        return TieredModule(key, module, final, held.pop_all(), specs)


def _spec_json(s: TensorSpec) -> list:
    return [s.name, s.dtype, None if s.shape is None else list(s.shape), s.kind]


def _call_args(lm, func_symbol) -> list:
    """Per call of the entry: [kernel symbol, [[base, byte offset], ...]], base being
    "in<k>", "out<k>", "weights" or "workspace" (what NativeModule.profile replays)."""
    from kiln.loops.stmt import Call, Seq, View  # noqa: PLC0415
    body = lm.module.funcs[-1].body
    calls = body.stmts if isinstance(body, Seq) else (body,)
    return [[func_symbol(c.func), [[a.buffer.name.replace("_", ""), int(a.byte_offset)] if isinstance(a, View) else
                                   [a.name.replace("_", ""), 0] for a in c.args]]
            for c in calls if isinstance(c, Call)]


# -- every stage kept, for `kiln compile --emit` --------------------------------------------

@dataclass
class Stages:
    """What the pipeline made for one shape key, stage by stage (None: not run)."""
    graph: Graph
    optimized: Optimized | None = None
    specialized: Specialized | None = None
    lowered: Any = None          # kiln.lower.module.LoweredModule (its .fusion: the partition)
    source: CSource | None = None

    def text(self, stage: str) -> str:
        if stage == "graph":
            return str(self.graph)
        if stage == "optimized":
            return str(self.optimized.graph)
        if stage == "partition":
            return str(self.lowered.fusion) + "\n"
        if stage == "loops":
            return str(self.lowered.module) + "\n"
        if stage == "c":
            return self.source.text
        raise KilnError(f"unknown stage {stage!r}; choose one of {list(STAGES)}")


def run_stages(model: Any, until: str, *, opt_level: int | None = None, dims: dict | None = None,
               decisions: dict | None = None, cpu=None) -> Stages:
    """Run the pipeline up to stage `until` (one of STAGES) for CPU `cpu` (a Target or a
    name; None: this host), keeping every result; symbolic input dims are bound from `dims`
    for the stages past "optimized"."""
    if until not in STAGES:
        raise KilnError(f"unknown stage {until!r}; choose one of {list(STAGES)}")
    from kiln.lower.decisions import normalize  # noqa: PLC0415
    from kiln.runtime.inputs import bind_dims, concrete_shape  # noqa: PLC0415
    opt_level = level_of(opt_level)
    from kiln.codegen.fork_cost import calibrated  # noqa: PLC0415
    from kiln.targets.target import Target  # noqa: PLC0415
    st = Stages(frontend(model))
    if until == "graph":
        return st
    st.optimized = optimize(st.graph, opt_level, calibrated(Target.of(cpu)), normalize(decisions))
    if until == "optimized":
        return st
    ins = [spec_of(v) for v in st.optimized.graph.inputs]
    bound = bind_dims(ins, {}, dict(dims or {}))
    st.specialized = specialize(st.optimized, [concrete_shape(s, bound) for s in ins])
    if st.specialized.breaks:
        lines = "; ".join(str(b) for b in st.specialized.breaks if b.origin)
        raise KilnError(f"--emit {until} shows one native module, but this model runs in stages: {lines}",
                        stage="lower")
    st.lowered = lower(st.specialized.graph, st.specialized.known, st.optimized.target, normalize(decisions))
    if until in ("partition", "loops"):
        return st
    st.source = generate(st.lowered, st.optimized.target)
    return st


# -- runtime models and reports --------------------------------------------------------------

def spec_of(v: Value) -> TensorSpec:
    """Describe a graph input/output: containers (outermost first) around a tensor type."""
    t, kinds = v.type, []
    while isinstance(t, (SequenceType, OptionalType)):
        kinds.append("sequence" if isinstance(t, SequenceType) else "optional")
        t = t.elem
    kind = "<".join(kinds) + ">" * (len(kinds) - 1) if kinds else "tensor"
    if not isinstance(t, TensorType):
        return TensorSpec(v.name, "unknown", None, kind)
    return TensorSpec(v.name, t.dtype.name, t.shape, kind)


class InterpretedModel(CompiledModel):
    """target="interpreter": the NumPy reference run node by node."""

    def __init__(self, graph: Graph):
        from kiln.interpreter import Interpreter  # noqa: PLC0415
        super().__init__([spec_of(v) for v in graph.inputs], [spec_of(v) for v in graph.outputs],
                         "interpreter")
        self.graph = graph
        self._interp = Interpreter(graph)

    def _run(self, inputs: list) -> list:
        return self._interp.run(inputs)


def _report(optimized: Optimized, compiled, times: StageTimes | None = None) -> Any:
    """The CompileReport: the passes, compile time per stage, and for the cpu target the
    first module built."""
    from kiln.passes import CompileReport  # noqa: PLC0415
    shapes = getattr(compiled, "shapes", None)
    r = CompileReport(optimized.level, optimized.stats,
                      per_shape=compiled is not None and optimized.source is not None and shapes == "specialize",
                      shapes=shapes, shapes_reason=getattr(compiled, "shapes_reason", None), stage_times=times)
    if shapes in ("generic", "tiered"):
        info = compiled.module.info
        r.fused_groups, r.kernels = list(info["calls"]), len(info["calls"])
        r.why_not_fused = list(info["why_not_fused"])
        if info.get("findings"):     # one module: its choices hold for every value of the symbols
            r.shape_findings.append((tuple(tuple(s.shape) for s in compiled.inputs), list(info["findings"])))
        return r
    info = compiled.build_info() if compiled is not None else None
    if info is not None:
        built = Built.of(info)
        r.fused_groups = list(built.calls)
        r.why_not_fused = list(built.why_not_fused)
        r.kernels = len(built.calls)
        r.arena_bytes = built.arena_bytes
        r.intermediate_bytes = built.intermediate_bytes
        r.arena_peak_live_bytes = built.arena_peak_live_bytes
        r.inplace_kernels = built.inplace_kernels
    return r
