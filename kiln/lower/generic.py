"""A graph with symbolic input dims as one shape-generic module (issue 15 item 1).

The graph's symbols (`batch`, `seq`) stay symbolic down to the loops: every dim named by
a symbol becomes a symbol var of the loop IR (kiln.loops.symbols), loop extents and
strides are expressions over them, and each kernel reads their values from one more
parameter, `dims` (int64[n symbols]), at its start. The workspace arena is planned per
run-time shape (`ShapeGenericLowered.layout`): the liveness plan of kiln.lower.memory
over the sizes those values give, its offsets handed to the entry in `offsets`
(int64[n buffers]). One compiled module then runs every value of the symbols:

    int32_t kiln_main(in_0.., out_0.., weights, workspace, int64 dims[], int64 offsets[])

What cannot be generic says why (`generic_blockers`): a size only known from data (a
Reshape to -1 of a symbolic tensor, NonZero), control flow, a hand-written C kernel
whose sizes are baked in, a broadcast where a symbol meets another size (it could be 1
at run time), a lowering whose schedule needs an int. The caller then specialises per
shape, as before, and reports the reason: never a silently wrong module.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

import numpy as np

from kiln.dtypes import DType
from kiln.errors import KilnError
from kiln.graph.ir import Graph, Value
from kiln.graph.types import TensorType
from kiln.loops import Buffer, Call, PrimFunc
from kiln.loops.expr import Expr, load
from kiln.loops.stmt import ExternFunc, Let, View
from kiln.loops.symbols import DEFAULT_HINT, evaluate, symbol, symbols_in
from kiln.lower.memory import ArenaPlan
from kiln.lower.row_tiles import row_tiles
from kiln.runtime.generic import spelt
from kiln.runtime.native import interface_text

# ops that broadcast their inputs numpy-style: a symbol there must meet itself or a 1
BROADCASTING = {"Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Mean", "Sum", "Where", "Equal",
                "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor", "BitShift",
                "BitwiseAnd", "BitwiseOr", "BitwiseXor", "PRelu", "Expand", "MatMul", "Gemm", "FusedMatMul"}


class NotGeneric(KilnError):
    """The graph cannot be one shape-generic module (the message says why)."""


def graph_symbols(graph: Graph) -> list[str]:
    """The symbols of the graph's inputs, in first-appearance order."""
    out: list[str] = []
    for v in graph.inputs:
        if isinstance(v.type, TensorType) and v.type.shape is not None:
            out += [d for d in v.type.shape if isinstance(d, str) and d not in out]
    return out


def generic_blockers(graph: Graph, derived=()) -> list[str]:
    """Why `graph` cannot be one shape-generic module (empty: it can, as far as types say;
    a lowering may still refuse, see `lower_generic`). `derived`: the names of sizes computed
    from the input symbols (kiln.lower.symbolic_shapes), which are no blocker."""
    from kiln.lower.module import is_runtime_op, missing_lowerings  # noqa: PLC0415
    syms = set(graph_symbols(graph)) | set(derived)
    why = []
    missing = missing_lowerings(graph)
    if missing:
        why.append(f"{len(missing)} node(s) have no native lowering ({missing[0][1]} {missing[0][2]!r}, ...)")
    for v in list(graph.inputs) + list(graph.outputs):
        if not isinstance(v.type, TensorType) or v.type.shape is None:
            why.append(f"graph value %{v.name} is a {v.type}, not a tensor of known rank")
    for n in graph.nodes:
        if is_runtime_op(n) or list(n.subgraphs()):
            why.append(f"{n.op} node {n.name!r} is control flow or a container op")
            continue
        for v in n.outputs:
            if v is None:
                continue
            t = v.type
            if not isinstance(t, TensorType) or t.shape is None:
                why.append(f"{n.op} node {n.name!r}: output %{v.name} is {t}")
            elif any(isinstance(d, str) and d not in syms for d in t.shape):
                why.append(f"{n.op} node {n.name!r}: output %{v.name} {t} has a size known only from data")
        if n.op in BROADCASTING and not n.domain or n.op == "FusedMatMul":
            bad = _symbol_meets_other(n)
            if bad:
                why.append(f"{n.op} node {n.name!r}: {bad}")
    return why


