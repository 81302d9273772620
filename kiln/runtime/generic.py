"""Running a shape-generic native module: one library for every value of the symbols.

The entry takes, after the usual (inputs.., outputs.., weights, workspace), the symbols'
values `dims` (int64; then the values of the floor-division sizes the kernels read, `atoms`) and the workspace offset of each arena buffer `offsets` (int64),
planned per shape by a `layout(dims) -> (workspace bytes, offsets)` the loader is given
(the compiler's liveness planner; a saved artifact would carry the plan's inputs). The
plan of each shape is kept, so a new shape costs one plan, never a compile.
Needs numpy and ctypes only.
"""

from __future__ import annotations

import ctypes

import numpy as np

from kiln.errors import KilnError
from kiln.runtime.native import NativeModule, check_bound, data_pointers

SYMBOL_MAX = (1 << 31) - 1   # what the kernels assume of a symbol (kiln.loops.symbols.SYMBOL_MAX)


def spelt(types: list) -> list:
    """(shape, dtype) pairs as the module's interface text holds them: names and numbers
    only, so a computed size ("batch*seq", "(H+1)//2") is spelt in words ("batch_times_seq",
    "_of_H_plus_1_end__floordiv_2")."""
    words = (("*", "_times_"), ("+", "_plus_"), ("//", "_floordiv_"), ("(", "_of_"), (")", "_end_"))

    def word(d: str) -> str:
        for sym, w in words:
            d = d.replace(sym, w)
        return d
    return [(tuple(word(d) if isinstance(d, str) else d for d in shape), dt) for shape, dt in types]


class NotCovered(KilnError):
    """Symbol values the generic module does not run (the caller runs the shape specialised)."""


class EmptyShape(NotCovered):
    """A symbol is 0: the generic kernels assume every symbol >= 1 (their tiles and clamps)."""


