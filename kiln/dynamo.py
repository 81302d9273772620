"""`torch.compile(model, backend="kiln")`: kiln as a TorchDynamo backend.

Registered through the `torch_dynamo_backends` entry point (pyproject.toml), so
no import is needed. Dynamo hands over one FX graph per captured region; graph
breaks run in eager torch between them. On a graph's first call with a new
signature, kiln.frontends.torch_dynamo translates it to a kiln Graph
(`translate_call`: exported with Dynamo's symbolic dims, so one kiln compile
serves every size Dynamo's guards admit) and `kiln.compile` compiles that graph;
a call outside what a compile assumed (`Signature`: a static dim torch.export
specialised, another dtype, a changed parameter) compiles once more, cached.

The backend sits above the pipeline (it calls `kiln.compile`), the translation
below it (a frontend hands the pipeline a Graph and never calls it back).

Inference only: a graph called with autograd recording (grad mode on and a
tensor that requires grad) raises a KilnError naming the fix.
"""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree

from kiln.compiler import compile as kiln_compile
from kiln.errors import KilnError
from kiln.frontends.torch import from_array, to_array
from kiln.frontends.torch_dynamo import (check_inference, constant_inputs, placeholders, translate_call,
                                         wrapped_scalar)
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


class KilnGraph:
    """One Dynamo graph: kiln compiles once per input signature (`Signature`), cached.

    Dims that Dynamo made symbolic (dynamic=True, mark_dynamic, or its automatic dynamic
    shapes) are exported as symbolic dims and stay kiln symbols, so one kiln compile
    serves every size Dynamo's guards let through."""

    def __init__(self, gm: torch.fx.GraphModule, const: list[bool], options: dict):
        self.gm = gm
        self.const = const
        self.scalars = [wrapped_scalar(ph) for ph in placeholders(gm)]  # (Dynamo drops grapharg later)
        self.options = options
        self.entries: list[tuple] = []  # (Signature, compiled, out spec, fed arg indices)
        self.compiles = 0  # kiln compiles made (tests read it: no recompile for a shape seen before)

    def __call__(self, *args):
        check_inference(args)
        entry = next((e for e in self.entries if e[0].matches(args)), None)
        if entry is None:
            entry = self.compile(args)
            self.entries.append(entry)
        _, compiled, spec, feed = entry
        outs = compiled(*[to_array(args[i]) for i in feed]) if feed else compiled()
        outs = list(outs) if isinstance(outs, tuple) else [outs]
        return pytree.tree_unflatten([from_array(o) for o in outs], spec)

    def compile(self, args) -> tuple:
        captured = translate_call(self.gm, args, self.const, self.scalars)
        compiled = kiln_compile(captured.graph, **self.options)
        self.compiles += 1
        return captured.signature, compiled, captured.out_spec, captured.feed


def register() -> None:
    """Register the backend by hand (the entry point does it for an installed kiln; an install
    whose entry point is out of date, naming a function that moved, is overridden)."""
    from torch._dynamo import register_backend
    from torch._dynamo.backends.registry import lookup_backend
    try:
        if lookup_backend("kiln") is kiln_backend:
            return
    except Exception:  # noqa: BLE001 - not registered, or its entry point no longer loads
        pass
    register_backend(name="kiln")(kiln_backend)
