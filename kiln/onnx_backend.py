"""kiln as an `onnx.backend.base.Backend`, so ONNX's backend test suite can drive it.

The target defaults to "cpu"; the environment variable `KILN_TARGET` overrides
the default, and `prepare(model, target=...)` overrides both. Likewise
`KILN_OPT_LEVEL` (0-3) sets the graph optimization level unless `prepare` is
given `opt_level=` (default: kiln.compile's).
"""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

import kiln


def default_target() -> str:
    return os.environ.get("KILN_TARGET", "cpu")


def opt_level_options() -> dict:
    """{"opt_level": n} when KILN_OPT_LEVEL is set, else nothing (kiln.compile's default)."""
    level = os.environ.get("KILN_OPT_LEVEL", "").strip()
    if not level:
        return {}
    if not level.isdigit():
        raise kiln.KilnError(f"KILN_OPT_LEVEL must be an optimization level 0-3, got {level!r}")
    return {"opt_level": int(level)}


class KilnRep(BackendRep):
    def __init__(self, compiled: kiln.CompiledModel):
        self.compiled = compiled

    def run(self, inputs, **kwargs):
        if isinstance(inputs, dict):
            feeds = inputs
        else:
            if isinstance(inputs, np.ndarray) and len(self.compiled.inputs) == 1:
                inputs = [inputs]
            feeds = {s.name: x for s, x in zip(self.compiled.inputs, inputs)}
        return tuple(self.compiled.run(feeds).values())


class KilnBackend(Backend):
    @classmethod
    def is_compatible(cls, model, device: str = "CPU", **kwargs) -> bool:
        return device.upper() == "CPU"

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", target: str | None = None,
                **kwargs) -> KilnRep:
        if not cls.supports_device(device):
            raise kiln.KilnError(f"kiln does not support device {device!r}")
        return KilnRep(kiln.compile(model, target=target or default_target(),
                                    **{**opt_level_options(), **kwargs}))

    @classmethod
    def run_model(cls, model, inputs, device: str = "CPU", **kwargs):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs, device: str = "CPU", outputs_info=None,
                 **kwargs):
        """Wrap one node in a model whose input types come from the given arrays."""
        from onnx import helper
        ins = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.asarray(x).dtype),
                                             np.asarray(x).shape)
               for n, x in zip(node.input, inputs)]
        outs = [helper.make_value_info(n, onnx.TypeProto()) for n in node.output]
        opset = kwargs.pop("opset_version", onnx.defs.onnx_opset_version())
        g = helper.make_graph([node], "run_node", ins, outs)
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
        return cls.run_model(model, list(inputs), device, **kwargs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return str(device).upper().startswith("CPU")


prepare = KilnBackend.prepare
run_model = KilnBackend.run_model
run_node = KilnBackend.run_node
supports_device = KilnBackend.supports_device
