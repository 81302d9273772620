"""What `kiln inspect` reports about a model, as plain data (the CLI renders it).

Gathered in steps that need progressively more of the compiler, so a model
kiln cannot fully handle still gets every fact that can be known: the file's
facts and op histogram need only the import (no type inference), and every
unsupported op is listed at once, with its node, before anything can fail.
"""

from __future__ import annotations

import inspect as _pyinspect
import os
from collections import Counter
from dataclasses import dataclass, field

import kiln


@dataclass
class ModelFacts:
    file: str
    bytes: int
    ir_version: int
    producer: str
    opsets: dict[str, int]
    graph: object                                   # imported without type inference
    ops: Counter = field(default_factory=Counter)   # "domain::Op" or "Op" -> node count
    unsupported: list = field(default_factory=list)  # (domain, op, node, opset): kiln has no such op
    no_lowering: list = field(default_factory=list)  # (domain, op, node): target cpu cannot compile
    parameters: int = 0
    parameter_bytes: int = 0


def model_facts(path: str) -> ModelFacts:
    """Facts that need no type inference (so they exist even for unsupported models)."""
    from kiln.frontends.onnx import load_onnx, read_model
    from kiln.lower.module import missing_lowerings
    from kiln.ops.infer import unsupported_ops
    proto, _ = read_model(path)
    graph = load_onnx(path, infer=False)
    facts = ModelFacts(os.path.basename(path), os.path.getsize(path), proto.ir_version,
                       " ".join(filter(None, [proto.producer_name, proto.producer_version])),
                       {(o.domain or "ai.onnx"): o.version for o in proto.opset_import}, graph)
    facts.ops = Counter(n.qualified_op for _, n in graph.walk())
    facts.unsupported = unsupported_ops(graph)
    facts.no_lowering = missing_lowerings(graph)
    consts = graph.constants()
    facts.parameters = sum(int(v.const.size) for v in consts)
    facts.parameter_bytes = sum(int(v.const.nbytes) for v in consts)
    return facts


@dataclass
class KernelReport:
    kernels: list[str]          # one per native kernel: the node(s) it computes
    weights_bytes: int
    workspace_bytes: int
    shapes: list[tuple]         # the input shapes it was built for
    report: object = None       # kiln.compile(..., report=True)'s report, where kiln has one

    @property
    def fused(self) -> list[str]:
        """Kernels that compute more than one node."""
        return [k for k in self.kernels if " + " in k]


def kernel_report(graph, opt_level: int | None, dims: dict[str, int]) -> KernelReport:
    """Compile `graph` for cpu and describe the one native module it runs."""
    from kiln.export import bind_shapes, native_module
    options = {} if opt_level is None else {"opt_level": opt_level}
    if "report" in _pyinspect.signature(kiln.compile).parameters:
        options["report"] = True
    model = kiln.compile(graph, target="cpu", **options)
    shapes = bind_shapes(model, dims)
    native = native_module(model, shapes)
    return KernelReport(list(native.call_nodes), int(native.weights.size), native.workspace_bytes,
                        shapes, getattr(model, "report", None))


def io_specs(path: str):
    """Inputs and outputs with inferred types (a KilnError if the model cannot be typed)."""
    from kiln.compiler import spec_of
    graph = kiln.load_onnx(path)
    return graph, [spec_of(v) for v in graph.inputs], [spec_of(v) for v in graph.outputs]


def declared_specs(graph):
    """Inputs and outputs as declared (for a graph that could not be typed)."""
    from kiln.compiler import spec_of
    return [spec_of(v) for v in graph.inputs], [spec_of(v) for v in graph.outputs if v.type is not None]
