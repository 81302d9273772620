"""Operator definitions: one `OpDef` per (domain, op type).

An op definition holds kiln's own semantics for an operator:

- `infer(ctx) -> list[Type]`: type and shape inference from input types,
  attributes and (where known at compile time) input values;
- `run(ctx, *inputs) -> array | tuple`: the NumPy reference — the golden model
  that the interpreter target executes and every lowering is checked against.
  Several outputs come back as a tuple; a single sequence/optional output is
  returned as the list (or None) itself, never wrapped;
- `value(ctx) -> list[ndarray | None]` (optional): output data derivable at
  compile time from types alone (e.g. `Shape` of a static tensor), used for
  shape propagation.
- `fusion: FusionKind` (required, declared with the op): how the op may fuse
  with its neighbours, by TVM's op pattern kinds (elementwise < broadcast <
  injective < reduction < out-elementwise-fusable < opaque); the partitioner
  reads it from here. An op that fuses with nothing declares OPAQUE.

How an op becomes loops (its lowering, `@lowering(name)`, and the `LowerCtx` it is handed)
is not part of what it is: that lives in kiln.lower (kiln.lower.context), which reads this
registry; nothing here imports kiln.lower.
"""

from __future__ import annotations

import enum
import itertools
import numbers
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from kiln.dtypes import DType
from kiln.errors import KilnError
from kiln.graph.ir import Node
from kiln.graph.types import SequenceType, OptionalType, TensorType, Type

_REQUIRED = object()
MAX_RANK = 64  # NumPy's limit on dims


class FusionKind(enum.IntEnum):
    """An op's fusion pattern kind (TVM's): a higher kind fuses less. ELEMWISE: one output
    element from the same element of each input; BROADCAST: ... of broadcast inputs;
    INJECTIVE: an index remapping (Transpose, Slice, Concat); REDUCTION: reduces axes
    (ReduceSum, Softmax); OUT_FUSABLE: an anchor that takes an elementwise epilogue
    (Conv, MatMul); OPAQUE: fuses with nothing."""
    ELEMWISE = 0
    BROADCAST = 1
    INJECTIVE = 2
    REDUCTION = 3
    OUT_FUSABLE = 4
    OPAQUE = 5


ELEMWISE, BROADCAST, INJECTIVE, REDUCTION, OUT_FUSABLE, OPAQUE = FusionKind


@dataclass(frozen=True)
class OpDef:
    name: str
    domain: str
    infer: Callable[["InferCtx"], list[Type]]
    run: Callable[..., Any]
    fusion: FusionKind
    value: Callable[["InferCtx"], list] | None = None


REGISTRY: dict[tuple[str, str], OpDef] = {}


def normalize_domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def register(name: str, *, infer, run, fusion: FusionKind | None = None, domain: str = "",
             value=None) -> OpDef:
    key = (normalize_domain(domain), name)
    if key in REGISTRY:
        raise RuntimeError(f"op {name!r} (domain {domain!r}) registered twice")
    if not isinstance(fusion, FusionKind):
        # a forgotten kind must not quietly make the op OPAQUE: say so where it is declared
        raise RuntimeError(f"op {name!r} (domain {domain!r}) registered without a fusion kind: "
                           f"give fusion=FusionKind.<kind> (OPAQUE if it fuses with nothing), got {fusion!r}")
    d = OpDef(name, key[0], infer, run, fusion, value)
    REGISTRY[key] = d
    return d


def op(name: str, *, infer, fusion: FusionKind | None = None, domain: str = "", value=None,
       aliases: tuple[str, ...] = ()):
    """Decorator form: `@op("Relu", infer=same_as(0), fusion=ELEMWISE)` over the reference function."""
    def deco(fn):
        for n in (name, *aliases):
            register(n, infer=infer, run=fn, fusion=fusion, domain=domain, value=value)
        return fn
    return deco


def lookup(domain: str, name: str) -> OpDef | None:
    """The op's definition, or None. The registry is complete whenever this module is imported
    from outside kiln.ops: Python runs kiln/ops/__init__.py, which imports every family, first."""
    return REGISTRY.get((normalize_domain(domain), name))


def _kind(v) -> str:
    if isinstance(v, numbers.Integral):
        return "an int"
    if isinstance(v, numbers.Real):
        return "a float"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, (list, tuple, np.ndarray)):
        return "a list"
    return f"a {type(v).__name__}"


def _same_kind(value, default) -> bool:
    """An attribute of another kind than its default (a list where an int is meant: what a
    malformed model gives) would fail somewhere inside the op; say so by name instead."""
    if isinstance(default, numbers.Integral):
        return isinstance(value, numbers.Integral)
    if isinstance(default, numbers.Real):
        return isinstance(value, numbers.Real)
    if isinstance(default, str):
        return isinstance(value, str)
    if isinstance(default, (list, tuple)):
        return isinstance(value, (list, tuple, np.ndarray))
    return True


