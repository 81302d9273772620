"""Control flow: If, Loop, Scan — ops whose semantics run body graphs.

Bodies are `Graph`s in node attributes; they are inferred through
`ctx.infer_subgraph` and run through `ctx.run_subgraph`. Loop-carried and scan
state types are inferred to a fixed point (dims that change across iterations
become symbols), so every body node's inferred type holds on every iteration.
"""

from __future__ import annotations

import numpy as np

from kiln.errors import KilnError
from kiln.limits import check_memory, check_trips
from kiln.limits import current as current_limits

from kiln.graph.types import TensorType, Type
from kiln.ops.registry import OPAQUE, op
from kiln.ops.sequence import BOOL, I64, join_types
from kiln.ops.shapes import normalize_axis


def _stacked(ctx, t: Type, n, axis: int = 0) -> TensorType:
    """Type of `n` per-iteration values of type `t` stacked along a new `axis`."""
    if not isinstance(t, TensorType):
        ctx.fail(f"scan outputs must be tensors, the body gives {t}")
    if t.shape is None:
        return t
    dims = list(t.shape)
    dims.insert(normalize_axis(ctx, axis, len(dims) + 1, "scan output axis"), n)
    return TensorType(t.dtype, tuple(dims))


def node_results(ctx, outs):
    """Per-output values as the interpreter takes them: a lone output (maybe a list) bare."""
    outs = list(outs)
    return outs[0] if ctx.num_outputs == 1 else tuple(outs)


def _check_count(ctx, what: str, got: int, want: int):
    if got != want:
        ctx.fail(f"{what}: expected {want}, given {got}")


def _fixpoint(ctx, body, head: list[Type], state: list[Type], tail: list[Type],
              skip: int) -> list[Type]:
    """Infer `body(*head, *state, *tail)` whose outputs from index `skip` on feed `state` back.

    Repeats with joined state types until they stop changing; returns the body
    output types of the last (most general) inference.
    """
    keep: set = set()
    for _ in range(8):
        outs = ctx.infer_subgraph(body, [*head, *state, *tail])
        fed = outs[skip:skip + len(state)]
        new = []
        for s, o in zip(state, fed):
            j = join_types(ctx, s, o, "loop-carried value", frozenset(keep))
            keep.update(d for d in getattr(j, "shape", None) or () if isinstance(d, str))
            new.append(j)
        if new == state:
            return outs
        state = new
    ctx.fail("loop-carried types do not settle")


# ---- If ----

def _infer_if(ctx):
    cond = ctx.tensor(0)
    if cond.is_static and int(np.prod(cond.shape)) != 1:
        ctx.fail(f"condition must hold a single element, got shape {cond.shape}")
    branches = [ctx.attr("then_branch"), ctx.attr("else_branch")]
    types, errors = [], []
    for name, g in zip(("then_branch", "else_branch"), branches):
        _check_count(ctx, f"{name} inputs", len(g.inputs), 0)
        try:  # a branch may be invalid for shapes under which it is never taken
            t = ctx.infer_subgraph(g, [])
        except KilnError as e:
            types.append(None)
            errors.append(e)
            continue
        _check_count(ctx, f"{name} outputs (one per node output)", len(t), ctx.num_outputs)
        types.append(t)
    known = ctx.value(0)
    if known is not None and known.size == 1:
        taken = 0 if known.reshape(-1)[0] else 1
        if types[taken] is None:
            raise errors[0]
        return types[taken]
    if types[0] is None or types[1] is None:
        if errors and len(errors) == 2:
            raise errors[0]
        return types[0] or types[1]
    return [join_types(ctx, a, b, f"output {i} of the two branches")
            for i, (a, b) in enumerate(zip(*types))]


@op("If", infer=_infer_if, fusion=OPAQUE)
def if_(ctx, cond):
    if np.size(cond) != 1:
        ctx.fail(f"condition must hold a single element, got shape {np.shape(cond)}")
    branch = "then_branch" if np.asarray(cond).reshape(-1)[0] else "else_branch"
    return node_results(ctx, ctx.run_subgraph(ctx.attr(branch), []))


# ---- Loop ----

