"""A whole (specialised, statically shaped) graph → one loop-level module.

Three stages of kiln.compiler's pipeline live here, each a function with a typed
result: `lower_groups` (every fusion group of kiln.lower.partition as a kernel:
LoweredGroups), `plan_memory` (weights blob and workspace arena: MemoryPlan) and
`emit_module` (the kernels plus the entry function: LoweredModule).

Every fusion group (often one node) becomes one kernel; one entry function `main` runs
them in order:

    int32_t kiln_main(in_0.., out_0.., uint8 weights[], uint8 workspace[])

Constants live in one weights blob (bound once by the runtime), intermediates in
one workspace arena planned by liveness (`memory.plan_arena`), graph outputs are
written in place. A non-zero status from `main` names the failing call and its kernel's
status, which the runtime maps back to the node (`LoweredModule.call_nodes`) and to what
failed (`LoweredModule.call_errors`: a run-time check's message, an extern kernel's error).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from kiln.dtypes import DType
from kiln.errors import KilnError
from kiln.graph.deferred import byte_parts, settle_in
from kiln.graph.ir import Graph, Node, Value
from kiln.graph.types import TensorType
from kiln.loops import Buffer, Call, LoopModule, PrimFunc, compute, lower, placeholder, seq
from kiln.loops import Schedule, View
from kiln.lower.concat_parts import concat_parts
from kiln.lower.inplace import inplace_candidates
from kiln.lower.kernel import Kernel, Unfusable, lower_group, lowerable
from kiln.lower.partition import VIEW_OPS, FusionPlan, partition
from kiln.ops.layout import DOMAIN as LAYOUT_DOMAIN, keeps_bytes
from kiln.ops.tensor import contiguous_slice_offset
from kiln.lower.memory import ArenaPlan, Lifetime, plan_arena
from kiln.lower.schedules import default_schedule
from kiln.lower.workload import lower_with_workload, workload_decisions, workload_key
from kiln.codegen.strings import constant_kernel
from kiln.runtime.native import interface_text
from kiln.targets.target import Target

ALIGN = 64
ENTRY = "main"


@dataclass
class LoweredModule:
    module: LoopModule
    inputs: list[Value]
    outputs: list[Value]
    weights: np.ndarray                    # uint8 blob, every constant at its offset
    workspace_bytes: int
    arena: ArenaPlan
    call_nodes: list[str] = field(default_factory=list)  # call k -> "op node 'name'"
    call_errors: list[list] = field(default_factory=list)  # call k -> its kernel's [[status, message]..]
    fusion: FusionPlan | None = None
    weight_offsets: dict[int, int] = field(default_factory=dict)  # constant value id -> blob offset
    kernels: list[Kernel] = field(default_factory=list)  # the lowered kernels (traces, decisions)

    @property
    def decisions(self) -> dict[str, dict]:
        """kernel name -> the named decisions its template took (kiln.lower.decisions)."""
        return {k.func.name: dict(k.decisions) for k in self.kernels}


# Executed by the cpu target's runtime rather than as kernels: control flow, whose
# bodies are compiled natively, and sequence/optional containers, which only move
# references to arrays (kiln.targets.cpu.Staged). Everything that computes is native.
CONTROL_FLOW_OPS = {"If", "Loop", "Scan", "SequenceMap"}
CONTAINER_OPS = {"SequenceEmpty", "SequenceConstruct", "SequenceInsert", "SequenceAt", "SequenceErase",
                 "SequenceLength", "SplitToSequence", "ConcatFromSequence", "Optional",
                 "OptionalGetElement", "OptionalHasElement"}


def is_runtime_op(node: Node) -> bool:
    if node.domain:
        return False
    if node.op in CONTROL_FLOW_OPS or node.op in CONTAINER_OPS:
        return True
    # Identity of a sequence/optional is a container op too
    return node.op == "Identity" and not isinstance(node.outputs[0].type, TensorType)


def missing_lowerings(graph: Graph) -> list[tuple[str, str, str]]:
    """(domain, op, node name) for every node the cpu target cannot compile natively."""
    return [(n.domain, n.op, n.name) for _, n in graph.walk()
            if not is_runtime_op(n) and not lowerable(n)]


def check_lowerable(graph: Graph) -> None:
    missing = missing_lowerings(graph)
    if missing:
        lines = "\n".join(f"  {(d + '::') if d else ''}{op} at node {name!r}" for d, op, name in missing)
        ops = sorted({op for _, op, _ in missing})
        raise KilnError(f"{len(missing)} node(s) have no native lowering yet (ops: {', '.join(ops)}); "
                        f"target 'cpu' compiles every node natively and does not fall back:\n{lines}",
                        stage="lower")


def _nbytes(t: TensorType) -> int:
    return int(np.prod(t.shape, dtype=np.int64)) * t.dtype.itemsize


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass
class Step:
    """One call of the entry function: kernel `func` on `args` (per param: a graph value,
    or a scratch buffer for an output nobody reads)."""
    func: str
    args: list
    what: str                    # "op node 'name' + ..." for errors and reports
    offsets: dict = field(default_factory=dict)   # arg index -> bytes into its value (a view's)


@dataclass
class LoweredGroups:
    """Stage "lower each group": every fusion group as kernels, in call order."""
    kernels: list[Kernel]        # each kernel lowered, with its kept trace and decisions
    funcs: list                  # the functions emitted (identical kernels once)
    steps: list[Step]
    alias: dict[int, Value]      # a view op's output id -> the value whose bytes it reuses
    share: list[tuple[int, Value, Value]]   # (step, input, output) that may run in place
    out_params: list[Buffer]
    str_consts: dict[int, Value]  # string constants, written by a kernel of their own
    view_offsets: dict[int, int] = field(default_factory=dict)  # view id -> bytes into its alias

    @property
    def decisions(self) -> dict[str, dict]:
        """kernel name -> the named decisions its template took."""
        return {k.func.name: dict(k.decisions) for k in self.kernels}


@dataclass
class MemoryPlan:
    """Stage "plan memory": the weights blob and the workspace arena."""
    weights: np.ndarray                 # uint8 blob, every constant at its offset
    weight_offsets: dict[int, int]      # constant value id -> blob offset
    arena: ArenaPlan                    # keys: value ids and id(scratch buffer)


def check_static(graph: Graph) -> None:
    """Native code needs every graph input and output a tensor of static shape."""
    check_lowerable(graph)
    for v in graph.inputs + graph.outputs:
        if not isinstance(v.type, TensorType) or not v.type.is_static:
            raise KilnError(f"graph value %{v.name} has type {v.type}; native code needs static tensor "
                            "shapes (bind symbolic dims first)", stage="lower")


def lower_groups(graph: Graph, fusion: FusionPlan, known: dict[int, np.ndarray] | None = None,
                 target: Target | None = None, decisions: dict | None = None,
                 on_kernel=None) -> LoweredGroups:
    """Each fusion group as one kernel (or one per node, when a member must stand alone) for
    CPU `target` (None: this host), view ops as aliases, then the copies into graph outputs
    and the string constants; `decisions` overrides schedule decisions (kiln.lower.decisions).
    `on_kernel(func)` is called with each kernel's function as soon as it is lowered (the
    compiler starts building what it can while the rest is lowered)."""
    known = known or {}
    target = Target.of(target)
    kernels: list[Kernel] = []
    funcs: list = []
    steps: list[Step] = []
    consumers = graph.consumers()
    outputs_ids = {v.id for v in graph.outputs}
    views = {id(g): offs for g in fusion.groups if (offs := _view_chain(graph, g.nodes)) is not None}
    # Concats whose producers write their parts in place (kiln.lower.concat_parts): no kernel
    concats, alias, view_offsets = concat_parts(graph, fusion.groups, set(views), ALIGN)
    parts = set(alias)
    seen: dict[str, str] = {}      # kernel text (name left out) -> the kernel already emitted
    share: list[tuple[int, Value, Value]] = []
    for group in fusion.groups:
        if id(group) in concats:
            continue
        inside = {id(n) for n in group.nodes}
        offsets = views.get(id(group))
        if offsets is not None:   # views only: each output aliases its root value's bytes
            for n, off in zip(group.nodes, offsets):
                src = n.inputs[0]
                alias[n.outputs[0].id] = alias.get(src.id, src)
                view_offsets[n.outputs[0].id] = view_offsets.get(src.id, 0) + off
            continue

        def needed_outside(v, inside=inside):
            return v.id in outputs_ids or any(id(c) not in inside for c in consumers.get(v.id, []))

        for kernel in _lower_group_or_split(graph, group.nodes, known, needed_outside, len(funcs),
                                            target, decisions or {}):
            kernels.append(kernel)
            if on_kernel is not None:
                on_kernel(kernel.func)
            name = _dedup(kernel.func, funcs, seen)
            n_in = len(kernel.inputs)
            outs = [v if v is not None else Buffer(f"scratch{len(funcs)}_{j}", p.dtype, tuple(p.shape))
                    for j, (v, p) in enumerate(zip(kernel.outputs, kernel.func.params[n_in:]))]
            what = " + ".join(f"{n.op} node {n.name!r}" for n in kernel.nodes)
            if isinstance(kernel.func, PrimFunc):
                share += [(len(steps), a, b) for a, b in
                          inplace_candidates(kernel.nodes, kernel.inputs, kernel.outputs)]
            steps.append(Step(name, list(kernel.inputs) + outs, what))
    # steps read a view's root value instead of the view (same bytes, no copy)
    for st in steps:
        st.offsets = {i: view_offsets[a.id] for i, a in enumerate(st.args)
                      if isinstance(a, Value) and view_offsets.get(a.id)}
        st.args = [alias.get(a.id, a) if isinstance(a, Value) else a for a in st.args]
    # graph outputs not written by a kernel (inputs, constants, views, repeats) get a copy kernel
    kernel_written = {a.id for st in steps for a in st.args if isinstance(a, Value)}
    written: set[int] = set()
    out_params = []
    for i, v in enumerate(graph.outputs):
        p = Buffer(f"out_{i}", v.type.dtype, tuple(v.type.shape))
        out_params.append(p)
        producer_writes = any(v is o for n in graph.nodes for o in n.outputs) and \
            v.id not in alias and v.id in kernel_written
        if not producer_writes or v.id in written:
            name = f"copy_out{i}"
            funcs.append(_copy_kernel(name, v.type, target))
            steps.append(Step(name, [alias.get(v.id, v), p], f"copy to output {v.name!r}",
                              {0: view_offsets[v.id]} if view_offsets.get(v.id) else {}))
        written.add(v.id)

    # string constants are written by a kernel of their own (pointers to literals in the
    # library), first thing in every run: the weights blob holds bytes, not pointers
    str_consts = {a.id: a for st in steps for a in st.args
                  if isinstance(a, Value) and a.is_const and a.type.dtype is DType.string}
    for k, v in enumerate(str_consts.values()):
        name = f"const_str{k}"
        funcs.append(constant_kernel(name, v.const))
        steps.insert(k, Step(name, [v], f"string constant {v.name!r}"))
    # (share's step indices count kernels only, so with string constants in front no pair
    # matches its step and nothing runs in place: conservative, as it always was)
    # an offset view's reader may not write over it in place: its bytes start inside its root's;
    # nor may a Concat's part take another value's bytes, or give its own (they are the Concat's)
    share = [(k, a, b) for k, a, b in share if not view_offsets.get(a.id) and a.id not in parts
             and b.id not in parts]
    return LoweredGroups(kernels, funcs, steps, alias, share, out_params, str_consts, view_offsets)


def plan_memory(graph: Graph, lowered: LoweredGroups, place=None) -> MemoryPlan:
    """Constants into one weights blob; every intermediate value and scratch output into one
    workspace arena, by liveness over the steps (in place where a kernel may overwrite a dead
    input). Inputs, constants and values written straight into output params need none.
    `place(nbytes, pieces)`: where the blob is made (`weights_blob`; default: memory)."""
    steps, alias = lowered.steps, lowered.alias
    weights, offsets = weights_blob(lowered, place)
    first, last, size = lifetimes(graph, lowered, _nbytes, lambda b: b.nbytes)

    def root_id(v):
        return alias.get(v.id, v).id

    def read_once(k, rid):   # not also read through another view of the same bytes
        return sum(isinstance(x, Value) and x.id == rid for x in steps[k].args) == 1
    pairs = [(root_id(a), b.id) for k, a, b in lowered.share
             if last.get(root_id(a)) == k and first.get(b.id) == k and read_once(k, root_id(a))]
    arena = plan_arena([Lifetime(k, size[k], first[k], last[k]) for k in first], ALIGN, pairs)
    return MemoryPlan(weights, offsets, arena)


def weights_blob(lowered: LoweredGroups, place=None) -> tuple[np.ndarray, dict[int, int]]:
    """Every constant the steps read, in one uint8 blob: (blob, value id -> byte offset).
    `place(nbytes, pieces)` makes the blob of `nbytes` from `pieces`, [(offset, uint8 array
    or kiln.graph.deferred.Deferred)] in offset order, zeros between and after them:
    `in_memory` by default; the module cache's kiln.targets.cache.WeightsFile writes them into
    its file while the C compiler runs. A constant whose data is still deferred (Winograd's
    transformed weights) is made there, part by part, never whole in memory."""
    steps, str_consts = lowered.steps, lowered.str_consts
    offsets, pieces, size = {}, [], 0
    for st in steps:
        for a in st.args:
            if isinstance(a, Value) and a.is_const and a.id not in offsets and a.id not in str_consts:
                if a.type.dtype.c_storage is None:  # bfloat16, float8, int4.. are bytes as numpy's
                    raise KilnError(f"constant %{a.name} has dtype {a.type.dtype}, which the C backend "
                                    "cannot handle", stage="lower")
                offsets[a.id] = size
                data = a.deferred
                data = np.ascontiguousarray(a.const).reshape(-1).view(np.uint8) if data is None else data
                pieces.append((size, data))
                size = _align(size + data.nbytes)
    return (place or in_memory)(max(size, ALIGN), pieces), offsets


def in_memory(nbytes: int, pieces: list) -> np.ndarray:
    """A zeroed blob of `nbytes` with each piece copied once into its place (appending to a
    bytearray copied a model's weights four times: 0.5 s of a 90 MB encoder's compile)."""
    blob = np.zeros(nbytes, np.uint8)
    for offset, b in pieces:
        for at, part in byte_parts(b):
            blob[offset + at:offset + at + part.size] = part
        settle_in(b, blob, offset)
    return blob


def lifetimes(graph: Graph, lowered: LoweredGroups, value_bytes, buffer_bytes) -> tuple[dict, dict, dict]:
    """What the workspace arena holds: per key (a value id, or id() of a scratch buffer) its
    first and last step and its size (`value_bytes(TensorType)`, `buffer_bytes(Buffer)`: ints,
    or size expressions for a shape-generic module). Inputs, constants and values written
    straight into output params are not in it."""
    steps, str_consts = lowered.steps, lowered.str_consts
    in_ids = {v.id for v in graph.inputs}
    out_ids = {v.id for v in graph.outputs}
    outs = set(lowered.out_params)
    first: dict = {}
    last: dict = {}
    size: dict = {}
    for k, st in enumerate(steps):
        for a in st.args:
            if isinstance(a, Value):
                if a.id not in str_consts and (a.is_const or a.id in in_ids or a.id in out_ids):
                    continue
                key, nbytes = a.id, value_bytes(a.type)
            elif a in outs:
                continue
            else:
                key, nbytes = id(a), buffer_bytes(a)
            first.setdefault(key, k)
            last[key] = k
            size[key] = nbytes
    return first, last, size


def emit_module(graph: Graph, lowered: LoweredGroups, memory: MemoryPlan,
                fusion: FusionPlan | None = None) -> LoweredModule:
    """The loop-level module: every kernel, and the entry function calling them in order on
    the inputs, outputs, weights blob and workspace arena."""
    steps, plan, offsets = lowered.steps, memory.arena, memory.weight_offsets
    # a kernel run in place reads and writes the same bytes: its params may not be restrict
    inplace_funcs = {steps[k].func for k, a, b in lowered.share
                     if (lowered.alias.get(a.id, a).id, b.id) in plan.inplace}
    funcs = [dataclasses.replace(f, noalias=False) if f.name in inplace_funcs else f for f in lowered.funcs]
    wbuf = Buffer("weights", DType.uint8, (max(len(memory.weights), 1),))
    abuf = Buffer("workspace", DType.uint8, (max(plan.total, ALIGN),))
    in_params = {v.id: Buffer(f"in_{i}", v.type.dtype, tuple(v.type.shape)) for i, v in enumerate(graph.inputs)}
    out_of: dict[int, Buffer] = {}
    for i, v in enumerate(graph.outputs):
        out_of.setdefault(v.id, lowered.out_params[i])
    outs = set(lowered.out_params)

    def arg(a):
        if not isinstance(a, Value) and a in outs:
            return a
        if isinstance(a, Value):
            if a.id in in_params:
                return in_params[a.id]
            if a.id in lowered.str_consts:
                return View(abuf, plan.offsets[a.id])
            if a.is_const:
                return View(wbuf, offsets[a.id])
            if a.id in out_of:
                return out_of[a.id]
            return View(abuf, plan.offsets[a.id])
        return View(abuf, plan.offsets[id(a)])

    def shifted(a, nbytes):
        return a if not nbytes else View(a.buffer, a.byte_offset + nbytes) if isinstance(a, View) \
            else View(a, nbytes)

    calls = [Call(st.func, tuple(shifted(arg(a), st.offsets.get(i, 0)) for i, a in enumerate(st.args)))
             for st in steps]
    params = tuple(in_params[v.id] for v in graph.inputs) + tuple(lowered.out_params) + (wbuf, abuf)
    entry = PrimFunc(ENTRY, params, seq(*calls), noalias=False)
    module = LoopModule(funcs + [entry], entry=ENTRY, interface=interface_text(
        [(v.type.shape, v.type.dtype.name) for v in graph.inputs],
        [(v.type.shape, v.type.dtype.name) for v in graph.outputs], int(abuf.shape[0]), len(memory.weights)))
    errors = [[list(e) for e in module[st.func].errors] for st in steps]
    return LoweredModule(module, list(graph.inputs), list(graph.outputs), memory.weights,
                         int(abuf.shape[0]), plan, [st.what for st in steps], errors, fusion,
                         memory.weight_offsets, lowered.kernels)


def _dedup(func, funcs: list, seen: dict[str, str]) -> str:
    """Identical kernels (same code, other buffers: repeated layers) are emitted once."""
    text = str(func).replace(func.name, "", 1)
    if text not in seen:
        seen[text] = func.name
        funcs.append(func)
    return seen[text]


def _view_chain(graph: Graph, nodes: list[Node]) -> list[int] | None:
    """Per node, the byte offset of its output in its input, when every node of a group is a
    view of the one before it (None: the group needs a kernel): reshape-like ops and layout
    conversions that move nothing at 0, a Slice whose result is one contiguous run of its
    input at that run's start."""
    offsets = []
    for k, n in enumerate(nodes):
        if k and (not n.inputs or n.inputs[0] is not nodes[k - 1].outputs[0]):
            return None
        if _is_view(n):
            offsets.append(0)
            continue
        off = _slice_view_offset(graph, n)
        if off is None:
            return None
        offsets.append(off)
    return offsets