def _symbol_meets_other(node) -> str | None:
    """A broadcast where a symbol meets another size (which it could equal, or be 1 against):
    the generic kernel could not tell which at run time."""
    shapes = [v.type.shape for v in node.inputs if v is not None and isinstance(v.type, TensorType)
              and v.type.shape is not None]
    if node.op in ("MatMul", "FusedMatMul"):   # only the batch dims broadcast
        shapes = [s[:-2] for s in shapes if len(s) >= 2]
    if node.op == "Gemm":
        return None if len(shapes) < 3 else _align_check([shapes[2], node.outputs[0].type.shape])
    if node.op == "Expand":
        shapes = shapes[:1] + [node.outputs[0].type.shape]
    return _align_check(shapes)


def _align_check(shapes) -> str | None:
    rank = max((len(s) for s in shapes), default=0)
    for d in range(1, rank + 1):
        dims = {s[-d] for s in shapes if len(s) >= d}
        syms = {x for x in dims if isinstance(x, str)}
        if syms and (len(syms) > 1 or dims - syms - {1}):
            return f"symbol {sorted(syms)[0]!r} broadcasts against {sorted(map(str, dims - syms))}"
    return None


@dataclass
class ShapeGenericLowered:
    """A shape-generic module: the loop IR, its symbols, and what per-shape planning needs."""
    lowered: object                     # kiln.lower.module.LoweredModule (its entry takes dims, offsets)
    symbols: list[str]                  # the entry's dims[k] is symbol k
    vars: list[Expr]                    # the loop IR's symbol var per symbol, then per atom
    atoms: list[str] = field(default_factory=list)   # dims[len(symbols) + k]: floor-division atom k
    buffers: list[tuple[object, int, int]] = field(default_factory=list)  # (size Expr/int, first, last)
    guards: list = field(default_factory=list)  # kiln.lower.symbolic_shapes.Guard: what the sizes assume
    derived: dict = field(default_factory=dict)  # size name -> Poly terms (kiln.runtime.generic evaluates)
    inputs: list = field(default_factory=list)   # (shape, dtype name) per graph input, sizes by name
    outputs: list = field(default_factory=list)  # (shape, dtype name) per graph output
    steps: list = field(default_factory=list)    # per kernel call of the entry: the nodes it computes
    variants: dict = field(default_factory=dict)  # kernel name -> symbols with a variant for 1
    row_tiles: dict = field(default_factory=dict)  # kernel name -> rows per tile of its row-tile variants
    _overlaps: list | None = field(default=None, repr=False)   # per buffer: those alive with it

    _covers: dict = field(default_factory=dict, repr=False)   # rounded-up dims -> (sizes, plan) or None

    def layout(self, dims: tuple[int, ...], round_up: bool = False) -> tuple[int, np.ndarray]:
        """(workspace bytes, byte offset per arena buffer) for symbol values `dims`: the
        liveness plan over the sizes those values give. Values outside a guard raise
        kiln.runtime.generic.NotCovered (the caller runs the shape specialised).
        `round_up`: the plan of the symbols rounded up to powers of two, kept, serves every
        shape whose buffers are each no larger than there (checked: each buffer's extent
        then lies inside the one it was placed with), so a decoder whose cache length grows
        by one per step places its arena once per doubling, not once per step."""
        from kiln.runtime.generic import NotCovered  # noqa: PLC0415
        env = dict(zip(self.symbols, dims))
        for g in self.guards:
            if g.size.evaluate(env) > g.bound:
                raise NotCovered(f"{g.why}: not so at {env}", stage="run")
        sizes = self._sizes(dims)
        if round_up:
            up = tuple(1 << (int(d) - 1).bit_length() for d in dims)
            cover = self._covers.get(up, 0)
            if cover == 0:
                cover = self._covers[up] = self._cover(up)
            if cover is not None and all(a <= b for a, b in zip(sizes, cover[0])):
                return cover[1]
        return self._place_sizes(sizes)

    def _cover(self, dims: tuple[int, ...]):
        env = dict(zip(self.symbols, dims))
        if any(g.size.evaluate(env) > g.bound for g in self.guards):
            return None
        sizes = self._sizes(dims)
        return sizes, self._place_sizes(sizes)

    def _sizes(self, dims: tuple[int, ...]) -> list[int]:
        values, memo = dict(zip(self.vars, atom_values(self.symbols, dims, self.atoms))), {}
        return [memo[size] if size in memo else memo.setdefault(size, evaluate(size, values))
                for size, _, _ in self.buffers]

    def _place_sizes(self, sizes: list[int]) -> tuple[int, np.ndarray]:
        if self._overlaps is None:    # lifetimes do not change with the sizes: which overlap, once
            self._overlaps = [[j for j, (_, a, b) in enumerate(self.buffers) if a <= last and first <= b]
                              for _, first, last in self.buffers]
        return _place(sizes, [a for _, a, _ in self.buffers], self._overlaps)