def _loop_counts(ctx, body):
    n = ctx.num_inputs - 2
    _check_count(ctx, "body inputs (iteration, cond, loop-carried values)", len(body.inputs), n + 2)
    k = len(body.outputs) - 1 - n
    if k < 0 or ctx.num_outputs > n + k:
        ctx.fail(f"body gives {len(body.outputs)} outputs for {n} loop-carried values; "
                 f"the node has {ctx.num_outputs} outputs")
    return n, k


def _infer_loop(ctx):
    body = ctx.attr("body")
    n, k = _loop_counts(ctx, body)
    for i, what in ((0, "trip count M"), (1, "cond")):
        if ctx.has_input(i) and ctx.shape(i) not in (None, (), (1,)):
            ctx.fail(f"{what} must be a scalar, got shape {ctx.shape(i)}")
    outs = _fixpoint(ctx, body, [I64, BOOL], [ctx.type(i) for i in range(2, 2 + n)], [], 1)
    m = ctx.value(0)
    known = m is not None and not ctx.has_input(1)  # a for loop of constant length
    trips = max(int(m.reshape(-1)[0]), 0) if known else ctx.new_dim()
    return [*outs[1:1 + n], *(_stacked(ctx, t, trips) for t in outs[1 + n:])]


@op("Loop", infer=_infer_loop, fusion=OPAQUE)
def loop(ctx, m=None, cond=None, *carried):
    """A for/while loop.

    As the spec's table says, with M given and no cond input the body's cond is
    ignored (a for loop; ONNX Runtime stops on it anyway). With neither, the
    body's cond ends the loop, rather than the spec's loop that never ends.
    """
    body = ctx.attr("body")
    n, k = _loop_counts(ctx, body)
    trips = None if m is None else int(np.asarray(m).reshape(-1)[0])
    go = True if cond is None else bool(np.asarray(cond).reshape(-1)[0])
    carried, scans, i, scan_bytes = list(carried), [[] for _ in range(k)], 0, 0
    if cond is None and trips is not None:  # a for loop: its length is known now
        _check_trips(ctx, trips, "trip count M")
    cap = current_limits().max_trip_count
    while go and (trips is None or i < trips):
        if i >= cap:  # a while loop (or M with a cond) still going at the limit
            _check_trips(ctx, i + 1, "the loop is still running after")
        outs = ctx.run_subgraph(body, [np.array(i, np.int64), np.array(go), *carried])
        if cond is not None or trips is None:
            go = bool(np.asarray(outs[0]).reshape(-1)[0])
        carried = list(outs[1:1 + n])
        for s, v in zip(scans, outs[1 + n:]):
            s.append(v)
            scan_bytes += getattr(v, "nbytes", 0)
        if k:
            check_memory(scan_bytes, "the stacked scan outputs", node=ctx.node.name, op=ctx.node.op)
        i += 1
    types = ctx.output_types[n:]
    return node_results(ctx, [*carried, *(np.stack(s) if s else _empty(types[j])
                                          for j, s in enumerate(scans))])


def _check_trips(ctx, count: int, what: str) -> None:
    check_trips(count, what, node=ctx.node.name, op=ctx.node.op)


def _empty(t: TensorType | None) -> np.ndarray:
    """A zero-iteration scan output: length 0, unknown element dims as 0."""
    shape = (0,) if t is None or t.shape is None else tuple(
        d if isinstance(d, int) else 0 for d in (0, *t.shape[1:]))
    return np.zeros(shape, t.dtype.np if t is not None else np.float32)


# ---- Scan ----

def _scan_attrs(ctx, m: int, k: int):
    """Per scan input/output: (axes, reverse flags), defaulting to axis 0 forward."""
    def get(name, count, default):
        v = list(ctx.attr(name, [default] * count))
        _check_count(ctx, f"length of {name}", len(v), count)
        return v
    if ctx.opset < 9:  # axes of the per-batch values (batch axis stripped)
        return [0] * m, get("directions", m, 0), [0] * k, [0] * k
    return (get("scan_input_axes", m, 0), get("scan_input_directions", m, 0),
            get("scan_output_axes", k, 0), get("scan_output_directions", k, 0))


def _scan_split(ctx):
    """(body, first state input index, number of states N, scan inputs M, scan outputs K)."""
    body = ctx.attr("body")
    first = 1 if ctx.opset < 9 else 0
    m = ctx.attr("num_scan_inputs")
    n = ctx.num_inputs - first - m
    if n < 0:
        ctx.fail(f"num_scan_inputs={m} but the node has {ctx.num_inputs - first} inputs")
    _check_count(ctx, "body inputs (states and scan inputs)", len(body.inputs), n + m)
    k = len(body.outputs) - n
    if k < 0:
        ctx.fail(f"body gives {len(body.outputs)} outputs for {n} states")
    return body, first, n, m, k