def _slice_view_offset(graph: Graph, node: Node) -> int | None:
    """Bytes into its input at which a Slice's result starts, when it is one contiguous run of
    a statically shaped input (kiln.ops.tensor.contiguous_slice_offset); else None."""
    if node.op != "Slice" or (node.domain or "") != "" or len(node.outputs) != 1 or node.inputs[0] is None:
        return None
    x, y = node.inputs[0].type, node.outputs[0].type
    if not (isinstance(x, TensorType) and isinstance(y, TensorType) and x.dtype == y.dtype and x.is_static
            and y.is_static):
        return None
    if graph.opset("") < 10:
        starts, ends, axes, steps = node.attrs.get("starts"), node.attrs.get("ends"), node.attrs.get("axes"), None
    else:
        params = [v for v in node.inputs[1:5]]
        if any(v is not None and v.const is None for v in params):
            return None
        starts, ends, axes, steps = ([int(i) for i in np.asarray(v.const).reshape(-1)] if v is not None else None
                                     for v in params + [None] * (4 - len(params)))
    if starts is None or ends is None:
        return None
    off = contiguous_slice_offset(tuple(x.shape), [int(i) for i in starts], [int(i) for i in ends],
                                  None if axes is None else [int(i) for i in axes],
                                  None if steps is None else [int(i) for i in steps])
    return None if off is None else off * x.dtype.itemsize