def atom_values(symbols: list[str], dims: tuple, atoms: list[str]) -> tuple:
    """`dims` (the input symbols' values) followed by the value of each floor-division atom."""
    from kiln.lower.size_poly import Poly  # noqa: PLC0415
    env = dict(zip(symbols, dims))
    return tuple(dims) + tuple(Poly.sym(a).evaluate(env) for a in atoms)


def _place(sizes: list[int], firsts: list[int], overlaps: list[list[int]]) -> tuple[int, np.ndarray]:
    """kiln.lower.memory.plan_arena's greedy placement (largest first, lowest offset that
    collides with no overlapping buffer placed before; the same plan), over lifetimes whose
    overlaps are known: a new shape's plan, on its first run, in well under a millisecond."""
    offsets, ends = [0] * len(sizes), [None] * len(sizes)
    for k in sorted(range(len(sizes)), key=lambda k: (-sizes[k], firsts[k], str(k))):
        size = (max(sizes[k], 1) + ALIGN - 1) // ALIGN * ALIGN
        offset = 0
        for o, e in sorted((offsets[j], ends[j]) for j in overlaps[k] if ends[j] is not None):
            if offset + size <= o:
                break
            offset = max(offset, e)
        offsets[k], ends[k] = offset, offset + size
    return max((e for e in ends if e is not None), default=0), np.array(offsets or [0], np.int64)


ALIGN = 64


