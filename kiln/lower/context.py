"""What a lowering is handed and what it may return: `LowerCtx` (the node's concrete types,
compile-time input data and the Target), `ExternKernel` (a hand-written C kernel), and the
lowering table: `@lowering(name)` attaches an op family's lowering (kiln/lower/<family>.py) to
an op defined in kiln.ops, and `lowering_of(node)` finds it.

An op's definition (kiln.ops) says what it is; how it becomes loops for a target is here, in
the lowering room, and kiln.ops knows nothing of it. The table is complete wherever it is
read: importing any kiln.lower module runs kiln/lower/__init__.py, which imports every family.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from kiln.dtypes import DType
from kiln.graph.deferred import Deferred
from kiln.graph.ir import Node
from kiln.graph.types import Type
from kiln.loops import check
from kiln.names import escape
from kiln.ops.registry import REGISTRY, NodeCtx, normalize_domain

# (domain, op type) -> lower(ctx: LowerCtx, *inputs: loops.Tensor) -> Tensor | list[Tensor] |
# ExternKernel: the compute definitions (kiln.loops) that say what the op computes for concrete
# shapes; the cpu target compiles these, never the NumPy reference
LOWERINGS: dict[tuple[str, str], Callable] = {}


def lowering(name: str, domain: str = ""):
    """Decorator attaching a lowering to an op registered in kiln.ops: `@lowering("Relu")`."""
    def deco(fn):
        key = (normalize_domain(domain), name)
        if key not in REGISTRY:
            raise RuntimeError(f"lowering for unregistered op {name!r}")
        if key in LOWERINGS:
            raise RuntimeError(f"op {name!r} has two lowerings")
        LOWERINGS[key] = fn
        return fn
    return deco


def lowering_of(node: Node) -> Callable | None:
    """The node's op's lowering, or None (an op kiln runs only in the reference, or not at all)."""
    return LOWERINGS.get((normalize_domain(node.domain), node.op))


@dataclass
class ExternKernel:
    """A lowering's hand-written C kernel, as `LowerCtx.extern` describes it; kiln.lower.kernel
    makes it a function of the module."""
    c_body: str
    inputs: list
    outputs: list
    dynamic: bool = False
    preamble: str = ""
    libs: tuple = ()
    errors: tuple = ()


class LowerCtx(NodeCtx):
    """Lowering view of a node: concrete input/output types and compile-time input data."""

    def __init__(self, node: Node, opset: int, input_types: list[Type | None],
                 output_types: list[Type | None], values: list[np.ndarray | None], target=None):
        super().__init__(node, opset)
        self.target = target     # the kiln.targets.Target the kernel is compiled for
        self.input_types = input_types
        self.output_types = output_types
        self.values = values
        self.schedule_fn = None

    def schedule(self, fn) -> None:
        """Use `fn(sch: loops.Schedule, outputs: list[Tensor])` instead of the default schedule."""
        self.schedule_fn = fn

    def extern(self, c_body: str, inputs: list, outputs: list[tuple[tuple, DType]],
               dynamic: bool = False, preamble: str = "", libs: tuple = (), errors: dict | None = None):
        """A hand-written C kernel for ops that are unnatural as computes (TopK, NMS, ...).

        `c_body` is the body of `int32_t f(const T* in0, ..., T* out0, ...)`: it reads
        the present inputs as `in0, in1, ...` (in node input order, absent ones skipped),
        writes `out0, out1, ...` (flat row-major arrays of the given shapes/dtypes), and
        ends with `return 0;` (non-zero: bad input data, e.g. an index out of range).
        Shapes are known: bake them in as constants. Return the result of this call
        from the lowering.

        `dynamic=True` is for outputs whose size depends on data (NonZero, Unique):
        `outputs` then give capacities (upper-bound shapes); the kernel gets one more
        parameter `out<n>` (int64, n = number of outputs) where it writes each output's
        actual dims, concatenated, and writes each output compactly (row-major in its
        actual shape) at the start of its buffer. The runtime sizes the outputs from that.

        A kernel built on a C library (ImageDecoder) gives file-scope C in `preamble` (its
        #includes) and `libs`, (name for -l, header, package providing them) each: only
        modules holding it link them, and a machine without them is told which package to
        install. `errors` maps the body's non-zero statuses to what they mean, for the
        error the runtime raises.
        """
        return ExternKernel(c_body, [p for p in inputs if p is not None], list(outputs), dynamic,
                            preamble, tuple(libs), tuple(sorted((errors or {}).items())))

    def value(self, i: int) -> np.ndarray | None:
        """The input's data when known at compile time (weights, shape tensors), else None
        (data still deferred is made here: kiln.graph.deferred)."""
        v = self.values[i] if self.has_input(i) else None
        return v.value() if isinstance(v, Deferred) else v

    def check(self, value, ok, reported, message: str):
        """kiln.loops.check (a run-time check: where `ok` is false the run fails with
        `message`, {value} showing `reported`), its message naming this node: a fused
        kernel holds several nodes, the error names the one whose check failed."""
        return check(value, ok, reported, f"{escape(self.node.op)} node {self.node.name!r}: {message}")

    def out_shape(self, i: int = 0) -> tuple[int, ...]:
        return tuple(self.output_types[i].shape)

    def out_dtype(self, i: int = 0) -> DType:
        return self.output_types[i].dtype

    def dynamic(self) -> bool:
        """Whether some output's shape is only known at run time (see `extern(dynamic=True)`)."""
        # a symbolic size Expr (a shape-generic module, kiln.lower.generic) is not data-dependent
        return any(t is not None and (t.shape is None or any(isinstance(d, str) for d in t.shape))
                   for t in self.output_types)
