"""A Dynamo graph as a kiln Graph: what `torch.compile(model, backend="kiln")` (kiln.dynamo,
the backend itself) translates each captured region with.

Each graph is exported on its first call (non-strict torch.export, decomposed to core ATen
like `kiln.compile`'s path) and translated. The dims Dynamo made symbolic (dynamic=True,
mark_dynamic, or its automatic dynamic shapes after a second size) are exported as symbolic
dims and stay kiln symbols, and the sizes Dynamo passes as int inputs are read from the
tensors' shapes (`simplify_inputs`). `Signature` is what one compile assumes of its call (a
static dim torch.export specialised, a dtype, a parameter's identity and version).

Parameters and buffers (Dynamo passes them as graph inputs, `constant_inputs`) become kiln
constants. Inference only: `check_inference` refuses a graph called with autograd recording.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kiln.errors import KilnError
from kiln.frontends.torch import translate_exported
from kiln.frontends.torch_fx import STAGE
from kiln.graph.ir import Graph


def check_inference(args) -> None:
    if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
        raise KilnError("kiln compiles inference only, and this graph records autograd (grad mode is on "
                        "and an input or parameter requires grad): run the model under "
                        "torch.no_grad() or torch.inference_mode(), or set requires_grad_(False) "
                        "on its parameters", stage=STAGE)


def constant_inputs(gm: torch.fx.GraphModule) -> list[bool]:
    """Which graph inputs are a module's parameters or buffers (become kiln constants)."""
    from torch._dynamo.source import is_from_unspecialized_param_buffer_source
    out = []
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        ga = n.meta.get("grapharg")
        src = getattr(ga, "source", None)
        out.append(src is not None and (type(src).__name__ in ("ParamBufferSource", "UnspecializedParamBufferSource")
                                        or is_from_unspecialized_param_buffer_source(src)))
    return out


@dataclass
class Captured:
    """One call of a Dynamo graph, translated: the kiln Graph to compile, what that compile
    assumes of later calls, the output structure, and which call arguments it is fed."""
    graph: Graph
    signature: "Signature"
    out_spec: Any                # torch.utils._pytree spec of the outputs
    feed: list                   # indices of the call's arguments the graph takes, in order


def translate_call(gm: torch.fx.GraphModule, args, const: list[bool], scalars: list[bool]) -> Captured:
    """`gm` for these call arguments as a kiln Graph (`const`: which arguments are parameters or
    buffers, `constant_inputs`; `scalars`: which are Python numbers Dynamo wrapped in a 0-d
    tensor, `wrapped_scalar`): inputs simplified, exported with Dynamo's symbolic dims,
    translated, parameters and Python values baked in as constants."""
    gm, kept, values = simplify_inputs(gm, args, scalars)
    args_k = [args[i] for i in kept]
    const_k = [const[i] for i in kept]
    dims = [symbolic_axes(ph) if isinstance(a, torch.Tensor) and not c else None
            for ph, a, c in zip(placeholders(gm), args_k, const_k)]
    ep = export_graph(gm, args_k, dims)
    fixed = [a if c or not isinstance(a, torch.Tensor) else None for a, c in zip(args_k, const_k)]
    graph = translate_exported(ep, fixed=fixed)
    feed = [kept[i] for i, f in enumerate(fixed) if f is None]
    sig = Signature.of(args, const, kept, {i: v.type.shape for i, v in zip(feed, graph.inputs)}, values)
    return Captured(graph, sig, ep.call_spec.out_spec, feed)


class Signature:
    """What a compiled graph assumes of its call: per fed tensor its dtype and kiln shape (ints,
    and symbols that must bind consistently), per constant (parameter) its identity and version
    (an in-place update or another module instance compiles afresh), per python number its value
    (also of a number Dynamo wraps in a 0-d tensor).
    Sizes Dynamo passes as ints but kiln reads from a tensor's shape are not part of it."""

    def __init__(self, items: list):
        self.items = items  # (arg index, kind, expected)

    @classmethod
    def of(cls, args, const, kept, shapes, values) -> "Signature":
        items = [(i, "scalar", v) for i, v in values.items()]
        for i in kept:
            a = args[i]
            if i in shapes:
                items.append((i, "shape", (a.dtype, tuple(shapes[i]))))
            elif isinstance(a, torch.Tensor):
                items.append((i, "const" if const[i] else "tensor", (id(a), a._version)))
            else:
                items.append((i, "value", a))
        return cls(items)

    def matches(self, args) -> bool:
        bound: dict = {}
        for i, kind, want in self.items:
            a = args[i]
            if kind == "shape":
                dtype, shape = want
                if not isinstance(a, torch.Tensor) or a.dtype != dtype or a.dim() != len(shape):
                    return False
                for d, w in zip(a.shape, shape):
                    if isinstance(w, int):
                        if d != w:
                            return False
                    elif bound.setdefault(w, d) != d:
                        return False
            elif kind in ("const", "tensor"):
                if not isinstance(a, torch.Tensor) or (id(a), a._version) != want:
                    return False
            elif kind == "scalar":
                if not isinstance(a, torch.Tensor) or a.item() != want:
                    return False
            elif a != want or type(a) is not type(want):
                return False
        return True


