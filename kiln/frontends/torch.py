"""torch.nn.Module → kiln Graph through torch.export (no ONNX detour), and the compiled model
that takes and returns torch tensors.

`export_module` runs torch.export, decomposes to the core ATen op set and
translates the graph (`torch_fx.Translator`, ops in `torch_ops.py`):
parameters, buffers and constants become kiln constants; each
`torch.export.Dim` becomes a kiln symbol of the same name; the outputs'
structure (tensor, tuple, dict) is kept by `TorchModel`.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree

from kiln.errors import KilnError
from kiln.frontends.torch_fx import STAGE, Translator, kiln_dtype, numpy_view, tensor_view, to_numpy
from kiln.graph.ir import Graph


def is_torch_model(model: Any) -> bool:
    return isinstance(model, (torch.nn.Module, torch.export.ExportedProgram))


def export_module(module, example_inputs=None, dynamic_shapes=None, kwargs=None):
    """torch.export a module and translate it; returns (Graph, output TreeSpec)."""
    if isinstance(module, torch.export.ExportedProgram):
        ep, args = module, None
    else:
        if example_inputs is None:
            raise KilnError("compiling a torch module needs example_inputs=(tensor, ...) to trace it",
                            stage=STAGE)
        args = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
        was_training = module.training
        module.eval()
        try:
            ep = torch.export.export(module, args, kwargs=kwargs, dynamic_shapes=dynamic_shapes)
        except Exception as e:
            raise KilnError(f"torch.export failed: {type(e).__name__}: {str(e).strip()[:2000]}",
                            stage=STAGE) from e
        finally:
            module.train(was_training)
    names = dim_names(ep, module, args, dynamic_shapes)
    ep = ep.run_decompositions()
    return translate_exported(ep, names), ep.call_spec.out_spec


def dim_names(ep, module, args, dynamic_shapes) -> dict[str, str]:
    """{torch symbol ('s0'): the name of the torch.export.Dim the user gave it}."""
    if not dynamic_shapes or args is None:
        return {}
    specs = dynamic_shapes
    if isinstance(specs, dict):
        params = list(inspect.signature(module.forward).parameters)
        specs = [specs.get(p) for p in params[:len(args)]]
    user = [n for n in ep.graph.nodes if n.op == "placeholder"
            and n.name in _user_input_names(ep)]
    flat_specs = []
    for arg, spec in zip(args, specs):
        leaves = pytree.tree_leaves(arg)
        if isinstance(arg, torch.Tensor) or len(leaves) <= 1:
            flat_specs.append(spec)
        else:
            flat_specs.extend([None] * len(leaves))  # nested inputs: symbols keep torch's names
    out = {}
    for node, spec in zip(user, flat_specs):
        if spec is None:
            continue
        items = spec.items() if isinstance(spec, dict) else enumerate(spec)
        shape = node.meta["val"].shape
        for axis, dim in items:
            name = getattr(dim, "__name__", None)
            if dim is None or name is None or axis >= len(shape):
                continue
            sym = str(shape[axis])
            if re.fullmatch(r"[su]\d+", sym):
                out[sym] = name
    return out


def _user_input_names(ep) -> set[str]:
    from torch.export.graph_signature import InputKind
    return {s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT}


def translate_exported(ep, names: dict[str, str] | None = None, fixed: list | None = None) -> Graph:
    """An ExportedProgram (core ATen) → kiln Graph (user inputs in order, user outputs flat).

    `fixed` (Dynamo's path) gives, per user input, None for a graph input, or a tensor to
    make a constant (a parameter Dynamo passed as an input), or a python number."""
    from torch.export.graph_signature import InputKind, OutputKind
    from kiln.frontends.torch_ops import TABLE
    names = names or {}
    gm = ep.graph_module
    tr = Translator(gm, TABLE, name=type(ep).__name__)
    tr.check()
    values = {}
    placeholders = {n.name: n for n in gm.graph.nodes if n.op == "placeholder"}
    k = -1
    for spec in ep.graph_signature.input_specs:
        node = placeholders[spec.arg.name]
        if spec.kind == InputKind.USER_INPUT:
            k += 1
            val = node.meta.get("val")
            if fixed is not None and fixed[k] is not None:
                f = fixed[k]
                values[node] = tr.b.const(to_numpy(f)) if isinstance(f, torch.Tensor) else f
                continue
            if not isinstance(val, torch.Tensor):
                raise KilnError(f"input {spec.arg.name!r} is a {type(val).__name__}; kiln takes tensor "
                                "inputs (non-tensor arguments are fixed at export time)", stage=STAGE)
            shape = tuple(int(d) if isinstance(d, int) or not _symbolic(d) else _symbol(d, names)
                          for d in val.shape)
            values[node] = tr.b.input(spec.arg.name, kiln_dtype(val.dtype), shape)
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            data = ep.state_dict.get(spec.target) if spec.target in ep.state_dict else ep.constants.get(spec.target)
            if data is None:
                raise KilnError(f"{spec.kind.name.lower()} {spec.target!r} has no data", stage=STAGE)
            values[node] = tr.b.const(to_numpy(data))
            values[node].name = spec.target
        else:
            raise KilnError(f"input {spec.arg.name!r} of kind {spec.kind.name} is not supported",
                            stage=STAGE)
    outs = pytree.tree_leaves(tr.run(values), is_leaf=lambda x: x is None)
    kinds = [s.kind for s in ep.graph_signature.output_specs]
    user = [v for v, k in zip(outs, kinds) if k == OutputKind.USER_OUTPUT]
    if len(user) != len(kinds):
        raise KilnError("the module mutates its inputs or buffers in forward; kiln compiles "
                        "inference graphs without side effects (call model.eval())", stage=STAGE)
    return finish(tr, user)


def finish(tr: Translator, outputs: list) -> Graph:
    """Set the graph's outputs: python numbers become constants, a value output twice or an
    input returned as is gets an Identity (each graph output is its own value)."""
    from kiln.frontends.torch_fx import SymInt
    g = tr.b.graph
    seen = set()
    for i, v in enumerate(outputs):
        if isinstance(v, SymInt):
            v = v.value
        elif not hasattr(v, "type"):
            if v is None:
                raise KilnError(f"output {i} is None; kiln models return tensors", stage=STAGE)
            v = tr.b.const(np.asarray(v))
        if v.id in seen or v.is_const or any(v is x for x in g.inputs):
            v = tr.b.op("Identity", [v])
        seen.add(v.id)
        v.name = f"output_{i}"
        g.outputs.append(v)
    return g


def _symbolic(d) -> bool:
    return isinstance(d, torch.SymInt) and not d.node.expr.is_number


def _symbol(d, names: dict[str, str]) -> str:
    s = str(d.node.expr)
    return names.get(s, re.sub(r"\W+", "_", s))


class TorchModel:
    """A compiled torch module: call it like the module, on torch tensors or numpy arrays.

    Tensors go in as numpy views (no copy for CPU tensors) and results come back
    as `torch.from_numpy` views of kiln's output arrays, in the module's output
    structure. Numpy inputs give numpy outputs.
    """

    def __init__(self, compiled, out_spec, graph: Graph):
        self.compiled = compiled
        self.out_spec = out_spec
        self.graph = graph

    @property
    def inputs(self):
        return self.compiled.inputs

    @property
    def outputs(self):
        return self.compiled.outputs

    def __repr__(self) -> str:
        return f"<TorchModel {self.compiled!r}>"

    def __call__(self, *args, **kwargs):
        flat = pytree.tree_leaves((args, kwargs))
        as_torch = any(isinstance(a, torch.Tensor) for a in flat)
        arrays = [to_array(a) for a in flat]
        outs = self.compiled(*arrays)
        outs = list(outs) if isinstance(outs, tuple) else [outs]
        if as_torch:
            outs = [from_array(o) for o in outs]
        return pytree.tree_unflatten(outs, self.out_spec) if self.out_spec is not None else outs

    def run(self, *args, **kw):
        return self.compiled.run(*args, **kw)

    def wait_optimized(self, timeout: float | None = None) -> "TorchModel":
        """kiln.runtime.model.CompiledModel.wait_optimized: the optimised build is serving."""
        self.compiled.wait_optimized(timeout)
        return self


def to_array(a) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        if a.requires_grad:
            a = a.detach()
        if a.device.type != "cpu":
            a = a.cpu()
        return numpy_view(a.resolve_conj().resolve_neg())
    return a


def from_array(a) -> torch.Tensor:
    a = np.asarray(a)
    if not a.flags.writeable or not a.flags.aligned or a.dtype.byteorder not in "=|":
        a = np.array(a)
    return tensor_view(a)
