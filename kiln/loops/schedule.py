"""Schedules say *how* a compute runs; every primitive call is recorded in a trace.

A `Schedule` holds one `Stage` per compute tensor reachable from its outputs. Stage
primitives (split, reorder, tile, fuse, vectorize, parallel, unroll, compute_at,
compute_inline) only edit the stage's iteration structure; the body is never changed,
so schedules preserve semantics by construction. Illegal requests raise KilnError
naming the stage and the axis.

The trace (`sch.trace`) is the schedule's one durable form (MetaSchedule's idea):
instructions refer to stages and axes by name, so `trace.replay(new_outputs)`
rebuilds the same schedule for a freshly built compute, and a tuner can edit the
decisions (split factors, ...) inside the instructions before replaying.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, replace

from kiln.errors import KilnError
from kiln.loops.compute import Tensor
from kiln.loops.expr import Expr, map_loads, reduce, reduce_identity, select, substitute, var, walk
from kiln.loops.symbols import ceildiv, static


@dataclass(frozen=True)
class Split:
    parent: Expr
    outer: Expr
    inner: Expr
    factor: int | None
    nparts: int | None


@dataclass(frozen=True)
class Fuse:
    outer: Expr
    inner: Expr
    fused: Expr


# -- the trace -------------------------------------------------------------------

@dataclass(frozen=True)
class AxisRef:
    stage: str
    name: str


@dataclass(frozen=True)
class StageRef:
    name: str


@dataclass(frozen=True)
class Inst:
    """One primitive call: `prim` on stage `stage` (None: a Schedule-level call)."""
    prim: str
    stage: str | None
    args: tuple

    def __str__(self):
        fmt = lambda a: f"{a.stage}.{a.name}" if isinstance(a, AxisRef) else a.name if isinstance(a, StageRef) \
            else f"({', '.join(map(fmt, a))})" if isinstance(a, tuple) else repr(a)  # noqa: E731
        return f"{self.stage + '.' if self.stage else ''}{self.prim}({', '.join(map(fmt, self.args))})"


@dataclass(frozen=True)
class Trace:
    """Primitive calls in order, and the named decisions (kiln.lower.decisions) the
    kernel's template took to make them: (name, value) pairs, in the order taken."""
    insts: tuple = ()
    decisions: tuple = ()

    def __str__(self):
        return "\n".join([f"decide({n!r}, {v!r})" for n, v in self.decisions] + list(map(str, self.insts)))

    def with_args(self, index: int, args: tuple) -> "Trace":
        """The same trace with instruction `index` given new args (a tuner's mutation)."""
        insts = list(self.insts)
        insts[index] = replace(insts[index], args=tuple(args))
        return Trace(tuple(insts), self.decisions)

    def replay(self, outputs) -> "Schedule":
        sch = Schedule(outputs)
        for inst in self.insts:
            target = sch if inst.stage is None else sch.stage(inst.stage)
            getattr(target, inst.prim)(*(sch._resolve(a) for a in inst.args))
        return sch


def _recorded(fn):
    """Record a primitive in the schedule's trace (only the outermost call)."""
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        bound = sig.bind(self, *args, **kwargs)
        bound.apply_defaults()
        args = bound.args[1:]
        sch = self if isinstance(self, Schedule) else self.sch
        depth = sch._depth
        sch._depth += 1
        try:
            out = fn(self, *args)
        finally:
            sch._depth = depth
        if depth == 0:
            stage = None if self is sch else self.name
            sch.insts.append(Inst(fn.__name__, stage, tuple(sch._ref(a) for a in args)))
        return out
    return wrapper


# -- stages ------------------------------------------------------------------------