def lower_generic(graph: Graph, target=None, decisions: dict | None = None) -> ShapeGenericLowered:
    """`graph` (symbolic input dims) as one module generic in its symbols. Raises NotGeneric
    naming the first reason it cannot be."""
    from kiln.lower.module import (emit_module, lifetimes, lower_groups,  # noqa: PLC0415
                                   weights_blob, MemoryPlan)
    from kiln.lower.partition import partition  # noqa: PLC0415
    from kiln.lower.symbolic_shapes import Undecided, positive_atoms, resolve, spelt_sizes  # noqa: PLC0415
    names = graph_symbols(graph)
    try:
        res = resolve(graph, names)
    except Undecided as e:
        raise NotGeneric(f"shapes: {e}", stage="lower") from None
    why = generic_blockers(res.graph, res.derived)
    if why:
        raise NotGeneric("; ".join(why[:3]) + (f" (and {len(why) - 3} more)" if len(why) > 3 else ""),
                         stage="lower")
    # symbol vars are C locals of the kernels (hand-written ones print sizes with them); so is
    # each floor-division size that is at least 1 where the module runs (a strided window's
    # output, (H+1)//2): a var, not a division, in the kernels' extents and indices
    syms = [symbol("sym_" + re.sub(r"\W", "_", s)) for s in names]
    least = positive_atoms(res)
    atoms = list(least)
    syms += [symbol(f"sym_atom{k}" + (f"_ge{least[a]}" if least[a] > 1 else ""),
                    max(1, atom_values(names, (DEFAULT_HINT,) * len(names), [a])[-1]), least[a])
             for k, a in enumerate(atoms)]
    table = dict(zip(names + atoms, syms))
    table.update({k: p.to_expr(table) for k, p in res.derived.items() if k not in table})
    ins = [(v.type.shape, v.type.dtype.name) for v in res.graph.inputs]
    outs = [(v.type.shape, v.type.dtype.name) for v in res.graph.outputs]
    g = _with_symbol_dims(res.graph, table)
    fusion = partition(g, fuse_anchors=True)
    log: list = []
    rows_of: dict = {}     # id(kernel func) -> the RowTiles of the GEMMs over symbolic rows it computes

    def seen(func):
        rows_of[id(func)] = list(log)
        log.clear()
    try:
        with row_tiles(log=log):
            groups = lower_groups(g, fusion, res.known, target, decisions, on_kernel=seen)
        small = _small_variants(groups, lambda: lower_groups(g, fusion, res.known, target, decisions),
                                list(zip(names, syms)))
        rows = _row_variants(groups, fusion, rows_of,
                             lambda plan: lower_groups(g, plan, res.known, target, decisions))
    except NotGeneric:
        raise
    except (KilnError, TypeError, ValueError) as e:   # a schedule decision or size that needs an int
        raise NotGeneric(f"a lowering needs static sizes: {e}", stage="lower") from None
    for f in groups.funcs:
        if isinstance(f, ExternFunc) and f.dynamic and symbols_in([d for p in f.params for d in p.shape]):
            raise NotGeneric(f"kernel {f.name} is hand-written C whose output sizes come from data", stage="lower")
    groups.share = []     # in-place reuse is decided per plan; a generic module plans per shape
    weights, woffsets = weights_blob(groups)
    first, last, size = lifetimes(g, groups, _value_bytes, lambda b: b.nbytes)
    keys = list(first)
    dims = Buffer("dims", DType.int64, (max(len(syms), 1),))
    offsets = Buffer("offsets", DType.int64, (max(len(keys), 1),))
    plan = ArenaPlan({k: load(offsets, (j,)) for j, k in enumerate(keys)}, 0, 0, 0)
    lm = emit_module(g, groups, MemoryPlan(weights, woffsets, plan), fusion)
    kernels = [_with_dims(f, dims, syms) for f in lm.module.funcs[:-1]]
    takes = {f.name for f, was in zip(kernels, lm.module.funcs) if f is not was}   # given `dims`
    # a kernel with row-tile variants keeps a symbol-of-1 one only where its rows are that symbol
    # (then 1 row, forked or not as for 1), first; others differ only in the decisions its
    # GEMM takes at a small row count (rows = batch x seq at batch 1), which the tiles cover
    small = {name: [(k, f) for k, f in fs if name not in rows or rows[name][0].rows is syms[k]]
             for name, fs in small.items() if name in takes}
    small = {name: fs for name, fs in small.items() if fs}
    chosen = {name: [(syms[k].eq(1), _with_dims(f, dims, syms)) for k, f in fs] for name, fs in small.items()}
    tiles = {name: [m for m, _, _ in fs] for name, (_, fs) in rows.items() if name in takes}
    for name in tiles:
        chosen.setdefault(name, []).extend((cond, _with_dims(f, dims, syms)) for _, cond, f in rows[name][1])
    steps = list(lm.call_nodes)
    entry = _dispatch(_entry(lm.module.funcs[-1], takes, dims, offsets), chosen, dims, syms, lm)
    lm.module.funcs = kernels + [f for fs in chosen.values() for _, f in fs] + [entry]
    lm.module.interface = interface_text(spelt(ins), spelt(outs), 0, len(weights))
    lm.workspace_bytes = 0
    return ShapeGenericLowered(lm, names, syms, atoms, [(size[k], first[k], last[k]) for k in keys], res.guards,
                               spelt_sizes(res.derived), ins, outs, steps,
                               {name: [names[k] for k, _ in fs] for name, fs in small.items()}, tiles)


