"""`torch.compile(model, backend="kiln")`: kiln as a TorchDynamo backend.

Registered through the `torch_dynamo_backends` entry point (pyproject.toml), so
no import is needed. Dynamo hands over one FX graph per captured region;
graph breaks run in eager torch between them. For each graph, kiln
specialises and caches: on a call with input shapes (and values of symbolic
ints) it has not seen, the graph is exported with those shapes (non-strict
torch.export, decomposed to core ATen like `kiln.compile`'s path), translated
and compiled; a later call with those shapes reuses it.
So Dynamo's dynamic shapes never make Dynamo recompile, and returning to an
earlier shape compiles nothing.

Parameters and buffers (Dynamo passes them as graph inputs) become kiln
constants, and the cache key holds their identity and version counter, so an
in-place update or another module instance gets a fresh compile.

Inference only: a graph called with autograd recording (grad mode on and a
tensor that requires grad) raises a KilnError naming the fix.
"""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree

from kiln.errors import KilnError
from kiln.frontends.torch_fx import STAGE

_OPTIONS = ("target", "opt_level", "limits")


def kiln_backend(gm: torch.fx.GraphModule, example_inputs, **options):
    """The Dynamo backend: returns a callable that runs `gm` through kiln."""
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise KilnError(f"unknown kiln backend option(s) {unknown}; it takes {list(_OPTIONS)} "
                        "(torch.compile(..., backend='kiln', options={...}))", stage=STAGE)
    check_inference(example_inputs)
    return KilnGraph(gm, constant_inputs(gm), options)


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


class KilnGraph:
    """One Dynamo graph: kiln compiles per input signature, cached."""

    def __init__(self, gm: torch.fx.GraphModule, const: list[bool], options: dict):
        self.gm = gm
        self.const = const
        self.options = options
        self.cache: dict[tuple, tuple] = {}
        self.compiles = 0  # kiln compiles made (tests read it: no recompile for a shape seen before)

    def key(self, args) -> tuple:
        k = []
        for a, c in zip(args, self.const):
            if isinstance(a, torch.Tensor):
                k.append((id(a), a._version) if c else (tuple(a.shape), a.dtype))
            else:
                k.append(a)
        return tuple(k)

    def __call__(self, *args):
        check_inference(args)
        key = self.key(args)
        entry = self.cache.get(key)
        if entry is None:
            entry = self.cache[key] = self.compile(args)
        compiled, spec, feed = entry
        from kiln.frontends.torch import from_array, to_array
        outs = compiled(*[to_array(args[i]) for i in feed]) if feed else compiled()
        outs = list(outs) if isinstance(outs, tuple) else [outs]
        return pytree.tree_unflatten([from_array(o) for o in outs], spec)

    def compile(self, args) -> tuple:
        from kiln.compiler import compile as kiln_compile
        from kiln.frontends.torch import translate_exported
        ep = export_graph(self.gm, args)
        fixed = [a if c or not isinstance(a, torch.Tensor) else None for a, c in zip(args, self.const)]
        graph = translate_exported(ep, fixed=fixed)
        compiled = kiln_compile(graph, **self.options)
        self.compiles += 1
        feed = [i for i, f in enumerate(fixed) if f is None]
        return compiled, ep.call_spec.out_spec, feed


def export_graph(gm: torch.fx.GraphModule, args):
    """`gm` exported with these concrete inputs (torch.export, non-strict: no second Dynamo
    trace) and decomposed to core ATen, as kiln.compile does for a module."""
    with torch.no_grad():
        try:
            return torch.export.export(gm, tuple(args), strict=False).run_decompositions()
        except Exception as e:
            raise KilnError(f"exporting the Dynamo graph failed: {type(e).__name__}: "
                            f"{str(e).strip()[:2000]}", stage=STAGE) from e


def register() -> None:
    """Register the backend by hand (the entry point does it for an installed kiln)."""
    from torch._dynamo import list_backends, register_backend
    if "kiln" not in list_backends(exclude_tags=()):
        register_backend(name="kiln")(kiln_backend)

