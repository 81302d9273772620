"""Lowering a Schedule to a loop nest: bound inference, guards, init/update nests.

Pipeline (each step a small function):
  1. inline: substitute inlined stages' bodies into their readers;
  2. for each stage computed at the root (producers first) build its nest; a stage
     computed at loop L of a consumer is built inside L over just the region the
     consumer reads (symbolic interval analysis over the loops inside L), into a
     local buffer indexed relative to the region's start;
  3. non-divisible splits are guarded (`if (root < extent)`) unless provably safe;
  4. intermediates computed at the root get a heap allocation;
  5. the loop simplifier cleans indices and drops extent-1 loops.
"""

from __future__ import annotations

import itertools
import math

from kiln.dtypes import DType
from kiln.errors import KilnError
from kiln.loops import stmt as S
from kiln.loops.hoist import hoist_checks
from kiln.loops.expr import (Expr, const, map_loads, max_, min_, prefetch, rebuild, reduce_identity, substitute,
                             walk)
from kiln.loops.schedule import Schedule, Split, Stage, iteration_structure
from kiln.loops.simplify import Ctx, prove, simplify_stmt
from kiln.loops.symbols import UNBOUNDED, static

ZERO = const(0, DType.int64)
TILE_MAX = 1 << 16   # a region of a symbolic dim bounded by this many elements is a static tile


def combine(comb: str, acc: Expr, v: Expr) -> Expr:
    return {"sum": lambda: acc + v, "prod": lambda: acc * v,
            "max": lambda: max_(acc, v), "min": lambda: min_(acc, v)}[comb]()


def _conj(conds):
    out = None
    for c in conds:
        out = c if out is None else Expr("and", DType.bool, (out, c))
    return out