def _value_bytes(t: TensorType):
    n = t.dtype.itemsize
    for d in t.shape:
        n = n * d
    return n


def _with_symbol_dims(g: Graph, table: dict) -> Graph:
    """`g` (a private clone: value ids kept, so its known data stays keyed) with tensor
    types naming symbol vars instead of symbol names."""
    seen: set = set()
    for v in [*g.inputs, *(x for n in g.nodes for x in (*n.inputs, *n.outputs)), *g.outputs]:
        if v is None or v.id in seen:
            continue
        seen.add(v.id)
        t = v.type
        if isinstance(t, TensorType) and t.shape is not None and any(isinstance(d, str) for d in t.shape):
            v.type = TensorType(t.dtype, tuple(table[d] if isinstance(d, str) else d for d in t.shape))
    return g


def _with_dims(f, dims: Buffer, syms: list):
    """Kernel `f` taking the symbols' values as its last parameter, read once at its start.
    A hand-written C kernel whose sizes are symbolic wrote them as C expressions of the
    symbol vars' names (kiln.loops.symbols.c_size): those become its locals."""
    if isinstance(f, ExternFunc):
        if not symbols_in([d for p in f.params for d in p.shape]):
            return f
        p = Buffer(f"in{len(f.params)}", DType.int64, dims.shape)
        head = "".join(f"  const int64_t {s.name} = {p.name}[{k}]; (void){s.name};\n" for k, s in enumerate(syms))
        return dataclasses.replace(f, params=f.params + (p,), c_body=head + f.c_body)
    if not isinstance(f, PrimFunc):
        return f
    body = f.body
    for k, s in reversed(list(enumerate(syms))):
        body = Let(s, load(dims, (k,)), body)
    return dataclasses.replace(f, params=f.params + (dims,), body=body)


def _small_variants(groups, lower_again, symbols: list) -> dict:
    """Kernels lowered again with one symbol's hint at 1 where that gives other code (a GEMM
    over a symbolic batch: one row per register tile instead of six, five of them padding at
    batch 1; a fork decided for one row): {kernel name: [(symbol index, variant)]}, each
    variant renamed. `lower_again()` lowers the same groups (under the hints in force).
    A variant whose parameters differ from its kernel's is left out: the entry passes both
    the same arguments (`_dispatch`)."""
    from kiln.loops.symbols import hints  # noqa: PLC0415
    kept = {id(f) for f in groups.funcs}   # (a kernel deduplicated into another may share a kept one's name)
    out: dict = {}
    for k, (name, var_) in enumerate(symbols):
        with hints({var_: 1}):
            again = lower_again()
        if len(again.kernels) != len(groups.kernels):
            continue
        for a, b in zip(groups.kernels, again.kernels):
            fa, fb = a.func, b.func
            if id(fa) not in kept or type(fa) is not type(fb) or len(fa.params) != len(fb.params) \
                    or [v.id for v in a.inputs] != [v.id for v in b.inputs] \
                    or [id(n) for n in a.nodes] != [id(n) for n in b.nodes] \
                    or any(p.dtype != q.dtype or str(p.shape) != str(q.shape) for p, q in zip(fa.params, fb.params)):
                continue
            if str(fa).replace(fa.name, "", 1) != str(fb).replace(fb.name, "", 1):
                out.setdefault(fa.name, []).append(
                    (k, dataclasses.replace(fb, name=f"{fa.name}_{re.sub(r'[^A-Za-z0-9]', '_', name)}1")))
    return out