def _infer_scan(ctx):
    body, first, n, m, k = _scan_split(ctx)
    in_axes, _, out_axes, _ = _scan_attrs(ctx, m, k)
    ins = [ctx.tensor(i) if i >= first + n else ctx.type(i) for i in range(first, ctx.num_inputs)]
    batched = ctx.opset < 9
    if batched:  # opset 8: every state and scan input has a leading batch axis the body never sees
        batch = next((t.shape[0] for t in ins if t.shape), ctx.new_dim())
        ins = [TensorType(t.dtype, t.shape and t.shape[1:]) for t in ins]
    steps, slices = None, []
    for t, a in zip(ins[n:], in_axes):
        if t.shape is None:
            slices.append(t)
            continue
        ax = normalize_axis(ctx, a, len(t.shape), "scan input axis")
        steps = t.shape[ax] if steps is None or isinstance(steps, str) else steps
        slices.append(TensorType(t.dtype, t.shape[:ax] + t.shape[ax + 1:]))
    outs = _fixpoint(ctx, body, [], ins[:n], slices, 0)
    steps = ctx.new_dim() if steps is None else steps
    res = list(outs[:n]) + [_stacked(ctx, t, steps, out_axes[j]) for j, t in enumerate(outs[n:])]
    return [_stacked(ctx, t, batch) for t in res] if batched else res


@op("Scan", infer=_infer_scan, fusion=OPAQUE)
def scan(ctx, *inputs):
    body, first, n, m, k = _scan_split(ctx)
    if ctx.opset >= 9:
        return node_results(ctx, _scan_one(ctx, body, list(inputs[:n]), list(inputs[n:]), n, m, k))
    lens, batch = inputs[0], inputs[1].shape[0] if inputs[1:] else 0
    per = []
    for b in range(batch):
        xs = [x[b] for x in inputs[1:]]
        t = None if lens is None else int(lens[b])
        per.append(_scan_one(ctx, body, xs[:n], [x[:t] for x in xs[n:]], n, m, k,
                             pad=xs[n].shape[0] if m else 0))
    return node_results(ctx, [np.stack(r) for r in zip(*per)])


def _scan_one(ctx, body, states, xs, n, m, k, pad=None):
    """One unbatched scan; `pad` zero-pads scan outputs to that many steps (opset-8 lengths)."""
    in_axes, in_rev, out_axes, out_rev = _scan_attrs(ctx, m, k)
    xs = [np.moveaxis(x, normalize_axis(ctx, a, x.ndim, "scan input axis"), 0)
          for x, a in zip(xs, in_axes)]
    steps = {x.shape[0] for x in xs}
    if len(steps) > 1:
        ctx.fail(f"scan inputs differ in scan-axis length: {sorted(steps)}")
    steps = steps.pop() if steps else 0
    xs = [x[::-1] if r else x for x, r in zip(xs, in_rev)]
    ys = [[] for _ in range(k)]
    _check_trips(ctx, steps, "scan length")
    for t in range(steps):
        outs = ctx.run_subgraph(body, [*states, *(x[t] for x in xs)])
        states = list(outs[:n])
        for y, v in zip(ys, outs[n:]):
            y.append(v)
        if k and t == 0:  # every step's outputs have the first step's size
            check_memory(steps * sum(getattr(y[0], "nbytes", 0) for y in ys), "the stacked scan outputs",
                         node=ctx.node.name, op=ctx.node.op)
    types = ctx.output_types[n:]
    res = []
    for j, y in enumerate(ys):
        arr = np.stack(y) if y else _empty(types[j] if ctx.opset >= 9 else None)
        if pad is not None and arr.shape[0] < pad:
            arr = np.concatenate([arr, np.zeros((pad - arr.shape[0], *arr.shape[1:]), arr.dtype)])
        arr = arr[::-1] if out_rev[j] else arr
        axis = normalize_axis(ctx, out_axes[j], arr.ndim, "scan output axis")
        res.append(np.moveaxis(arr, 0, axis))
    return [*states, *res]
