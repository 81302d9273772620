"""Features of a candidate, read from its lowered loop IR (Ansor's per-store features).

For each Store: the loops around it (extents and kinds), its vector lanes, how often it
runs, the arithmetic it does, the bytes it touches, and, per cache level, the bytes that
must come from beyond that level: the footprint of the innermost loop nest that still
fits the cache, times the trips of the loops outside it. Arithmetic intensity and the
parallel work per thread follow. A kernel's vector is the features of its heaviest
stores plus totals, a fixed length whatever the kernel looks like.
"""

from __future__ import annotations

import math

import numpy as np

from kiln.loops.expr import free_vars, walk
from kiln.loops.stmt import Allocate, For, IfThenElse, Let, Seq, Store

ARITH = frozenset({"add", "sub", "mul", "div", "min", "max", "fma", "call", "select"})
CACHES = (32 << 10, 1 << 20, 32 << 20)   # when the machine's own are unknown (kiln.tune.signature)
TOP = 3                                   # stores described one by one (by trip count)
DEPTH = 6                                 # innermost loops described one by one
PER_STORE = 12 + 3 * DEPTH + 2 * len(CACHES)


def _int(e, default=1) -> int:
    return int(e.arg) if getattr(e, "op", None) == "const" else default


def _stores(s, loops, out, lets=()):
    if isinstance(s, For):
        _stores(s.body, loops + [s], out, lets)
    elif isinstance(s, Seq):
        for t in s.stmts:
            _stores(t, loops, out, lets)
    elif isinstance(s, (Allocate, Let)):
        _stores(s.body, loops, out, lets)
    elif isinstance(s, IfThenElse):
        _stores(s.then, loops, out, lets)
        if s.else_ is not None:
            _stores(s.else_, loops, out, lets)
    elif isinstance(s, Store):
        out.append((s, list(loops)))


def _accesses(st: Store):
    """(buffer itemsize, vars the index reads) per load and for the store itself."""
    acc = [(st.buffer.dtype.itemsize, set().union(*(free_vars(i) for i in st.indices)) if st.indices else set())]
    for e in walk(st.value):
        if e.op == "load":
            buf = e.arg
            idx = e.args
            acc.append((buf.dtype.itemsize, set().union(*(free_vars(i) for i in idx)) if idx else set()))
    return acc


def _log(x: float) -> float:
    return math.log2(1.0 + max(0.0, x))


def store_features(st: Store, loops: list, cores: int, caches=CACHES) -> list[float]:
    ext = [_int(f.extent) for f in loops]
    trips = math.prod(ext)
    ops = sum(1 for e in walk(st.value) if e.op in ARITH)
    lanes = math.prod(e for f, e in zip(loops, ext) if f.kind == "vectorized")
    par = math.prod(e for f, e in zip(loops, ext) if f.kind == "parallel")
    unrolled = math.prod(e for f, e in zip(loops, ext) if f.kind == "unrolled")
    acc = _accesses(st)
    touched = trips * sum(sz for sz, _ in acc)
    lvars = [f.var for f in loops]

    def footprint(d):   # bytes the loops at depth >= d touch (distinct elements, per access)
        inner = list(zip(lvars[d:], ext[d:]))
        return sum(sz * math.prod(e for v, e in inner if v in vs) for sz, vs in acc)

    feats_fp = [footprint(d) for d in range(len(loops) + 1)]
    per_level = []
    for c in caches:
        d = next((d for d in range(len(loops) + 1) if feats_fp[d] <= c), len(loops))
        per_level.append(feats_fp[d] * math.prod(ext[:d]))
    flops = trips * max(ops, 1)
    threads = min(par, cores) if par > 1 else 1
    inner = [(e, ("serial", "parallel", "vectorized", "unrolled").index(f.kind))
             for f, e in zip(loops[::-1][:DEPTH], ext[::-1][:DEPTH])]
    inner += [(0, -1)] * (DEPTH - len(inner))
    rows = [_log(trips), _log(flops), _log(touched), float(len(loops)), float(lanes), _log(par),
            _log(unrolled), _log(flops / threads), float(par % max(cores, 1) if par > 1 else 0),
            float(ops), float(len(acc)), _log(feats_fp[0])]
    for e, k in inner:
        rows += [_log(e), float(k), 1.0 if k == 2 and e > 1 else 0.0]
    for b in per_level:
        rows += [_log(b), flops / max(b, 1.0)]
    return rows


def decision_features(decisions: dict) -> np.ndarray:
    """A hand-written kernel's vector (it has no loop IR to read): its numeric decisions in name
    order, then zeros, the length of `featurize`'s, its last entry -1 (not a store count)."""
    vals = [float(v) for _, v in sorted(decisions.items()) if isinstance(v, (int, float))]
    n = PER_STORE * (TOP + 1) + 1
    out = np.zeros(n)
    out[:min(len(vals), n - 1)] = vals[:n - 1]
    out[-1] = -1.0
    return out


def featurize(func, cores: int | None = None, caches=None) -> np.ndarray:
    """The fixed-length feature vector of a lowered PrimFunc."""
    if cores is None or caches is None:
        from kiln.tune.signature import machine  # noqa: PLC0415
        m = machine()
        cores = cores or m["cores"]
        caches = caches or tuple(c or d for c, d in zip(m["caches"], CACHES))
    found: list = []
    _stores(func.body, [], found)
    rows = [store_features(st, loops, cores, caches) for st, loops in found]
    rows.sort(key=lambda r: -r[1])
    top = rows[:TOP] + [[0.0] * PER_STORE] * (TOP - min(TOP, len(rows)))
    total = np.array(rows).sum(axis=0) if rows else np.zeros(PER_STORE)
    return np.concatenate([np.ravel(top), total, [float(len(rows))]]).astype(np.float64)
