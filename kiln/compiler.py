"""`kiln.compile`: the one readable pipeline, frontend → (passes → lower → codegen) → runtime."""

from __future__ import annotations

import os
from typing import Any

from kiln.errors import KilnError
from kiln.graph.ir import Graph, Value
from kiln.graph.types import OptionalType, SequenceType, TensorType
from kiln.runtime.model import CompiledModel, TensorSpec

TARGETS = ("interpreter", "cpu")


def to_graph(model: Any) -> Graph:
    """Accept a path, bytes, an onnx.ModelProto or a Graph; return a typed Graph."""
    if isinstance(model, Graph):
        return model
    from kiln.frontends.onnx import load_onnx
    if isinstance(model, (str, os.PathLike, bytes)) or type(model).__name__ == "ModelProto":
        return load_onnx(model)
    raise KilnError(f"cannot compile a {type(model).__name__}: pass a path to an .onnx file, "
                    "an onnx.ModelProto or a kiln Graph")


def compile(model: Any, target: str = "cpu", **options) -> CompiledModel:  # noqa: A001
    """Compile a model for `target` and return a runnable CompiledModel."""
    if target not in TARGETS:
        raise KilnError(f"unknown target {target!r}; choose one of {list(TARGETS)}")
    if options:
        raise KilnError(f"unknown compile option(s) {sorted(options)}")
    graph = to_graph(model)
    if target == "interpreter":
        return InterpretedModel(graph)
    return CpuModel(graph)


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


class CpuModel(CompiledModel):
    """target="cpu": every node a native kernel in one module, one call per inference.

    Kernels are specialised to concrete shapes: a model with static input shapes
    is built here, at compile time; one with symbolic dims at its first run with
    new shapes, and cached per shape (and per value of shape-giving inputs).
    """

    def __init__(self, graph: Graph):
        from kiln.lower.module import check_lowerable
        super().__init__([spec_of(v) for v in graph.inputs], [spec_of(v) for v in graph.outputs], "cpu")
        check_lowerable(graph)
        self.graph = graph
        self._cache: dict = {}
        self._value_inputs: dict = {}
        specs = self.inputs
        if all(s.kind == "tensor" and s.shape is not None and all(isinstance(d, int) for d in s.shape)
               for s in specs):
            from kiln.lower.specialize import dynamic_values
            shapes = tuple(tuple(s.shape) for s in specs)
            g, known = _specialize(graph, shapes, {})
            if not dynamic_values(g):
                self._value_inputs[shapes] = ()
                self._cache[(shapes, ())] = _build(g, known)

    @property
    def specializations(self) -> int:
        """How many native modules have been built (one per shape / shape-value key)."""
        return len(self._cache)

    def _module_for(self, inputs: list):
        from kiln.lower.specialize import dynamic_values, require_static, value_inputs
        shapes = tuple(tuple(x.shape) for x in inputs)
        vidx = self._value_inputs.get(shapes)
        if vidx is None:
            g, known = _specialize(self.graph, shapes, {})
            if not dynamic_values(g):
                self._value_inputs[shapes] = ()
                self._cache[(shapes, ())] = _build(g, known)
                return self._cache[(shapes, ())]
            vidx = self._value_inputs[shapes] = value_inputs(inputs)
        key = (shapes, tuple((inputs[i].dtype.str, inputs[i].tobytes()) for i in vidx))
        mod = self._cache.get(key)
        if mod is None:
            g, known = _specialize(self.graph, shapes, {i: inputs[i] for i in vidx})
            require_static(g)
            mod = self._cache[key] = _build(g, known)
        return mod

    def _run(self, inputs: list) -> list:
        return self._module_for(inputs)(inputs)


def _specialize(graph: Graph, shapes, values):
    from kiln.lower.specialize import specialize
    return specialize(graph, list(shapes), values)


def _build(graph: Graph, known):
    from kiln.codegen import build_c, func_symbol
    from kiln.lower.module import ENTRY, lower_graph
    from kiln.runtime.native import NativeModule
    lm = lower_graph(graph, known)
    lib = build_c(lm.module)
    out_types = [(tuple(v.type.shape), v.type.dtype.name) for v in lm.outputs]
    return NativeModule(str(lib.path), func_symbol(ENTRY), out_types, lm.weights,
                        lm.workspace_bytes, lm.call_nodes)