def _is_view(node: Node) -> bool:
    """Ops that only reinterpret a contiguous buffer's shape: they need no kernel. So do layout
    conversions that move no element (kiln.ops.layout.keeps_bytes)."""
    if not node.inputs or node.inputs[0] is None or len(node.outputs) != 1 or node.outputs[0] is None:
        return False
    a, b = node.inputs[0].type, node.outputs[0].type
    if not (isinstance(a, TensorType) and isinstance(b, TensorType) and a.dtype == b.dtype):
        return False
    if node.domain == LAYOUT_DOMAIN and keeps_bytes(node.op, a, b):
        return True
    return (node.domain or "", node.op) in VIEW_OPS


def _lower_group_or_split(graph: Graph, nodes: list[Node], known, needed_outside, start: int,
                          target: Target, decisions: dict):
    """Lower a fusion group as one kernel; if a member can only stand alone, one kernel per node."""
    def one(ns, k):
        # (a constant's data still deferred is passed as such: made if the lowering reads it)
        values = {id(n): [None if v is None else (v.data if v.is_const else known.get(v.id))
                          for v in n.inputs] for n in ns}
        opsets = {id(n): graph.opset(n.domain) for n in ns}
        name = f"k{k}_{ns[-1].op}"
        # overrides for this workload (a tuning record's, kiln.tune.apply), under the kernel's own
        own = workload_decisions(decisions, ns, opsets, values, needed_outside)
        if own is not None:
            return lower_with_workload(lambda d: lower_group(ns, opsets, values, needed_outside, name, target, d),
                                       name, decisions, own)
        return lower_group(ns, opsets, values, needed_outside, name, target, decisions)
    try:
        return [one(nodes, start)]
    except Unfusable:
        return [one([n], start + i) for i, n in enumerate(nodes)]