class _Lowering:
    def __init__(self, sch: Schedule, params):
        self.sch = sch
        self.params = list(params)
        self.ranges: dict = {}                       # every loop var -> (0, extent-1)
        live = [s for s in sch.stages if s.attach != "inline"]
        self.bodies = self._inline(sch)
        self.attached: dict = {}                     # (stage, leaf) -> [stages], producers first
        for s in live:
            if s.attach is not None:
                parent, leaf = s.attach
                if parent.attach == "inline" or leaf not in parent.leaves:
                    raise KilnError(f"stage {s.name!r} is computed at {parent.name}.{leaf.arg.name}, "
                                    f"which is no longer a loop", stage="lower")
                self.attached.setdefault((parent, leaf), []).append(s)
        self.roots = [s for s in live if s.attach is None]
        self.local: dict = {}                        # attached stage -> its local Buffer
        self.domains: dict = {}                      # attached stage -> its region domain
        self.sibling_reads: dict = {}                # attached stage -> [(sibling, buffer, region starts)]
        for s in live:
            if s.attach is not None:
                users = sch.consumers(s)
                if not sch.encloses(users, *s.attach):
                    raise KilnError(f"stage {s.name!r} is computed at {s.attach[0].name}.{s.attach[1].arg.name}, "
                                    f"which does not enclose every use (read by {[u.name for u in users]})",
                                    stage="lower")

    @staticmethod
    def _inline(sch):
        bodies, inl = {}, {}

        def fn(buf, idx, e):
            if buf in inl:
                axis, body = inl[buf]
                return substitute(body, dict(zip(axis, idx)))
            return rebuild(e, idx)

        for s in sch.stages:
            b = s.body
            if b.op == "reduce":
                b = Expr("reduce", b.dtype, (map_loads(b.args[0], fn),), b.arg)
            else:
                b = map_loads(b, fn)
            bodies[s] = b
            if s.attach == "inline":
                inl[s.tensor] = (s.axis, b)
        return bodies

    # -- iteration structure -------------------------------------------------------
    def structure(self, stage: Stage, root_ext: dict):
        ext, val = iteration_structure(stage, root_ext)
        for v in stage.leaves:
            self.ranges[v] = (0, ext[v] - 1)
        return ext, val

    # -- region (bound) inference ------------------------------------------------------
    def region(self, prod: Stage, body: Expr, free: dict, more=()):
        """Per dim of prod: (lo, extent bound E, hi) read by `body` with `free` loops varying
        (and by each (body, free) of `more`: siblings computed at the same loop)."""
        shape = prod.tensor.shape
        los = [None] * len(shape)
        his = [None] * len(shape)
        for b, fr in [(body, free), *more]:
            self._read_bounds(prod, b, fr, los, his)
        return self._region_of(shape, los, his)

    def _read_bounds(self, prod: Stage, body: Expr, free: dict, los: list, his: list) -> None:
        shape = prod.tensor.shape
        ctx = None
        for e in walk(body):
            if e.op != "load" or e.arg is not prod.tensor:
                continue
            for d, idx in enumerate(e.args):
                if any(x.op in _DIGITS for x in walk(idx)):
                    # a fused loop's digits put back together ((f // M) * M + f % M: a GEMM's rows
                    # over a batch folded into one matrix) span what f spans, not the digits' hull
                    ctx = ctx or Ctx(self.ranges)
                    idx = ctx.simplify(idx)
                iv = sym_interval(idx, free)
                if iv is None:
                    los[d], his[d] = ZERO, _ix(shape[d] - 1)
                    iv = (los[d], his[d])
                los[d] = iv[0] if los[d] is None else min_(los[d], iv[0])
                his[d] = iv[1] if his[d] is None else max_(his[d], iv[1])

    def _region_of(self, shape, los: list, his: list):
        out = []
        ctx = Ctx(self.ranges)
        for d, n in enumerate(shape):
            lo = ctx.simplify(max_(los[d], 0)) if los[d] is not None else ZERO
            if his[d] is not None and static(n) and n >= UNBOUNDED:   # never clamped (kiln.loops.symbols)
                hi = ctx.simplify(his[d])
            else:
                hi = ctx.simplify(min_(his[d], n - 1)) if his[d] is not None else _ix(n - 1)
            e_hi = ctx.bounds(ctx.simplify(hi - lo + 1))[1]
            if not static(n):   # a symbolic dim: a tile's static bound, else the whole dim bounds it
                out.append((lo, max(e_hi, 1), hi) if e_hi is not None and e_hi <= TILE_MAX else (lo, n, hi))
            elif e_hi is None or e_hi >= n:
                out.append((lo, n, hi) if e_hi is not None else (ZERO, n, _ix(n - 1)))
            else:
                out.append((lo, max(e_hi, 1), hi))
        return out

    def _sibling_reads(self, c: Stage, p: Stage):
        """(body, free) of sibling `c` (computed at the same loop, domain known) reading `p`:
        its body in absolute indices, its region's loops and reductions varying."""
        body = self.bodies[c]
        value = body.args[0] if body.op == "reduce" else body
        dom = self.domains[c]
        value = substitute(value, {ax: dom[ax][0] + ax for ax in c.axis})
        free = {ax: (0, dom[ax][1] - 1) for ax in c.axis}
        for rv in c.reduce_axis:
            lo, n = rv.arg.dom
            free[rv] = (lo, lo + n - 1)
        return value, free

    # -- nests ---------------------------------------------------------------------------
    def build(self, stage: Stage, domain: dict) -> S.Stmt:
        """domain: root var -> (base Expr, extent int, limit Expr); store index = root - base."""
        ext, val = self.structure(stage, {r: d[1] for r, d in domain.items()})
        absval = {r: domain[r][0] + val[r] for r in domain}
        body = self.bodies[stage]
        value = body.args[0] if body.op == "reduce" else body
        value = substitute(value, absval)
        for p, buf, los in self.sibling_reads.get(stage, ()):    # siblings computed before it
            value = _read_locally(value, p, buf, los)
        out = self.local.get(stage, stage.tensor)
        idx = tuple(val[r] for r in stage.axis)
        ctx = Ctx(self.ranges)

        # a split of a reduction's split (or fused) part that does not divide it runs that part
        # past its extent where the root's own guard still holds (k split by 3, then k.i by 2:
        # k.i = 3 at k.o = 0 is k = 3, summed again at k.o = 1), so such parts are guarded like
        # roots. (A spatial part that runs past only stores an element twice, the same value.)
        spilled = [r.parent for r in stage.relations if isinstance(r, Split) and r.parent not in domain
                   and stage.is_reduce(r.parent)
                   and not (static(ext[r.parent]) and ext[r.outer] * ext[r.inner] == ext[r.parent])]

        def guard(roots, reduce=False):
            conds = [val[r] < domain[r][2] for r in roots] + ([val[v] < ext[v] for v in spilled] if reduce else [])
            return _conj([c for c in conds if not prove(c, self.ranges)])

        # stages computed inside this one's loops: infer their regions, read them locally
        for (st, leaf), prods in self.attached.items():
            if st is not stage:
                continue
            pos = stage.leaves.index(leaf)
            free = {v: self.ranges[v] for v in stage.leaves[pos + 1:]}
            # consumers first: a sibling's region is known before the region of what it reads
            for p in reversed(prods):
                readers = [c for c in prods if c is not p and _reads(self.bodies[c], p.tensor)]
                if any(c not in self.domains for c in readers):
                    raise KilnError(f"stage {p.name!r} is computed at {stage.name}.{leaf.arg.name} after a "
                                    f"stage that reads it; stages must be in producer-first order", stage="lower")
                reg = self.region(p, value, free, [self._sibling_reads(c, p) for c in readers])
                self.local[p] = S.Buffer(p.name, p.tensor.dtype, tuple(r[1] for r in reg), "local")
                self.domains[p] = {ax: (lo, n, ctx.simplify(hi - lo + 1)) for ax, (lo, n, hi) in zip(p.axis, reg)}
                for rv in p.reduce_axis:
                    self.domains[p][rv] = (_ix(rv.arg.dom[0]), rv.arg.dom[1], _ix(rv.arg.dom[1]))
                buf, los = self.local[p], [r[0] for r in reg]
                for c in readers:
                    self.sibling_reads.setdefault(c, []).append((p, buf, los))
                value = _read_locally(value, p, buf, los)

        hints = prefetch_hints(stage, value, ext, ctx, absval)

        def nest(positions, inner, attach=True):
            for pos in reversed(positions):
                leaf = stage.leaves[pos]
                if attach and leaf in hints:
                    inner = S.seq(*hints[leaf], inner)
                if attach:
                    for p in reversed(self.attached.get((stage, leaf), [])):
                        inner = S.Allocate(self.local[p], S.seq(self.build(p, self.domains[p]), inner), "auto")
                inner = S.For(leaf, ZERO, _ix(ext[leaf]), stage.kinds.get(leaf, "serial"), inner)
            return inner

        sp_guard = guard(stage.axis)
        if body.op != "reduce":
            st = S.Store(out, idx, value)
            return nest(range(len(stage.leaves)), st if sp_guard is None else S.IfThenElse(sp_guard, st))
        comb = body.arg[0]
        p0 = next(i for i, v in enumerate(stage.leaves) if stage.is_reduce(v))
        init = S.Store(out, idx, reduce_identity(comb, body.dtype))
        init = init if sp_guard is None else S.IfThenElse(sp_guard, init)
        init_nest = nest([i for i in range(p0 + 1, len(stage.leaves)) if not stage.is_reduce(stage.leaves[i])],
                         init, attach=False)
        upd = S.Store(out, idx, combine(comb, out[idx], value))
        g = _conj([c for c in (sp_guard, guard(stage.reduce_axis, True)) if c is not None])
        upd_nest = nest(range(p0, len(stage.leaves)), upd if g is None else S.IfThenElse(g, upd))
        return nest(range(p0), S.seq(init_nest, upd_nest))

    def root_domain(self, stage: Stage) -> dict:
        dom = {ax: (ZERO, n, _ix(n)) for ax, n in zip(stage.axis, stage.tensor.shape)}
        for rv in stage.reduce_axis:
            lo, n = rv.arg.dom
            dom[rv] = (_ix(lo), n, _ix(n))
        return dom

    def run(self) -> S.Stmt:
        parts = [self.build(s, self.root_domain(s)) for s in self.roots]
        body = S.seq(*parts)
        for s in reversed(self.roots):
            if s.tensor not in self.params:
                body = S.Allocate(s.tensor, body, "heap")
        return body


