"""A core-ATen FX graph → kiln Graph.

Shared by both torch entry points: `kiln.compile(module, example_inputs=...)`
(torch.export's graph) and `torch.compile(backend="kiln")` (Dynamo's graph,
traced to ATen). Each ATen op becomes one or a few ONNX-semantics kiln nodes
(table in `torch_ops.py`). Types are inferred node by node as the graph is
built, so a handler can read its inputs' kiln shapes (ints or symbols) and the
known values of shape arithmetic; torch's own metadata (`node.meta['val']`)
gives only dtypes. Every op the table lacks is listed, with the source line
that made it, before anything is built.
"""

from __future__ import annotations

import operator
import re
from typing import Any, Callable

import ml_dtypes
import numpy as np
import torch

from kiln.dtypes import DType
from kiln.errors import KilnError, UnsupportedOpsError
from kiln.graph.ir import Graph, Node, Value
from kiln.graph.types import TensorType
from kiln.ops.infer import Inferencer

OPSET = 21
STAGE = "torch import"

_TORCH_TO_NP = {
    torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16,
    torch.bfloat16: ml_dtypes.bfloat16,
    torch.int64: np.int64, torch.int32: np.int32, torch.int16: np.int16, torch.int8: np.int8,
    torch.uint8: np.uint8, torch.bool: np.bool_,
}


def kiln_dtype(dt: torch.dtype) -> DType:
    if dt not in _TORCH_TO_NP:
        raise KilnError(f"torch dtype {dt} is not supported (kiln takes "
                        f"{sorted(str(d) for d in _TORCH_TO_NP)})", stage=STAGE)
    return DType.from_numpy(np.dtype(_TORCH_TO_NP[dt]))


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A tensor's data as a numpy array of the same dtype (a copy: weights may change later)."""
    t = t.detach()
    if t.dtype not in _TORCH_TO_NP:
        raise KilnError(f"constant of dtype {t.dtype} is not supported", stage=STAGE)
    return np.array(numpy_view(t.cpu().resolve_conj().resolve_neg()), copy=True)


def numpy_view(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor's memory as a numpy array (no copy); bfloat16, which numpy lacks, as
    ml_dtypes.bfloat16 (the dtype kiln uses)."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def tensor_view(a: np.ndarray) -> torch.Tensor:
    """numpy_view's inverse: a tensor sharing `a`'s memory."""
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def source_line(node: torch.fx.Node) -> str:
    """The user's source line that made `node` (the last frame of its stack trace)."""
    trace = node.meta.get("stack_trace") or ""
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)', trace)
    if not frames:
        return "unknown source location"
    f, line, fn, code = frames[-1]
    return f"{f}:{line} in {fn}: {code.strip()}"


