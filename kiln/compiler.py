"""`kiln.compile`: the one readable pipeline, frontend → (passes → lower → codegen) → runtime."""

from __future__ import annotations

import os
from typing import Any

from kiln.errors import KilnError
from kiln.graph.ir import Graph, Value
from kiln.graph.types import OptionalType, SequenceType, TensorType
from kiln.limits import Limits
from kiln.limits import use as use_limits
from kiln.runtime.model import CompiledModel, TensorSpec

TARGETS = ("interpreter", "cpu")


def to_graph(model: Any) -> Graph:
    """Accept a path, bytes, an onnx.ModelProto or a Graph; return a typed Graph."""
    if isinstance(model, Graph):
        return model
    from kiln.frontends.onnx import load_onnx  # noqa: PLC0415
    if isinstance(model, (str, os.PathLike, bytes)) or type(model).__name__ == "ModelProto":
        return load_onnx(model)
    raise KilnError(f"cannot compile a {type(model).__name__}: pass a path to an .onnx file, "
                    "an onnx.ModelProto or a kiln Graph")


def compile(model: Any, target: Any = "cpu", *, cpu: Any = None, opt_level: int | None = None,  # noqa: A001
            report: bool = False, limits: Limits | dict | None = None, example_inputs=None,
            dynamic_shapes=None, **options) -> CompiledModel:
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
    a Limits, or a dict overriding some of the defaults), at compile and run time.
    """
    target, cpu = _split_target(target, cpu)
    if options:
        raise KilnError(f"unknown compile option(s) {sorted(options)}")
    if opt_level is None:
        from kiln.passes.pipeline import DEFAULT_LEVEL  # noqa: PLC0415
        opt_level = DEFAULT_LEVEL
    if _is_torch(model):
        from kiln.frontends.torch import compile_torch  # noqa: PLC0415
        return compile_torch(model, target, example_inputs=example_inputs, dynamic_shapes=dynamic_shapes,
                             opt_level=opt_level, report=report, limits=limits, cpu=cpu)
    if example_inputs is not None or dynamic_shapes is not None:
        raise KilnError("example_inputs and dynamic_shapes are for torch modules; an ONNX model "
                        "declares its own input shapes")
    lim = Limits.of(limits)
    with use_limits(lim):
        compiled = _compile(model, target, opt_level, report, cpu)
    compiled.limits = lim
    return compiled


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


def _compile(model: Any, target: str, opt_level: int, report: bool, cpu=None) -> CompiledModel:
    from kiln.passes import CompileReport, run_passes  # noqa: PLC0415
    from kiln.targets.target import Target  # noqa: PLC0415
    cpu = Target.of(cpu)    # the one place the host is asked (when no CPU was named)
    source = to_graph(model)
    graph, stats = run_passes(source, opt_level, target=cpu)
    if target == "interpreter":
        compiled = InterpretedModel(graph)
    else:
        from kiln.targets.cpu import CpuModel
        compiled = CpuModel(graph, [spec_of(v) for v in graph.inputs], [spec_of(v) for v in graph.outputs],
                            source, opt_level, cpu)
    if report:
        compiled.report = CompileReport(opt_level, stats,
                                        per_shape=getattr(compiled, "program", None) is not None
                                        and compiled.program.reoptimize is not None)
        info = compiled.build_info() if target == "cpu" else None
        if info is not None:
            r = compiled.report
            r.fused_groups = list(info["calls"])
            r.why_not_fused = list(info.get("why_not_fused", []))
            r.kernels = len(info["calls"])
            r.arena_bytes = info.get("arena_bytes")
            r.intermediate_bytes = info.get("intermediate_bytes")
            r.arena_peak_live_bytes = info.get("arena_peak_live_bytes")
            r.inplace_kernels = info.get("inplace_kernels")
    return compiled


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
        from kiln.interpreter import Interpreter
        super().__init__([spec_of(v) for v in graph.inputs], [spec_of(v) for v in graph.outputs],
                         "interpreter")
        self.graph = graph
        self._interp = Interpreter(graph)

    def _run(self, inputs: list) -> list:
        return self._interp.run(inputs)