class Stage:
    """The schedule of one compute tensor: root axes, split/fuse relations, leaf order,
    loop kinds and where it is computed (root, inline, or at a loop of another stage)."""

    def __init__(self, sch: "Schedule", tensor: Tensor, name: str, axis, body: Expr):
        self.sch, self.tensor, self.name = sch, tensor, name
        self.vars: dict = {}  # name -> var, every var this stage ever made
        old = list(axis) + list(body.arg[1] if body.op == "reduce" else ())
        fresh = [self._new_var(v.arg.name, v.arg.dom, v.arg.kind) for v in old]
        self.alias = dict(zip(old, fresh))
        self.body = _rename(body, self.alias)
        self.axis = fresh[:len(axis)]
        self.reduce_axis = fresh[len(axis):]
        self.leaves = list(fresh)
        self.relations: list = []
        self.kinds: dict = {}
        self.unroll_max: dict = {}
        self.prefetches: list = []   # (tensor, leaf, offset, next): see prefetch, prefetch_next
        self.attach = None  # None: root; "inline"; or (Stage, leaf var)

    def __repr__(self):
        return f"Stage({self.name})"

    def _new_var(self, name, dom, kind):
        base, k = name, 0
        while name in self.vars:
            k += 1
            name = f"{base}_{k}"
        self.vars[name] = v = var(name, dom=dom, kind=kind)
        return v

    def _err(self, msg, axis=None):
        where = f"stage {self.name!r}" + (f", axis {axis.arg.name!r}" if isinstance(axis, Expr) and axis.op == "var"
                                          else f", axis {axis!r}" if axis is not None else "")
        return KilnError(f"{where}: {msg}", stage="schedule")

    def _leaf(self, v, what="schedule") -> Expr:
        v = self.alias.get(v, v)
        if not isinstance(v, Expr) or v.op != "var" or v not in self.leaves:
            name = v.arg.name if isinstance(v, Expr) and v.op == "var" else v
            raise self._err(f"cannot {what}: axis {name!r} is not a loop of this stage "
                            f"(its loops are {[x.arg.name for x in self.leaves]})")
        return v

    def is_reduce(self, v: Expr) -> bool:
        return v.arg.kind == "reduce"

    @property
    def op_axis(self):
        return self.axis

    # -- loop structure ----------------------------------------------------------
    @_recorded
    def split(self, v, factor: int | None = None, nparts: int | None = None):
        """v -> (outer, inner) with inner extent `factor` (or outer extent `nparts`)."""
        v = self._leaf(v, "split")
        n = factor if nparts is None else nparts
        if (factor is None) == (nparts is None) or not isinstance(n, int) or n <= 0:
            raise self._err(f"split needs exactly one positive integer factor or nparts, got "
                            f"factor={factor!r} nparts={nparts!r}", v)
        ext = v.arg.dom[1]
        if not static(ext):   # a symbolic extent: tiles of `factor`, the last one guarded
            if factor is None:
                raise self._err("a symbolic extent splits by factor, not nparts", v)
            f = factor
        else:
            ext1 = max(ext, 1)  # a zero-length axis splits into empty loops
            f = min(factor, ext1) if factor else -(-ext1 // min(nparts, ext1))
        outer = self._new_var(f"{v.arg.name}.o", (0, ceildiv(ext, f)), v.arg.kind)
        inner = self._new_var(f"{v.arg.name}.i", (0, f), v.arg.kind)
        self.relations.append(Split(v, outer, inner, factor, nparts))
        i = self.leaves.index(v)
        self.leaves[i:i + 1] = [outer, inner]
        return outer, inner

    @_recorded
    def fuse(self, *vs):
        """Fuse consecutive loops (outer first) into one."""
        vs = [self._leaf(v, "fuse") for v in vs]
        if len(vs) < 2:
            return vs[0]
        pos = [self.leaves.index(v) for v in vs]
        if pos != list(range(pos[0], pos[0] + len(vs))):
            raise self._err(f"fuse needs consecutive loops in order, got {[v.arg.name for v in vs]}", vs[0])
        if len({self.is_reduce(v) for v in vs}) != 1:
            raise self._err("cannot fuse a reduction loop with a spatial loop", vs[0])
        fused = vs[0]
        for inner in vs[1:]:
            new = self._new_var(f"{fused.arg.name}.{inner.arg.name}.f",
                                (0, fused.arg.dom[1] * inner.arg.dom[1]), inner.arg.kind)
            self.relations.append(Fuse(fused, inner, new))
            fused = new
        self.leaves[pos[0]:pos[-1] + 1] = [fused]
        return fused

    @_recorded
    def reorder(self, *vs):
        """Put the given loops, in this order, into the positions they occupy."""
        vs = [self._leaf(v, "reorder") for v in vs]
        if len(set(vs)) != len(vs):
            raise self._err("reorder got the same axis twice")
        slots = sorted(self.leaves.index(v) for v in vs)
        for s, v in zip(slots, vs):
            self.leaves[s] = v

    @_recorded
    def tile(self, x, y, x_factor: int, y_factor: int):
        """2-D tiling: returns (xo, yo, xi, yi) in that loop order."""
        xo, xi = self.split(x, x_factor)
        yo, yi = self.split(y, y_factor)
        self.reorder(xo, yo, xi, yi)
        return xo, yo, xi, yi

    def _annotate(self, v, kind, allow_reduce):
        v = self._leaf(v, kind)
        if not allow_reduce and self.is_reduce(v):
            raise self._err(f"cannot make reduction axis {v.arg.name!r} {kind} "
                            f"(it carries a dependence; rfactor it first)", v)
        self.kinds[v] = kind
        return v

    @_recorded
    def vectorize(self, v):
        self._annotate(v, "vectorized", False)

    @_recorded
    def parallel(self, v):
        self._annotate(v, "parallel", False)

    @_recorded
    def unroll(self, v):
        self._annotate(v, "unrolled", True)

    @_recorded
    def prefetch(self, tensor, v, offset: int):
        """At each iteration of loop `v`, hint that the elements of `tensor` this stage reads
        `offset` iterations of `v` later will be needed soon (TVM's prefetch): one hint per
        distinct element the body reads over the unrolled loops inside `v` (the others at
        their first iteration, a vector loop's first lane: one element per vector), placed
        before those loops. A hint reads and writes nothing, so the result is unchanged; it
        lets a kernel that streams `tensor` (a conv's weights, read once from memory) ask for
        it ahead of its multiply-adds. `tensor`: a placeholder or a stage computed at the root."""
        leaf = self._leaf(v, "prefetch in it")
        tensor = tensor.tensor if isinstance(tensor, Stage) else tensor     # (a replayed trace names a stage)
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 1:
            raise self._err(f"prefetch needs a positive integer offset, got {offset!r}", leaf)
        if tensor not in self.reads():
            raise self._err(f"prefetch: this stage does not read {getattr(tensor, 'name', tensor)!r}", leaf)
        self.prefetches.append((tensor, leaf, offset, None))

    @_recorded
    def prefetch_next(self, tensor, v, dim: int, step: int, spread, by):
        """At each iteration of loop `v`, hint into L2 the element of `tensor` `step` further along
        its dimension `dim` than the one this stage reads there, with the unrolled loop `spread`
        inside `v` at one value per index of the stage's axis `by` (that index modulo the loop's
        extent) and the other loops inside `v` at their first iteration (a vector loop's first
        lane). A conv's register tile over a channel group's weights asks so for the next group's,
        one channel block per output row: they arrive from memory while the rows after the first
        multiply the weights already in cache, where without the hints the next group's first row
        waits for them."""
        leaf = self._leaf(v, "prefetch in it")
        spread = self._leaf(spread, "spread a prefetch over it")
        tensor = tensor.tensor if isinstance(tensor, Stage) else tensor
        by = self.alias.get(by, by)
        if by not in self.axis:
            raise self._err(f"prefetch_next: {getattr(getattr(by, 'arg', None), 'name', by)!r} is not an axis of "
                            "this stage", leaf)
        if self.leaves.index(spread) <= self.leaves.index(leaf) or self.kinds.get(spread) != "unrolled":
            raise self._err("prefetch_next: the spread loop must be an unrolled loop inside the hint's", spread)
        if tensor not in self.reads():
            raise self._err(f"prefetch: this stage does not read {getattr(tensor, 'name', tensor)!r}", leaf)
        if not 0 <= dim < len(tensor.shape) or not isinstance(step, int) or step < 1:
            raise self._err(f"prefetch_next: dimension {dim!r} of {len(tensor.shape)}, step {step!r} (positive)", leaf)
        self.prefetches.append((tensor, leaf, 0, (dim, step, spread, by)))

    # -- where the stage is computed ---------------------------------------------
    @_recorded
    def compute_at(self, parent, v):
        """Compute this stage inside loop `v` of `parent`, just the region it needs.

        Every stage that reads this one must be `parent` or already be computed at that
        same loop (consumers first): softmax's exp, read by the row sum and the divide,
        is computed per row beside the sum. The region is what all of them read."""
        parent = self.sch.stage(parent)
        if self.tensor in self.sch.outputs:
            raise self._err("an output cannot be computed at another stage's loop")
        if parent is self:
            raise self._err("cannot compute a stage at its own loop")
        leaf = parent._leaf(v, f"compute {self.name} at it")
        users = self.sch.consumers(self)
        if not users or not self.sch.encloses(users, parent, leaf):
            raise self._err(f"compute_at {parent.name}.{leaf.arg.name}: that loop does not enclose every use "
                            f"(read by {[u.name for u in users]}; each must be {parent.name!r} or be "
                            f"computed at that loop first)", leaf)
        if parent.attach == "inline":
            raise self._err(f"compute_at: stage {parent.name!r} is inlined")
        self.attach = (parent, leaf)

    @_recorded
    def compute_inline(self):
        if self.tensor in self.sch.outputs:
            raise self._err("an output cannot be inlined")
        if self.reduce_axis:
            raise self._err("a reduction cannot be inlined")
        if any(s.attach not in (None, "inline") and s.attach[0] is self for s in self.sch.stages):
            raise self._err("cannot inline a stage that other stages are computed at")
        self.attach = "inline"

    @_recorded
    def compute_root(self):
        self.attach = None

    # -- derived facts used by lowering -------------------------------------------------
    def reads(self) -> list:
        return list(dict.fromkeys(e.arg for e in walk(self.body) if e.op == "load"))


def _rename(body: Expr, alias: dict) -> Expr:
    """Rename vars, including the axes recorded inside a reduce node."""
    if body.op == "reduce":
        comb, axes = body.arg
        return Expr("reduce", body.dtype, (substitute(body.args[0], alias),),
                    (comb, tuple(alias.get(a, a) for a in axes)))
    return substitute(body, alias)


class Schedule:
    """A schedule over one or more output tensors (and every compute they read)."""

    def __init__(self, outputs):
        self.outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
        self.stages: list[Stage] = []
        self.insts: list[Inst] = []
        self._depth = 0
        used: set = set()
        for t in _topo(self.outputs):
            name, k = t.name, 0
            while name in used:
                k += 1
                name = f"{t.name}_{k}"
            used.add(name)
            self.stages.append(Stage(self, t, name, t.op.axis, t.op.body))

    @property
    def trace(self) -> Trace:
        return Trace(tuple(self.insts))

    def __getitem__(self, t) -> Stage:
        return self.stage(t)

    def stage(self, t) -> Stage:
        if isinstance(t, Stage):
            return t
        for s in self.stages:
            if s.tensor is t or s.name == t:
                return s
        name = getattr(t, "name", t)
        raise KilnError(f"{name!r} is not a compute stage of this schedule "
                        f"(stages: {[s.name for s in self.stages]})", stage="schedule")

    @staticmethod
    def encloses(users: list, parent: Stage, leaf: Expr) -> bool:
        """Whether loop `leaf` of `parent` encloses every use: each user is `parent` or is
        itself computed at that loop (compute_at's rule, checked again at lowering)."""
        return all(u is parent or u.attach == (parent, leaf) for u in users)

    def consumers(self, stage: Stage) -> list:
        """Stages whose computation reads `stage` (looking through inlined stages)."""
        out = []
        for s in self.stages:
            if stage.tensor in s.reads():
                for u in (self.consumers(s) if s.attach == "inline" else [s]):
                    if u not in out:
                        out.append(u)
        return out

    # -- trace plumbing ----------------------------------------------------------------
    def _ref(self, a):
        if isinstance(a, Stage):
            return StageRef(a.name)
        if isinstance(a, Tensor):
            return StageRef(self._tensor_name(a))
        if isinstance(a, Expr) and a.op == "var":
            for s in self.stages:
                if s.vars.get(a.arg.name) is a:
                    return AxisRef(s.name, a.arg.name)
            for s in self.stages:
                if a in s.alias:
                    return AxisRef(s.name, s.alias[a].arg.name)
            raise KilnError(f"axis {a.arg.name!r} belongs to no stage of this schedule", stage="schedule")
        if isinstance(a, (list, tuple)):
            return tuple(self._ref(x) for x in a)
        return a

    def _tensor_name(self, t):
        for s in self.stages:
            if s.tensor is t:
                return s.name
        return t.name

    def _resolve(self, a):
        if isinstance(a, StageRef):
            for s in self.stages:
                if s.name == a.name:
                    return s
            for t in self._placeholders():
                if t.name == a.name:
                    return t
            raise KilnError(f"trace replay: no stage {a.name!r}", stage="schedule")
        if isinstance(a, AxisRef):
            st = self.stage(a.stage)
            if a.name in st.vars:
                return st.vars[a.name]
            raise KilnError(f"trace replay: stage {a.stage!r} has no axis {a.name!r}", stage="schedule")
        if isinstance(a, tuple):
            return tuple(self._resolve(x) for x in a)
        return a

    def _placeholders(self):
        return [t for s in self.stages for t in s.reads() if isinstance(t, Tensor) and t.op is None]

    # -- stage-creating primitives -------------------------------------------------------
    def _insert(self, stage: Stage, index: int):
        self.stages.insert(index, stage)
        return stage

    def _unique(self, base):
        name, k, used = base, 0, {s.name for s in self.stages}
        while name in used:
            k += 1
            name = f"{base}_{k}"
        return name

    @_recorded
    def cache_read(self, tensor, readers):
        """Copy `tensor` into a new local tensor that `readers` read instead (packing)."""
        src = tensor.tensor if isinstance(tensor, Stage) else tensor
        readers = [self.stage(r) for r in (readers if isinstance(readers, (list, tuple)) else [readers])]
        for r in readers:
            if src not in r.reads():
                raise r._err(f"cache_read: stage does not read {src.name!r}")
        name = self._unique(f"{src.name}.local")
        axis = [var(f"ax{d}", dom=(0, n)) for d, n in enumerate(src.shape)]
        new = Tensor(name, src.dtype, src.shape, scope="local")
        stage = Stage(self, new, name, axis, src[tuple(axis)])
        first = min(self.stages.index(r) for r in readers)
        self._insert(stage, first)
        for r in readers:
            r.body = _map_body(r.body, lambda b, idx, e: new[idx] if b is src else e)
        return new

    @_recorded
    def cache_write(self, tensor):
        """Compute `tensor` into a local tensor first, then copy it out (register blocking)."""
        st = self.stage(tensor)
        if st.relations or st.kinds or st.leaves != st.axis + st.reduce_axis:
            raise st._err("cache_write must come before any other primitive on the stage")
        name = self._unique(f"{st.name}.local")
        new = Tensor(name, st.tensor.dtype, st.tensor.shape, scope="local")
        local = Stage(self, new, name, st.axis, st.body)
        self._insert(local, self.stages.index(st))
        # the user's reduce-axis handles now name the local stage's reduction loops
        local.alias = {orig: local.alias[v] for orig, v in st.alias.items() if v in st.reduce_axis}
        st.alias = {orig: v for orig, v in st.alias.items() if v not in st.reduce_axis}
        st.body = new[tuple(st.axis)]
        st.reduce_axis = []
        st.leaves = list(st.axis)
        return new

    @_recorded
    def rfactor(self, tensor, axis, factor_axis: int = 0):
        """Turn reduction loop `axis` of `tensor`'s stage into a spatial dim of a new tensor
        of partial results (at position factor_axis), which the stage then reduces.
        The partials' dim can then be parallelized or vectorized."""
        st = self.stage(tensor)
        axis = st._leaf(axis, "rfactor")
        if not st.is_reduce(axis):
            raise st._err("rfactor needs a reduction loop", axis)
        if st.kinds or any(not st.is_reduce(getattr(r, "parent", getattr(r, "outer", None))) for r in st.relations):
            raise st._err("rfactor must come before transforming the stage's spatial loops", axis)
        comb = st.body.arg[0]
        root_ext = {v: v.arg.dom[1] for v in st.axis + st.reduce_axis}
        ext, val = iteration_structure(st, root_ext)
        red_leaves = [v for v in st.leaves if st.is_reduce(v)]
        f = var("rf", dom=(0, ext[axis]))
        sp = [var(v.arg.name, dom=v.arg.dom) for v in st.axis]
        rs = {v: var(v.arg.name, dom=(0, ext[v]), kind="reduce") for v in red_leaves if v is not axis}
        leaf_map = {axis: f, **rs}
        env = dict(zip(st.axis, sp))
        conds = []
        for rv in st.reduce_axis:
            e = substitute(val[rv], leaf_map)
            env[rv] = e + rv.arg.dom[0]
            if ext[rv] != rv.arg.dom[1] or any(isinstance(r, Split) for r in st.relations):
                conds.append(e < rv.arg.dom[1])
        value = substitute(st.body.args[0], env)
        for c in conds:
            value = select(c, value, reduce_identity(comb, value.dtype))
        rf_axes = sp[:factor_axis] + [f] + sp[factor_axis:]
        body = reduce(comb, value, list(rs.values())) if rs else value
        name = self._unique(f"{st.name}.rf")
        shape = tuple(v.arg.dom[1] for v in rf_axes)
        rf = Tensor(name, st.tensor.dtype, shape)
        self._insert(Stage(self, rf, name, rf_axes, body), self.stages.index(st))
        k = st._new_var(f"{axis.arg.name}.rf", (0, ext[axis]), "reduce")
        st.body = reduce(comb, rf[tuple(st.axis[:factor_axis] + [k] + st.axis[factor_axis:])], k)
        st.reduce_axis, st.relations, st.leaves = [k], [], list(st.axis) + [k]
        st.alias = {o: v for o, v in st.alias.items() if not st.is_reduce(v)}
        return rf


def iteration_structure(stage: Stage, root_ext: dict):
    """Leaf extents given root extents, and each root/inner var as an expr of the leaves.
    Factors larger than the extent are clamped; non-divisible splits round up (lowering guards)."""
    ext = dict(root_ext)
    for r in stage.relations:
        if isinstance(r, Split):
            n = ext[r.parent]
            if not static(n):
                ext[r.outer], ext[r.inner] = ceildiv(n, r.factor), r.factor
            elif r.factor is not None:
                f = min(r.factor, n)
                ext[r.outer], ext[r.inner] = -(-n // f), f
            else:
                p = min(r.nparts, n)
                ext[r.outer], ext[r.inner] = p, -(-n // p)
        else:
            ext[r.fused] = ext[r.outer] * ext[r.inner]
    val = {v: v for v in stage.leaves}
    for r in reversed(stage.relations):
        if isinstance(r, Split):
            val[r.parent] = val[r.outer] * ext[r.inner] + val[r.inner]
        else:
            val[r.outer] = val[r.fused] // ext[r.inner]
            val[r.inner] = val[r.fused] % ext[r.inner]
    return ext, val


def _map_body(body: Expr, fn) -> Expr:
    if body.op == "reduce":
        return Expr("reduce", body.dtype, (map_loads(body.args[0], fn),), body.arg)
    return map_loads(body, fn)


def _topo(outputs) -> list:
    """Compute tensors reachable from outputs, producers first."""
    order, seen = [], set()

    def visit(t):
        if t in seen or t.op is None:
            return
        seen.add(t)
        for u in t.inputs:
            visit(u)
        order.append(t)

    for t in outputs:
        if not isinstance(t, Tensor) or t.op is None:
            raise KilnError(f"schedule outputs must be compute tensors, got {t!r}", stage="schedule")
        visit(t)
    return order
