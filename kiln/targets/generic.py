"""target="cpu", shapes="generic": one native module for every value of the symbolic dims;
shapes="tiered": that module serves a new shape at once, while the module specialised to the
shape is built in the background and then takes over (JIT tiering, as language VMs do).

Built at compile time (kiln.compiler.generic); a new input shape costs one arena plan
(kept per shape by the module), no specialisation and no C compiler run on the caller's thread.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from kiln.runtime.generic import NotCovered
from kiln.runtime.model import CompiledModel, TensorSpec


class GenericModel(CompiledModel):
    shapes = "generic"

    def __init__(self, module, optimized, inputs: list[TensorSpec], outputs: list[TensorSpec], special):
        """`module`: a kiln.runtime.generic.GenericModule of `optimized`'s graph; `special`: the
        same graph specialised per shape (a kiln.targets.cpu.CpuModel), which runs the shapes
        the generic module does not (a symbol of 0: empty tensors; sizes outside a guard of
        kiln.lower.symbolic_shapes)."""
        super().__init__(inputs, outputs, "cpu")
        self.module = module
        self.special = special
        self.graph = optimized.graph
        self.cpu = optimized.target
        self.shapes_reason = self.why()

    def why(self) -> str:
        """What the report says of this model's shapes: one module, its run-time choices."""
        info = getattr(self.module, "info", None) or {}
        out = f"one module for every value of {', '.join(self.module.symbols)}"
        by_symbol: dict = {}
        for syms in info.get("variants", {}).values():
            for s in syms:
                by_symbol[s] = by_symbol.get(s, 0) + 1
        out += "".join(f"; {n} kernel(s) also built for {s} = 1 (register tiles, forks), picked at run time"
                       for s, n in by_symbol.items())
        tiles = info.get("row_tiles", {})
        if tiles:
            rows = sorted({m for ms in tiles.values() for m in ms})
            out += (f"; {len(tiles)} GEMM kernel(s) also built with register tiles of "
                    f"{'/'.join(map(str, rows))} rows, picked per call by the run-time row count")
        if info.get("guards"):
            out += (f"; {info['guards']} run-time guard(s) on its sizes (a shape outside them runs "
                    "specialised)")
        return out

    @property
    def specializations(self) -> int:
        """Native modules built: one, whatever the shapes it has run."""
        return 1

    def reserve(self, **sizes: int) -> int:
        """Make room now for the symbols' values `sizes` (`batch=8, seq=256`): the arena is
        planned and its memory mapped, so a new shape needing no more runs at once on its
        first use. Returns the workspace bytes."""
        missing = [s for s in self.module.symbols if s not in sizes]
        if missing or set(sizes) - set(self.module.symbols):
            from kiln.errors import KilnError  # noqa: PLC0415
            raise KilnError(f"reserve takes every symbol of {self.module.symbols}, given {sorted(sizes)}")
        return self.module.reserve(tuple(sizes[s] for s in self.module.symbols))

    def build_info(self) -> dict | None:
        return None

    def wait_optimized(self, timeout: float | None = None) -> "GenericModel":
        self.special.wait_optimized(timeout)   # (the generic module is built at -O3)
        return self

    @property
    def tier(self) -> str:
        return self.special.tier

    def _run(self, inputs: list) -> list:
        try:
            return self.module(inputs)
        except NotCovered:    # a symbol of 0, or a size outside the module's guards
            return self.special.program.run(inputs)


class TieredModel(GenericModel):
    """The generic module serves; per new input shapes, one background thread specialises
    and builds (`special`, a kiln.targets.cpu.CpuModel of the same graph) and the built
    module serves that shape from then on. A failed specialisation leaves the generic
    module serving it (its error is kept in `failed`)."""
    shapes = "tiered"

    def __init__(self, module, optimized, inputs: list[TensorSpec], outputs: list[TensorSpec], special):
        super().__init__(module, optimized, inputs, outputs, special)
        self.ready: dict[tuple, object] = {}     # input shapes -> the specialised runner
        self.failed: dict[tuple, Exception] = {}
        self._pending: dict[tuple, object] = {}  # input shapes -> its build's future
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="kiln-specialize")

    @property
    def specializations(self) -> int:
        """Native modules built: the generic one and each specialised one ready."""
        return 1 + len(self.ready)

    def why(self) -> str:
        return (super().why() + "; it serves each new input shape at once while the module specialised to "
                "that shape is built in the background, which then takes over")

    def _run(self, inputs: list) -> list:
        key = tuple([x.shape for x in inputs])
        r = self.ready.get(key)
        if r is not None:
            return r(inputs)
        with self._lock:
            if key not in self._pending and key not in self.failed:
                shapes = [np.zeros(x.shape, x.dtype) for x in inputs]   # sizes alone decide it
                self._pending[key] = self._pool.submit(self._specialize, key, shapes)
        return super()._run(inputs)

    def _specialize(self, key: tuple, inputs: list) -> None:
        try:
            self.ready[key] = self.special.program.runner_for(inputs)
        except Exception as e:  # noqa: BLE001 - the generic module keeps serving; kept for the caller
            self.failed[key] = e

    def wait(self, timeout: float | None = None) -> None:
        """Block until every specialisation asked for so far is built (or failed)."""
        for f in list(self._pending.values()):
            f.result(timeout)
