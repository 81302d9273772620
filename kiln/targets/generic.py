"""target="cpu", shapes="generic": one native module for every value of the symbolic dims.

Built at compile time (kiln.compiler.generic); a new input shape costs one arena plan
(kept per shape by the module), no specialisation and no C compiler run.
"""

from __future__ import annotations

from kiln.runtime.model import CompiledModel, TensorSpec


class GenericModel(CompiledModel):
    shapes = "generic"
    shapes_reason = None

    def __init__(self, module, optimized, inputs: list[TensorSpec], outputs: list[TensorSpec]):
        """`module`: a kiln.runtime.generic.GenericModule of `optimized`'s graph."""
        super().__init__(inputs, outputs, "cpu")
        self.module = module
        self.graph = optimized.graph
        self.cpu = optimized.target

    @property
    def specializations(self) -> int:
        """Native modules built: one, whatever the shapes it has run."""
        return 1

    def build_info(self) -> dict | None:
        return None

    def _run(self, inputs: list) -> list:
        return self.module(inputs)