def placeholders(gm: torch.fx.GraphModule) -> list:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def _example(n):
    return n.meta.get("example_value", n.meta.get("val"))


def symbolic_axes(ph) -> dict | None:
    """{axis: Dim.AUTO} for the dims of a Dynamo graph input that Dynamo made symbolic."""
    v = _example(ph)
    if not isinstance(v, torch.Tensor):
        return None
    axes = {a: torch.export.Dim.AUTO for a, d in enumerate(v.shape)
            if isinstance(d, torch.SymInt) and not d.node.expr.is_number}
    return axes or None


def _is_item(n) -> bool:
    return (n.op == "call_method" and n.target == "item") or \
        (n.op == "call_function" and n.target in (torch.ops.aten.item.default, torch.Tensor.item))


def wrapped_scalar(ph) -> bool:
    """A python number Dynamo passes as a 0-d tensor (dynamic=True leaves floats such as a
    LayerNorm's eps unspecialised); the graph reads it with .item()."""
    ga = ph.meta.get("grapharg")
    return bool(getattr(ga, "pass_arg_as_tensor", False))


def simplify_inputs(gm: torch.fx.GraphModule, args, scalars: list[bool]):
    """A copy of `gm` that takes fewer non-tensor inputs; the indices of the inputs it keeps;
    the values it fixed ({input index: python number}).

    A size input (a SymInt placeholder that Dynamo passes next to the tensor it measures)
    is read from that tensor's shape, so it stays symbolic and kiln's graph takes tensors
    only. A wrapped python number's `.item()` becomes its value in this call (kiln
    specialises on it: `Signature` holds the value)."""
    phs = placeholders(gm)
    dims = {}
    for ph in phs:
        v = _example(ph)
        if isinstance(v, torch.Tensor):
            for a, d in enumerate(v.shape):
                if isinstance(d, torch.SymInt) and not d.node.expr.is_number:
                    dims.setdefault(d.node.expr, (ph, a))
    sizes = {ph: dims[_example(ph).node.expr] for ph in phs
             if isinstance(_example(ph), torch.SymInt) and _example(ph).node.expr in dims}
    values = {k: args[k].item() for k, ph in enumerate(phs)
              if scalars[k] and any(_is_item(u) for u in ph.users)}
    items = {u: values[k] for k, ph in enumerate(phs) if k in values for u in ph.users if _is_item(u)}
    if not sizes and not items:
        return gm, list(range(len(phs))), {}
    dropped = set(sizes) | {ph for k, ph in enumerate(phs) if k in values and all(u in items for u in ph.users)}
    g = torch.fx.Graph()
    env = dict(items)
    last = [ph for ph in phs if ph not in dropped][-1] if len(dropped) < len(phs) else None
    for n in gm.graph.nodes:
        if n in dropped or n in items:
            continue
        env[n] = g.node_copy(n, lambda x: env[x])
        if n is last:
            for ph, (src, axis) in sizes.items():
                env[ph] = g.call_function(torch.ops.aten.sym_size.int, (env[src], axis))
    return torch.fx.GraphModule(gm, g), [k for k, ph in enumerate(phs) if ph not in dropped], values


def export_graph(gm: torch.fx.GraphModule, args, dynamic: list | None = None):
    """`gm` exported with these inputs (torch.export, non-strict: no second Dynamo trace),
    its symbolic dims as `dynamic` says, and decomposed to core ATen as kiln.compile does."""
    shapes = tuple(dynamic) if dynamic and any(d is not None for d in dynamic) else None
    with torch.no_grad():
        try:
            return torch.export.export(gm, tuple(args), dynamic_shapes=shapes, strict=False).run_decompositions()
        except Exception as e:
            raise KilnError(f"exporting the Dynamo graph failed: {type(e).__name__}: "
                            f"{str(e).strip()[:2000]}", stage=STAGE) from e


def __getattr__(name: str):
    """An install whose entry point still names this module's old `kiln_backend` (it moved to
    kiln.dynamo, which compiles; this module only translates) is told how to refresh it."""
    if name == "kiln_backend":
        raise AttributeError("kiln's Dynamo backend is kiln.dynamo:kiln_backend; this install's "
                             "`torch_dynamo_backends` entry point is out of date: reinstall kiln "
                             "(pip install -e .), or call kiln.dynamo.register()")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