def _copy_kernel(name: str, t: TensorType, target: Target) -> PrimFunc:
    src = placeholder(t.shape, t.dtype, "src")
    dst = compute(t.shape, lambda *i: src[i], "dst") if t.shape else compute((), lambda: src[()], "dst")
    sch = Schedule(dst)
    default_schedule(sch, [dst], target)
    return lower(sch, [src, dst], name)


@dataclass
class GroupInputs:
    """What lowering one fusion group again takes (kiln.tune re-lowers groups with other decisions)."""
    index: int                   # the group's position in the partition
    nodes: list[Node]
    opsets: dict
    values: dict
    needed_outside: object

    def key(self) -> str:
        return workload_key(self.nodes, self.opsets, self.values, self.needed_outside)


def group_inputs(graph: Graph, known: dict) -> list[GroupInputs]:
    """Each fusion group of a static graph that becomes a kernel (views left out)."""
    consumers = graph.consumers()
    outputs = {v.id for v in graph.outputs}
    out = []
    for k, group in enumerate(partition(graph, fuse_anchors=True).groups):
        if _view_chain(graph, group.nodes) is not None:
            continue
        inside = {id(n) for n in group.nodes}

        def needed_outside(v, inside=inside):
            return v.id in outputs or any(id(c) not in inside for c in consumers.get(v.id, []))
        values = {id(n): [None if v is None else (v.const if v.const is not None else known.get(v.id))
                          for v in n.inputs] for n in group.nodes}
        opsets = {id(n): graph.opset(n.domain) for n in group.nodes}
        out.append(GroupInputs(k, list(group.nodes), opsets, values, needed_outside))
    return out


def group_keys(graph: Graph, known: dict) -> list[str]:
    """The workload keys a static graph's kernels may have: each fusion group's, and each
    member's alone (a group whose member must stand alone is lowered node by node)."""
    keys = []
    for g in group_inputs(graph, known):
        keys.append(g.key())
        if len(g.nodes) > 1:
            keys += [workload_key([n], g.opsets, g.values, g.needed_outside) for n in g.nodes]
    return keys