class GenericModule(NativeModule):
    """A loaded shape-generic library: `input_types`/`output_types` hold symbol names."""

    def __init__(self, library_path: str, library_sha256: str, entry_symbol: str, symbols: list[str],
                 input_types: list, output_types: list, weights: np.ndarray, layout,
                 call_nodes: list[str], call_errors: list | None = None, check_bytes=None,
                 derived: dict | None = None, atoms: list[str] | None = None):
        super().__init__(library_path, library_sha256, entry_symbol, spelt(input_types), spelt(output_types),
                         weights, 0, call_nodes, call_errors)
        self.symbols = list(symbols)
        self.input_shapes = [tuple(s) for s, _ in input_types]
        self.output_shapes = [tuple(s) for s, _ in output_types]
        self._layout = layout
        self._check_bytes = check_bytes     # (bytes, what) -> raises over the memory limit
        # sizes computed from the symbols ("batch*seq"): name -> ((monomial symbols, coeff), ...),
        # or for a floor-division atom ("(H+1)//2"): ("floordiv", its numerator's terms, divisor)
        self.derived = dict(derived or {})
        # floor-division sizes the kernels read as values of their own: dims holds each after
        # the symbols
        self.atoms = list(atoms or [])
        # where each symbol is read: (input, axis) of its first appearance
        self._where = {}
        for i, shape in enumerate(self.input_shapes):
            for a, d in enumerate(shape):
                if isinstance(d, str):
                    self._where.setdefault(d, (i, a))
        missing = [s for s in self.symbols if s not in self._where]
        if missing:
            raise KilnError(f"symbol(s) {missing} appear in no input shape")
        self.layouts: dict[tuple, tuple] = {}   # dims -> (dims array, offsets array, workspace bytes)
        # plans made for the symbols rounded up to powers of two serve the shapes they cover
        # (the layout's round_up; kiln.decode sets it: a cache length that grows every step)
        self.round_plans = False
        self._by_shapes: dict[tuple, tuple] = {}  # input shapes -> what _prepare made
        if not self._plain:
            raise KilnError("a shape-generic module takes numeric tensors only")

    def shape_plan(self, dims: tuple[int, ...]) -> tuple:
        """The arena plan for symbol values `dims` (made once per new shape)."""
        hit = self.layouts.get(dims)
        if hit is None:
            if any(d > SYMBOL_MAX for d in dims):
                raise KilnError(f"symbolic dims {dict(zip(self.symbols, dims))}: the shape-generic module "
                                f"runs sizes up to {SYMBOL_MAX}", stage="run")
            if any(d < 1 for d in dims):
                bad = [f"{s}={d}" for s, d in zip(self.symbols, dims) if d < 1]
                raise EmptyShape(f"symbolic dim(s) {', '.join(bad)}: the shape-generic module runs sizes >= 1",
                                 stage="run")
            ws, offsets = self._layout(dims, True) if self.round_plans else self._layout(dims)
            if self._check_bytes is not None:
                outs = sum(int(np.prod(self._shape(s, dims), dtype=np.int64)) * dt.itemsize
                           for s, (_, dt) in zip(self.output_shapes, self.output_types))
                self._check_bytes(int(np.size(self.weights)) + int(ws) + outs,
                                  f"the module's planned memory at {dict(zip(self.symbols, dims))}")
            env = dict(zip(self.symbols, dims))
            values = tuple(dims) + tuple(self._size(a, env) for a in self.atoms)
            hit = self.layouts[dims] = (np.array(values or (0,), np.int64), np.ascontiguousarray(offsets, np.int64),
                                        int(ws))
        return hit

    def reserve(self, dims: tuple[int, ...]) -> int:
        """Plan symbol values `dims` and grow the workspace to their plan now, its pages
        touched, so that no shape needing at most as much pays for fresh memory on its first
        run (that run then costs its arena plan alone). Returns the workspace bytes."""
        _, _, ws = self.shape_plan(tuple(int(d) for d in dims))
        with self._lock:
            if ws + 64 > self.workspace.size:
                self.workspace = np.ones(ws + 64, dtype=np.uint8)    # written: its pages are mapped now
                self._ws_ptr = self.workspace.ctypes.data + (-self.workspace.ctypes.data) % 64
                self._fixed_ptrs = [ctypes.c_void_p(self.weights.ctypes.data), ctypes.c_void_p(self._ws_ptr)]
        return ws

    def _shape(self, shape: tuple, dims: tuple) -> tuple:
        env = dict(zip(self.symbols, dims))
        return tuple(d if not isinstance(d, str) else env[d] if d in env else self._size(d, env) for d in shape)

    def _size(self, name: str, env: dict) -> int:
        spec = self.derived[name]
        if spec and spec[0] == "floordiv":      # a floor-division atom: ("floordiv", terms, divisor)
            return self._terms(spec[1], env) // spec[2]
        return self._terms(spec, env)

    def _terms(self, terms, env: dict) -> int:
        n = 0
        for mono, coeff in terms:
            t = coeff
            for s in mono:
                t *= env[s] if s in env else self._size(s, env)
            n += t
        return n

    def dims_of(self, inputs: list) -> tuple[int, ...]:
        """The symbols' values read off the inputs (shapes already validated and bound)."""
        return tuple(int(inputs[i].shape[a]) for i, a in (self._where[s] for s in self.symbols))

    def _prepare(self, inputs: list) -> tuple:
        """What a call with these input shapes needs: (pointer arguments for dims and offsets,
        workspace bytes, output shapes), planned once per shape."""
        dims = self.dims_of(inputs)
        for x, shape in zip(inputs, self.input_shapes):
            if tuple(x.shape) != self._shape(shape, dims):
                raise KilnError(f"input of shape {x.shape} does not match {shape} with "
                                f"{dict(zip(self.symbols, dims))}", stage="run")
        darr, offs, ws = self.shape_plan(dims)
        outs = [(self._shape(shape, dims), dt) for shape, (_, dt) in zip(self.output_shapes, self.output_types)]
        hit = ((ctypes.c_void_p(darr.ctypes.data), ctypes.c_void_p(offs.ctypes.data)), ws, outs)
        if len(self._by_shapes) < 4096:
            self._by_shapes[tuple(tuple(x.shape) for x in inputs)] = hit
        return hit

    def run_bound(self, inputs: list[np.ndarray], outputs: list[np.ndarray]) -> None:
        """NativeModule.run_bound at these inputs' symbol values: the outputs must have the
        shapes the symbols give (kiln.decode's KV cache buffers, bound as input and output)."""
        if any(type(x) is not np.ndarray for x in inputs):
            raise KilnError("run_bound: inputs must be C-contiguous numpy arrays", stage="run")
        hit = self._by_shapes.get(tuple([x.shape for x in inputs]))
        if hit is None:
            hit = self._prepare(inputs)
        plan_ptrs, ws, out_types = hit
        check_bound(inputs, outputs, out_types)
        self._enter(data_pointers(list(inputs) + list(outputs)), plan_ptrs, ws)

    def output_shapes_at(self, inputs: list[np.ndarray]) -> list[tuple]:
        """(shape, dtype) per output at these inputs' symbol values."""
        hit = self._by_shapes.get(tuple([x.shape for x in inputs]))
        return (hit if hit is not None else self._prepare(inputs))[2]

    def __call__(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        ins = [np.ascontiguousarray(x) for x in inputs]
        hit = self._by_shapes.get(tuple([x.shape for x in ins]))
        if hit is None:
            hit = self._prepare(ins)
        plan_ptrs, ws, out_types = hit
        outs = [np.empty(shape, dt) for shape, dt in out_types]
        self._enter(data_pointers(ins + outs), plan_ptrs, ws)
        return outs
