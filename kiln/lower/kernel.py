"""Graph nodes → one native kernel (a PrimFunc, or a hand-written ExternFunc).

A kernel is a fused group of nodes (one node, or an elementwise/injective chain
chosen by kiln.lower.partition, possibly around an anchor: injective prologues, a
MatMul/Gemm/Conv/reduction, elementwise epilogues): each node's lowering is called
in order, reading the group's inputs as placeholders `in0, in1, ...` and earlier
members' outputs as the compute Tensors those returned. Intermediate injective
stages are inlined, so the chain becomes one loop nest and a prologue becomes index
arithmetic in the anchor's loads. The anchor's schedule schedules the kernel.
Parameters: the group's inputs (first-use order), then its outputs.

The schedule is kept: `Kernel.trace` is its replayable trace, with the named
decisions its template took (`Kernel.decisions`, kiln.lower.decisions); lowering
again with `decisions={...}` gives the schedule for other values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kiln.dtypes import DType
from kiln.errors import KilnError
from kiln.graph.ir import Node, Value
from kiln.graph.types import TensorType, Type
from kiln.loops import Buffer, PrimFunc, Schedule, Tensor, compute, lower, placeholder
from kiln.loops.schedule import Trace
from kiln.loops.stmt import ExternFunc
from kiln.lower.decisions import check_used, choosing, for_kernel
from kiln.lower.schedules import default_schedule
from kiln.lower.partition import Kind, group_anchor, kind_of
from kiln.lower.context import ExternKernel, LowerCtx, lowering_of
from kiln.targets.target import Target


def lowerable(node: Node) -> bool:
    return lowering_of(node) is not None


class Unfusable(KilnError):
    """A group member that can only be a kernel of its own (an extern C kernel)."""


@dataclass
class Kernel:
    func: PrimFunc | ExternFunc
    inputs: list[Value]            # one per leading param
    outputs: list[Value | None]    # one per remaining param (None: an unused output, scratch)
    nodes: list[Node] = field(default_factory=list)
    trace: Trace | None = None     # the schedule's trace (None: a hand-written kernel)
    decisions: dict = field(default_factory=dict)  # the named decisions taken, name -> value


def _tensor_type(t: Type | None, what: str, node: Node, static: bool = True) -> TensorType:
    """`t` as a tensor type whose dims are sizes: ints, or (a shape-generic module,
    kiln.lower.generic) symbolic size Exprs; a named symbol (str) is not lowerable."""
    if not isinstance(t, TensorType) or t.shape is None or \
            (static and any(isinstance(d, str) for d in t.shape)):
        raise KilnError(f"{what} must be a tensor of {'static shape' if static else 'known rank'} "
                        f"for native code, got {t}", node=node.name, op=node.op, stage="lower")
    return t


def lower_node(node: Node, opset: int, values: list, name: str, target: Target | None = None,
               decisions: dict | None = None) -> PrimFunc | ExternFunc:
    """One node as one kernel for `target` (None: this host); params are its present
    inputs, then all its outputs."""
    k = lower_group([node], {id(node): opset}, {id(node): values}, lambda v: True, name, Target.of(target),
                    decisions)
    return k.func


def lower_group(nodes: list[Node], opsets: dict[int, int], values: dict[int, list],
                needed_outside, name: str, target: Target, decisions: dict | None = None) -> Kernel:
    """Lower `nodes` (types concrete) into one kernel named `name`, compiled for `target`.

    `opsets`/`values` are keyed by id(node) (values: per input, compile-time data or None);
    `needed_outside(value)` says whether a value produced here is read after the kernel.
    `decisions` overrides the templates' decisions (kiln.lower.decisions: global, or for
    kernel `name`); `target` gives their defaults.
    A lowering's own failure is still a KilnError naming the node (on every path that lowers:
    whole graphs, and the single-node kernels built at run time for data-dependent shapes).
    """
    decisions = decisions or {}
    try:
        with choosing(name, for_kernel(decisions, name), target) as chosen:
            kernel = _lower_group(nodes, opsets, values, needed_outside, name, target)
        check_used(name, decisions.get(name, {}), chosen)
        kernel.decisions = dict(chosen)
        if kernel.trace is not None:
            kernel.trace = Trace(kernel.trace.insts, tuple(chosen.items()))
        return kernel
    except (KilnError, MemoryError):
        raise
    except Exception as e:
        others = f" (fused with {len(nodes) - 1} other node(s))" if len(nodes) > 1 else ""
        raise KilnError(f"lowering failed{others}: {type(e).__name__}: {e}", node=nodes[-1].name,
                        op=nodes[-1].op, stage="lower") from e


def _lower_group(nodes: list[Node], opsets: dict[int, int], values: dict[int, list],
                 needed_outside, name: str, target: Target) -> Kernel:
    tensors: dict[int, Tensor] = {}
    group_inputs: list[Value] = []
    produced: list[tuple[Value | None, Tensor]] = []
    schedule_fn = None
    anchor = group_anchor(nodes)
    helpers: set = set()   # non-anchor members' own intermediate stages (e.g. `_let` stages)
    for node in nodes:
        lower_node = lowering_of(node)
        if lower_node is None:
            raise KilnError("no native lowering for this op", node=node.name, op=node.op, stage="lower")
        in_types = [None if v is None else _tensor_type(v.type, f"input %{v.name}", node)
                    for v in node.inputs]
        out_types = [None if v is None else _tensor_type(v.type, f"output %{v.name}", node, static=False)
                     for v in node.outputs]
        args = []
        for v, t in zip(node.inputs, in_types):
            if v is None:
                args.append(None)
            elif v.id in tensors:
                args.append(tensors[v.id])
            else:
                if all(x.id != v.id for x in group_inputs):
                    group_inputs.append(v)
                    tensors[v.id] = placeholder(t.shape, t.dtype, f"in{len(group_inputs) - 1}")
                args.append(tensors[v.id])
        ctx = LowerCtx(node, opsets[id(node)], in_types, out_types, values[id(node)], target)
        try:
            res = lower_node(ctx, *args)
        except KilnError:
            raise
        except Exception as e:
            raise KilnError(f"lowering failed: {type(e).__name__}: {e}", node=node.name, op=node.op,
                            stage="lower") from e
        if isinstance(res, ExternKernel):
            if len(nodes) > 1:
                raise Unfusable("lowers to a hand-written kernel", node=node.name, op=node.op)
            return Kernel(extern_func(res, name, node, out_types, [a for a in args if a is not None]),
                          [v for v in node.inputs if v is not None], list(node.outputs), [node])
        if ctx.dynamic():
            ctx.fail("outputs have data-dependent sizes; the lowering must return "
                     "ctx.extern(..., dynamic=True)", stage="lower")
        outs = list(res) if isinstance(res, (list, tuple)) else [res]
        if len(outs) < len(node.outputs):
            ctx.fail(f"lowering returned {len(outs)} tensors for {len(node.outputs)} outputs", stage="lower")
        for j, (v, t, want) in enumerate(zip(node.outputs, outs, out_types)):
            if want is not None and (t.dtype != want.dtype or tuple(t.shape) != tuple(want.shape)):
                ctx.fail(f"lowering of output {j} gives {t.dtype}{list(t.shape)}, inference says {want}",
                         stage="lower")
            if v is not None:
                tensors[v.id] = t
            produced.append((v, t))
        if node is not anchor:
            helpers |= _created(outs, set(tensors.values()) - {t for t in outs})
        if node is anchor:
            schedule_fn = ctx.schedule_fn  # prologues precede it, an epilogue follows it
    last = nodes[-1]
    outputs = produced if len(nodes) == 1 else [
        (v, t) for v, t in produced
        if v is not None and (any(v is o for o in last.outputs) or needed_outside(v))]
    out_tensors = []
    for k, (v, t) in enumerate(outputs):
        if t.op is None or t in out_tensors:   # an input passed through, or a repeated output
            t = compute(t.shape, lambda *i, t=t: t[i], f"out{k}")
        out_tensors.append(t)
    sch = Schedule(out_tensors)
    for st in sch.stages:
        # a member's result read by the next member, or a stage of a member's own formula
        # (a `_let`): inlined, so the chain is one loop nest and the anchor's schedule, which
        # knows only its own stages, sees its result read by the final stage alone
        if len(nodes) > 1 and st.tensor not in out_tensors and not st.reduce_axis \
                and (any(st.tensor is t for _, t in produced) or st.tensor in helpers):
            st.compute_inline()
    # one node: its own schedule; a group: its anchor's, which then tiles the fused
    # epilogue's loops (kiln.lower.partition only fuses into anchors that can), else default
    anchored = len(nodes) == 1 or kind_of(anchor) >= Kind.REDUCTION
    if schedule_fn is not None and anchored:
        schedule_fn(sch, out_tensors)
    else:
        default_schedule(sch, out_tensors, target)
    params = [tensors[v.id] for v in group_inputs] + out_tensors
    return Kernel(lower(sch, params, name), group_inputs, [v for v, _ in outputs], list(nodes), sch.trace)


def _created(outs: list, known: set) -> set:
    """The compute tensors a lowering made: reachable from its results, short of `known`
    (placeholders and earlier members' results)."""
    seen: set = set()
    todo = [t for t in outs if t.op is not None]
    while todo:
        t = todo.pop()
        if t in seen or t in known or t.op is None:
            continue
        seen.add(t)
        todo.extend(t.inputs)
    return seen


def extern_func(ext: ExternKernel, name: str, node: Node, out_types, params: list) -> ExternFunc:
    """The loop-level function of a lowering's hand-written C kernel (see LowerCtx.extern)."""
    outs = [Buffer(f"out{k}", dt, tuple(shape)) for k, (shape, dt) in enumerate(ext.outputs)]
    if len(outs) != len(node.outputs):
        raise KilnError(f"extern kernel has {len(outs)} outputs, the node {len(node.outputs)}",
                        node=node.name, op=node.op, stage="lower")
    for k, (b, want) in enumerate(zip(outs, out_types)):
        if want is None:
            continue
        ok = b.dtype == want.dtype and (
            len(b.shape) == len(want.shape) if ext.dynamic else b.shape == tuple(want.shape))
        if not ok:
            raise KilnError(f"extern kernel output {k} is {b.dtype}{list(b.shape)}, inference says "
                            f"{want}", node=node.name, op=node.op, stage="lower")
    if ext.dynamic:
        rank = sum(len(b.shape) for b in outs)
        outs.append(Buffer(f"out{len(outs)}", DType.int64, (max(rank, 1),)))
    # params: every present node input in node order, whatever subset the C body reads
    ins = [Buffer(f"in{k}", p.dtype, tuple(p.shape)) for k, p in enumerate(params)]
    return ExternFunc(name, tuple(ins + outs), ext.c_body, ext.dynamic, ext.preamble,
                      tuple(ext.libs), tuple(ext.errors))