PREFETCH_MAX_UNROLLED = 1024   # unrolled iterations a prefetch enumerates at most (the rest at their first)


def prefetch_hints(stage: Stage, value: Expr, ext: dict, ctx: Ctx, absval: dict) -> dict:
    """leaf -> the Evaluate(prefetch(...)) statements of the stage's prefetches at that loop
    (Stage.prefetch): the loads of the tensor in `value` (indexed by the leaves), the leaf
    `offset` iterations ahead, one per distinct element over the unrolled loops inside it; and
    Stage.prefetch_next's, into L2 (`absval`: the stage's axes' absolute indices)."""
    out: dict = {}
    for tensor, leaf, offset, nxt in stage.prefetches:
        if leaf not in stage.leaves or stage.kinds.get(leaf) == "vectorized":
            raise KilnError(f"stage {stage.name!r}: prefetch at loop {leaf.arg.name!r}, which is "
                            f"{'vectorized' if leaf in stage.leaves else 'no longer a loop'}", stage="lower")
        loads = list(dict.fromkeys(e for e in walk(value) if e.op == "load" and e.arg is tensor))
        inner = stage.leaves[stage.leaves.index(leaf) + 1:]
        if nxt is not None:
            out.setdefault(leaf, []).extend(_next_hints(tensor, loads, inner, nxt, ext, ctx, absval))
            continue
        unrolled = [v for v in inner if stage.kinds.get(v) == "unrolled" and static(ext[v])]
        while unrolled and math.prod(ext[v] for v in unrolled) > PREFETCH_MAX_UNROLLED:
            unrolled.pop(0)
        at = {v: ZERO for v in inner}
        at[leaf] = leaf + offset
        idxs: dict = {}
        for combo in itertools.product(*(range(ext[v]) for v in unrolled)):
            at.update({v: _ix(k) for v, k in zip(unrolled, combo)})
            for ld in loads:
                idx = tuple(ctx.simplify(substitute(i, at)) for i in ld.args)
                idxs.setdefault(idx, None)
        out.setdefault(leaf, []).extend(S.Evaluate(prefetch(tensor[idx])) for idx in idxs)
    return out


