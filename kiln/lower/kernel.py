"""One graph node → one native kernel (a PrimFunc), through its op's lowering.

The kernel's parameters are the node's present inputs, then its outputs, in
order; absent optional inputs are passed to the lowering as None.
"""

from __future__ import annotations

from dataclasses import dataclass

from kiln.dtypes import DType
from kiln.errors import KilnError
from kiln.graph.ir import Node
from kiln.graph.types import TensorType, Type
from kiln.loops import Buffer, PrimFunc, Schedule, Tensor, compute, lower, placeholder
from kiln.loops.stmt import ExternFunc
from kiln.lower.schedules import default_schedule
from kiln.ops.registry import LowerCtx, lookup


def lowerable(node: Node) -> bool:
    d = lookup(node.domain, node.op)
    return d is not None and d.lower is not None


def _tensor_type(t: Type | None, what: str, node: Node, static: bool = True) -> TensorType:
    if not isinstance(t, TensorType) or (static and not t.is_static) or t.shape is None:
        raise KilnError(f"{what} must be a tensor of {'static shape' if static else 'known rank'} "
                        f"for native code, got {t}", node=node.name, op=node.op, stage="lower")
    return t


def lower_node(node: Node, opset: int, values: list, name: str) -> PrimFunc:
    """Lower `node` (whose value types are concrete) to a scheduled PrimFunc named `name`."""
    d = lookup(node.domain, node.op)
    if d is None or d.lower is None:
        raise KilnError("no native lowering for this op", node=node.name, op=node.op, stage="lower")
    in_types = [None if v is None else _tensor_type(v.type, f"input %{v.name}", node)
                for v in node.inputs]
    out_types = [None if v is None else _tensor_type(v.type, f"output %{v.name}", node, static=False)
                 for v in node.outputs]
    params = [None if t is None else placeholder(t.shape, t.dtype, f"in{i}")
              for i, t in enumerate(in_types)]
    ctx = LowerCtx(node, opset, in_types, out_types, values)
    try:
        res = d.lower(ctx, *params)
    except KilnError:
        raise
    except Exception as e:
        raise KilnError(f"lowering failed: {type(e).__name__}: {e}", node=node.name, op=node.op,
                        stage="lower") from e
    if isinstance(res, ExternKernel):
        return res.func(name, node, out_types)
    if ctx.dynamic():
        ctx.fail("outputs have data-dependent sizes; the lowering must return "
                 "ctx.extern(..., dynamic=True)", stage="lower")
    outs = list(res) if isinstance(res, (list, tuple)) else [res]
    if len(outs) < len(node.outputs):
        ctx.fail(f"lowering returned {len(outs)} tensors for {len(node.outputs)} outputs", stage="lower")
    outs = outs[:len(node.outputs)]
    for k, (t, want) in enumerate(zip(outs, out_types)):
        if want is not None and (t.dtype != want.dtype or tuple(t.shape) != tuple(want.shape)):
            ctx.fail(f"lowering of output {k} gives {t.dtype}{list(t.shape)}, inference says {want}",
                     stage="lower")
    outs = [_own(t, f"out{k}", params) for k, t in enumerate(outs)]
    sch = Schedule(outs)
    (ctx.schedule_fn or default_schedule)(sch, outs)
    return lower(sch, [p for p in params if p is not None] + outs, name)


@dataclass
class ExternKernel:
    """A lowering's hand-written C body (see LowerCtx.extern)."""
    c_body: str
    inputs: list
    outputs: list
    dynamic: bool = False

    def func(self, name: str, node: Node, out_types) -> ExternFunc:
        outs = [Buffer(f"out{k}", dt, tuple(shape)) for k, (shape, dt) in enumerate(self.outputs)]
        for k, (b, want) in enumerate(zip(outs, out_types)):
            if want is None:
                continue
            ok = b.dtype == want.dtype and (
                len(b.shape) == len(want.shape) if self.dynamic else b.shape == tuple(want.shape))
            if not ok:
                raise KilnError(f"extern kernel output {k} is {b.dtype}{list(b.shape)}, inference says "
                                f"{want}", node=node.name, op=node.op, stage="lower")
        if self.dynamic:
            rank = sum(len(b.shape) for b in outs)
            outs.append(Buffer(f"out{len(outs)}", DType.int64, (max(rank, 1),)))
        ins = [Buffer(f"in{k}", p.dtype, tuple(p.shape)) for k, p in enumerate(self.inputs)]
        return ExternFunc(name, tuple(ins + outs), self.c_body, self.dynamic)


def _own(t: Tensor, name: str, params: list) -> Tensor:
    """An output that is an input (Identity-like) or shared with another output gets its own copy."""
    if t.op is None:
        return compute(t.shape, lambda *i: t[i], name)
    return t