def op_name(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return str(target)  # aten.add.Tensor
    return getattr(target, "__name__", str(target))


class UnsupportedTorchOpsError(UnsupportedOpsError):
    """Every ATen op kiln cannot translate, each with where it came from (raised before any work)."""

    def __init__(self, missing: list[tuple[str, str, str]]):
        self.missing = missing  # (op, node name, source line)
        lines = [f"  {op} at node {name!r}, from {where}" for op, name, where in missing]
        KilnError.__init__(self, f"{len(missing)} torch op(s) kiln cannot translate:\n" + "\n".join(lines),
                           stage=STAGE)


class Builder:
    """Adds kiln nodes to a graph under construction, inferring types as it goes."""

    def __init__(self, name: str):
        self.graph = Graph(name, [], [], [], {"": OPSET})
        self.inf = Inferencer(self.graph.opsets)
        self._n = 0
        self.where = ""  # the fx node being translated (names the kiln nodes, and errors)

    def fresh(self, base: str) -> str:
        self._n += 1
        return f"{self.where or base}_{self._n}"

    def input(self, name: str, dtype: DType, shape: tuple) -> Value:
        v = Value(name, TensorType(dtype, tuple(shape)))
        self.graph.inputs.append(v)
        return v

    def const(self, data, dtype=None) -> Value:
        arr = np.asarray(data, dtype=dtype)
        return Value(self.fresh("const"), TensorType(DType.from_numpy(arr.dtype), tuple(arr.shape)), arr)

    def i64(self, xs) -> Value:
        return self.const(np.asarray(xs, dtype=np.int64))

    def op(self, op: str, inputs: list, n_out: int = 1, **attrs) -> Any:
        outs = [Value(self.fresh(op), None) for _ in range(n_out)]
        node = Node(op, list(inputs), outs, attrs, self.fresh(op))
        self.inf.infer_node(node)
        self.graph.nodes.append(node)
        return outs[0] if n_out == 1 else outs

    def known(self, v: Value) -> np.ndarray | None:
        return self.inf.known_value(v)

    def shape(self, v: Value) -> tuple:
        return v.type.shape

    def rank(self, v: Value) -> int:
        return len(v.type.shape)

    def dtype(self, v: Value) -> DType:
        return v.type.dtype

    def cast(self, v: Value, dtype: DType) -> Value:
        return v if self.dtype(v) == dtype else self.op("Cast", [v], to=dtype.onnx)


class SymInt:
    """A symbolic integer (a size read at run time): a 0-d int64 kiln value."""

    def __init__(self, value: Value):
        self.value = value


# handler(translator, fx node, *args, **kwargs) -> Value | SymInt | int | tuple | list | None
Handler = Callable[..., Any]


class Translator:
    """One FX graph → one kiln Graph."""

    def __init__(self, gm: torch.fx.GraphModule, table: dict[Any, Handler], name: str = "torch"):
        self.gm = gm
        self.table = table
        self.b = Builder(name)
        self.env: dict[torch.fx.Node, Any] = {}

    def check(self) -> None:
        missing = []
        for n in self.gm.graph.nodes:
            if n.op == "call_function" and n.target not in self.table:
                missing.append((op_name(n.target), n.name, source_line(n)))
            elif n.op in ("call_module", "call_method"):
                missing.append((f"{n.op} {n.target}", n.name, source_line(n)))
        if missing:
            raise UnsupportedTorchOpsError(missing)

    def run(self, inputs: dict[torch.fx.Node, Any]) -> Any:
        """Translate every node; `inputs` gives each placeholder's value (a kiln Value, or a
        python number). Returns the output node's structure with kiln values in it."""
        self.check()
        outputs = None
        for n in self.gm.graph.nodes:
            if n.op == "placeholder":
                if n not in inputs:
                    raise KilnError(f"placeholder {n.name!r} has no value", stage=STAGE)
                self.env[n] = inputs[n]
            elif n.op == "get_attr":
                self.env[n] = self._attr(n)
            elif n.op == "call_function":
                self.env[n] = self._call(n)
            elif n.op == "output":
                outputs = self._load(n.args[0])
        return outputs

    def _attr(self, n: torch.fx.Node) -> Any:
        obj = self.gm
        for part in n.target.split("."):
            obj = getattr(obj, part)
        return self.b.const(to_numpy(obj)) if isinstance(obj, torch.Tensor) else obj

    def _load(self, a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            return self.env[a]
        if isinstance(a, (list, tuple)):
            return type(a)(self._load(x) for x in a)
        if isinstance(a, dict):
            return {k: self._load(v) for k, v in a.items()}
        return a

    def _call(self, n: torch.fx.Node) -> Any:
        self.b.where = n.name
        args, kwargs = self._load(n.args), self._load(n.kwargs)
        try:
            return self.table[n.target](self, n, *args, **kwargs)
        except KilnError as e:
            if e.stage == STAGE and e.node:
                raise
            raise KilnError(f"{e.raw_message if e.stage == STAGE else e} (from {source_line(n)})",
                            node=n.name, op=op_name(n.target), stage=STAGE) from e

    # -- helpers used by the op handlers --------------------------------------------------

    def fail(self, n: torch.fx.Node, message: str):
        raise KilnError(f"{message} (from {source_line(n)})", node=n.name, op=op_name(n.target),
                        stage=STAGE)

    def out_dtype(self, n: torch.fx.Node, i: int | None = None) -> DType:
        val = n.meta.get("val")
        if i is not None:
            val = val[i]
        if not isinstance(val, torch.Tensor):
            raise KilnError("has no tensor metadata (meta['val'])", node=n.name, stage=STAGE)
        return kiln_dtype(val.dtype)

    def tensor(self, x: Any, dtype: DType) -> Value:
        """A kiln value of `dtype` for a tensor, a symbolic int or a python number."""
        if isinstance(x, Value):
            return self.b.cast(x, dtype)
        if isinstance(x, SymInt):
            return self.b.cast(x.value, dtype)
        return self.b.const(np.asarray(x, dtype=dtype.np))

    def int_list(self, xs) -> Value:
        """A 1-d int64 kiln value from a list of ints and symbolic ints."""
        if isinstance(xs, Value):
            return self.b.cast(xs, DType.int64)
        if all(isinstance(x, (int, np.integer)) for x in xs):
            return self.b.i64([int(x) for x in xs])
        parts = [self.b.op("Unsqueeze", [x.value, self.b.i64([0])]) if isinstance(x, SymInt)
                 else self.b.i64([int(x)]) for x in xs]
        return self.b.op("Concat", parts, axis=0)

    def static_int(self, x: Any) -> int | None:
        """The value of an int or of a symbolic int known at compile time, else None."""
        if isinstance(x, (int, np.integer)):
            return int(x)
        if isinstance(x, SymInt):
            k = self.b.known(x.value)
            return None if k is None else int(k)
        return None


def is_symint_node(n: Any) -> bool:
    return isinstance(n, torch.fx.Node) and isinstance(n.meta.get("val"), torch.SymInt)


SYM_OPS = {operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod, operator.neg}