def _next_hints(tensor, loads: list, inner: list, nxt: tuple, ext: dict, ctx: Ctx, absval: dict) -> list:
    """Stage.prefetch_next's hints: each load's element `step` along dimension `dim`, the spread
    loop at the `by` axis's index modulo its extent, the other inner loops at 0."""
    dim, step, spread, by = nxt
    at = {v: ZERO for v in inner}
    at[spread] = ctx.simplify(substitute(absval[by], at) % _ix(ext[spread]))
    idxs: dict = {}
    for ld in loads:
        idx = [ctx.simplify(substitute(i, at)) for i in ld.args]
        idx[dim] = ctx.simplify(idx[dim] + step)
        idxs.setdefault(tuple(idx), None)
    return [S.Evaluate(prefetch(tensor[idx], 2)) for idx in idxs]


def _ix(n) -> Expr:
    """An index or extent as an Expr: an int as a constant, a symbolic size as it is."""
    return n if isinstance(n, Expr) else const(n, DType.int64)


def _reads(body: Expr, tensor) -> bool:
    return any(e.op == "load" and e.arg is tensor for e in walk(body))


def _read_locally(value: Expr, p: Stage, buf: S.Buffer, los: list) -> Expr:
    """`value` with its loads of stage p's tensor read from p's local buffer, whose
    region starts at `los`."""
    return map_loads(value, lambda b, ix, e: buf[tuple(i - lo for i, lo in zip(ix, los))]
                     if b is p.tensor else rebuild(e, ix))