def _row_variants(groups, fusion, rows_of: dict, lower) -> dict:
    """Kernels computing one GEMM over a symbolic row count, lowered again with each other
    row tile worth building (kiln.lower.row_tiles): {kernel name: (its RowTiles, [(mr,
    condition, variant)])}, the condition a bool Expr over the symbol vars (true where that
    tile costs least at the run-time rows), each variant renamed. `lower(plan)` lowers a
    FusionPlan's groups."""
    from kiln.lower.partition import FusionPlan  # noqa: PLC0415
    kept = {id(f) for f in groups.funcs}
    by_nodes = {tuple(id(n) for n in grp.nodes): grp for grp in fusion.groups}
    out: dict = {}
    for a in groups.kernels:
        fa, found = a.func, [t for t in rows_of.get(id(a.func), ()) if t is not None]
        grp = by_nodes.get(tuple(id(n) for n in a.nodes))
        if id(fa) not in kept or not isinstance(fa, PrimFunc) or len(found) != 1 or grp is None:
            continue
        plan = found[0]
        for m, n in plan.tiles:
            with row_tiles(force=(m, n)):
                again = lower(FusionPlan([grp]))
            if len(again.kernels) != 1:
                continue
            fb = again.kernels[0].func
            if type(fb) is not type(fa) or len(fa.params) != len(fb.params) \
                    or any(p.dtype != q.dtype or str(p.shape) != str(q.shape) for p, q in zip(fa.params, fb.params)) \
                    or str(fa).replace(fa.name, "", 1) == str(fb).replace(fb.name, "", 1):
                continue
            out.setdefault(fa.name, (plan, []))[1].append(
                (m, plan.condition(m), dataclasses.replace(fb, name=f"{fa.name}_rows{m}_{n}")))
    return out


def _dispatch(entry: PrimFunc, small: dict, dims: Buffer, syms: list, lm) -> PrimFunc:
    """The entry calling a kernel's variant (`_row_variants`, `_small_variants`) where its
    condition (over the symbol vars, bound from `dims`) holds at run time, the kernel
    otherwise: per dispatched call, the C numbers each call in turn (variants first), so
    its node and errors are listed once per call."""
    from kiln.loops.stmt import IfThenElse, Seq  # noqa: PLC0415
    if not small:
        return entry
    stmts, nodes, errors, k = [], [], [], 0
    for c in entry.body.stmts:
        if not isinstance(c, Call):
            stmts.append(c)
            continue
        variants = small.get(c.func, [])
        stmt = c
        for cond, f in reversed(variants):
            stmt = IfThenElse(cond, Call(f.name, c.args), stmt)
        for _, f in variants:
            nodes.append(lm.call_nodes[k])
            errors.append([list(e) for e in f.errors])
        nodes.append(lm.call_nodes[k])
        errors.append(lm.call_errors[k])
        stmts.append(stmt)
        k += 1
    lm.call_nodes, lm.call_errors = nodes, errors
    body = Seq(tuple(stmts))
    for k, s in reversed(list(enumerate(syms))):
        body = Let(s, load(dims, (k,)), body)
    return dataclasses.replace(entry, body=body)


def _entry(entry: PrimFunc, takes: set, dims: Buffer, offsets: Buffer) -> PrimFunc:
    """The entry with `dims` and `offsets` parameters, passing `dims` on to the kernels named
    in `takes`."""
    from kiln.loops.stmt import Seq  # noqa: PLC0415
    calls = entry.body.stmts if isinstance(entry.body, Seq) else (entry.body,)
    new = tuple(Call(c.func, c.args + ((dims,) if c.func in takes else ())) if isinstance(c, Call) else c
                for c in calls)
    return dataclasses.replace(entry, params=entry.params + (dims, offsets), body=Seq(new))


__all__ = ["NotGeneric", "ShapeGenericLowered", "generic_blockers", "graph_symbols", "lower_generic", "View"]