def _short(v) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


class NodeCtx:
    """What inference, the reference and the lowering (kiln.lower.context.LowerCtx) can all
    see of a node."""

    def __init__(self, node: Node, opset: int):
        self.node = node
        self.opset = opset

    @property
    def num_outputs(self) -> int:
        return len(self.node.outputs)

    def output_used(self, i: int) -> bool:
        return i < len(self.node.outputs) and self.node.outputs[i] is not None

    @property
    def num_inputs(self) -> int:
        return len(self.node.inputs)

    def has_input(self, i: int) -> bool:
        return i < len(self.node.inputs) and self.node.inputs[i] is not None

    def attr(self, name: str, default: Any = _REQUIRED) -> Any:
        if name in self.node.attrs:
            value = self.node.attrs[name]
            if default is not _REQUIRED and default is not None and not _same_kind(value, default):
                self.fail(f"attribute {name!r} must be {_kind(default)} like its default {default!r}, "
                          f"got {_kind(value)} {_short(value)}")
            return value
        if default is _REQUIRED:
            self.fail(f"missing required attribute {name!r}")
        return default

    def has_attr(self, name: str) -> bool:
        return name in self.node.attrs

    def fail(self, message: str, stage: str | None = None):
        raise KilnError(message, node=self.node.name, op=self.node.op, stage=stage)


class InferCtx(NodeCtx):
    """Inference view of a node: input types, known input values, fresh symbols."""

    _sym = itertools.count()

    def __init__(self, node: Node, opset: int, types: list[Type | None],
                 values: list[np.ndarray | None], subgraph_infer=None):
        super().__init__(node, opset)
        self.types = types
        self.values = values
        self._subgraph_infer = subgraph_infer

    def type(self, i: int) -> Type:
        if not self.has_input(i):
            self.fail(f"input {i} is required but missing")
        return self.types[i]

    def tensor(self, i: int) -> TensorType:
        t = self.type(i)
        if not isinstance(t, TensorType):
            self.fail(f"input {i} must be a tensor, got {t}")
        return t

    def dtype(self, i: int) -> DType:
        return self.tensor(i).dtype

    def shape(self, i: int) -> tuple | None:
        return self.tensor(i).shape

    def value(self, i: int) -> np.ndarray | None:
        """The input's data when known at compile time, else None."""
        if not self.has_input(i):
            return None
        return self.values[i]

    def new_dim(self) -> str:
        """A fresh symbol for a size known only at run time."""
        return f"_u{next(InferCtx._sym)}"

    def unknown_shape(self, rank: int | None) -> tuple | None:
        """A shape of `rank` fresh symbols (rank often read off a shape vector's length: bounded)."""
        if rank is not None and rank > MAX_RANK:
            self.fail(f"the output would have rank {rank:,}; kiln, like NumPy, handles at most {MAX_RANK} dims")
        return None if rank is None else tuple(self.new_dim() for _ in range(rank))

    def infer_subgraph(self, graph, input_types: list[Type]) -> list[Type]:
        """Infer a body graph (If/Loop/Scan) with the given input types; returns output types."""
        return self._subgraph_infer(graph, input_types)


class RunCtx(NodeCtx):
    """Reference-execution view of a node."""

    def __init__(self, node: Node, opset: int, run_subgraph=None):
        super().__init__(node, opset)
        self._run_subgraph = run_subgraph

    @property
    def output_types(self) -> list[Type | None]:
        return [None if v is None else v.type for v in self.node.outputs]

    def run_subgraph(self, graph, inputs: list) -> list:
        """Run a body graph on runtime values (arrays, lists for sequences, None for empty optionals)."""
        return self._run_subgraph(graph, inputs)

    def check_size(self, shape, dtype, what: str = "output") -> None:
        """Refuse (KilnResourceError) an output of `shape` above the memory limit, before it
        is allocated: for ops whose output size comes from input data (ConstantOfShape, ...)."""
        from kiln.limits import check_memory, nbytes
        size = nbytes(tuple(int(d) for d in shape), np.dtype(dtype).itemsize)
        check_memory(size, f"{what} of shape {tuple(int(d) for d in shape)}",
                     node=self.node.name, op=self.node.op)

    def rng(self) -> np.random.Generator:
        seed = self.attr("seed", None)
        return np.random.default_rng(None if seed is None else int(np.float32(seed).view(np.int32)))


# ---- common inference helpers used by many families ----

def same_as(i: int = 0):
    """Inference: every output has the type of input `i`."""
    def infer(ctx: InferCtx):
        return [ctx.type(i)] * ctx.num_outputs
    return infer


def seq_of(t: Type) -> SequenceType:
    return SequenceType(t)


def opt_of(t: Type) -> OptionalType:
    return OptionalType(t)