def lower(sch: Schedule, params, name: str = "kernel") -> S.PrimFunc:
    """Lower a schedule to a PrimFunc taking `params` (inputs and outputs) by pointer."""
    if not isinstance(sch, Schedule):
        sch = Schedule(sch)
    params = list(params)
    for t in sch.outputs:
        if t not in params:
            raise KilnError(f"output {t.name!r} must be one of the params", stage="lower")
    low = _Lowering(sch, params)
    body = low.run()
    body = simplify_stmt(body, low.ranges) or S.Seq(())
    if S.stmt_checks(body):
        body = hoist_checks(body)
    _check_buffers(body, params, name)
    return S.PrimFunc(name, tuple(params), body)


def _check_buffers(body: S.Stmt, params, name):
    known = set(params)

    def expr_bufs(e):
        return [x.arg for x in walk(e) if x.op == "load"]

    def go(s):
        if isinstance(s, S.Allocate):
            known.add(s.buffer)
            go(s.body)
            return
        if isinstance(s, S.Store):
            bufs = [s.buffer] + [b for i in s.indices for b in expr_bufs(i)] + expr_bufs(s.value)
        elif isinstance(s, (S.For, S.IfThenElse, S.Seq, S.Let, S.Evaluate)):
            bufs = []
            for f in ("min", "extent", "cond", "value", "expr"):
                if hasattr(s, f) and isinstance(getattr(s, f), Expr):
                    bufs += expr_bufs(getattr(s, f))
            for c in (getattr(s, "body", None), getattr(s, "then", None), getattr(s, "else_", None)):
                if c is not None:
                    go(c)
            for c in getattr(s, "stmts", ()):
                go(c)
        else:
            bufs = []
        for b in bufs:
            if b not in known:
                raise KilnError(f"function {name!r} reads tensor {b.name!r}, which is not in its params",
                                stage="lower")

    go(body)


_DIGITS = ("floordiv", "floormod")


def sym_interval(e: Expr, free: dict):
    """Symbolic (lo, hi) of integer `e` when the vars in `free` range over inclusive
    const intervals and every other var is fixed; None when not analysable."""
    if not any(v in free for v in walk(e) if v.op == "var"):
        return (e, e)
    op = e.op
    if op == "var":
        lo, hi = free[e]
        return _ix(lo), _ix(hi)
    if op == "cast" and not e.args[0].dtype.is_float:
        iv = sym_interval(e.args[0], free)
        return None if iv is None else (Expr("cast", e.dtype, (iv[0],)), Expr("cast", e.dtype, (iv[1],)))
    if op == "select":
        a, b = sym_interval(e.args[1], free), sym_interval(e.args[2], free)
        return None if a is None or b is None else (min_(a[0], b[0]), max_(a[1], b[1]))
    if op not in ("add", "sub", "mul", "floordiv", "floormod", "min", "max"):
        return None
    x, y = e.args
    a = sym_interval(x, free)
    b = sym_interval(y, free)
    if a is None or b is None:
        return None
    if op == "add":
        return a[0] + b[0], a[1] + b[1]
    if op == "sub":
        return a[0] - b[1], a[1] - b[0]
    if op in ("min", "max"):
        f = min_ if op == "min" else max_
        return f(a[0], b[0]), f(a[1], b[1])
    c = y if y.op == "const" else x if (x.op == "const" and op == "mul") else None
    if c is None:
        return None
    other = a if c is y else b
    if op == "mul":
        return (other[0] * c, other[1] * c) if c.arg >= 0 else (other[1] * c, other[0] * c)
    if c.arg <= 0:
        return None
    if op == "floordiv":
        return other[0] // c, other[1] // c
    return const(0, e.dtype), const(c.arg - 1, e.dtype)
