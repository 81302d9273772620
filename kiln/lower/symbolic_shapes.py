"""Shapes computed at run time, carried as polynomials of the input symbols (issue 15 item 1).

Exported transformers compute their shapes in the graph: Shape -> Gather -> Unsqueeze ->
Concat -> Reshape chains, Range over the sequence length for positions and masks, Expand,
Slice of a causal bias up to the sequence length. The graph-level inference gives such sizes
fresh symbols (`_u3`: "known only from data"), so the model could not be one shape-generic
module. Here the graph is inferred again with each small integer tensor's *value* carried as
an array of `Poly` (an integer polynomial of the input symbols: `batch*seq`, `seq+1`), and
the ops whose output sizes come from such values (Reshape, Expand, Range, Slice, ...) get
sizes that are polynomials too, named canonically ("batch*seq") so equal sizes share a
name and broadcast as one. The lowering maps those names to loop-IR expressions of the
symbol vars (kiln.lower.generic).

Symbols are sizes >= 1 (the generic module's contract). Where a size is only right under a
condition (a Slice of a static axis up to `seq` gives `seq` while seq <= the axis), the
condition is kept as a guard, checked per new shape at run time; a shape outside a guard
runs on the module specialised to it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from kiln.graph.ir import Graph, Node, const_value
from kiln.graph.types import TensorType
from kiln.lower.size_poly import BIG, Guard, Poly, Undecided, atom, least_value
from kiln.ops.infer import Inferencer


@dataclass
class Resolved:
    """A graph whose sizes are ints, input symbols or canonical names of `derived` sizes."""
    graph: Graph
    symbols: list[str]
    derived: dict = field(default_factory=dict)     # name -> Poly over `symbols`
    guards: list = field(default_factory=list)      # Guard
    known: dict = field(default_factory=dict)       # value id -> data known at compile time

    def poly(self, d) -> Poly | None:
        if isinstance(d, int):
            return Poly.of(d)
        if d in self.symbols:
            return Poly.sym(d)
        return self.derived.get(d)


def resolve(graph: Graph, symbols: list[str], for_lowering: bool = True) -> Resolved:
    """A clone of `graph` inferred again with shape values carried as polynomials of
    `symbols` (the input symbols), its computed sizes named by their polynomials.
    `for_lowering`: Slices whose ends are run-time sizes get constant ends, their kernels
    reading from the starts (the graph is then for lowering only: inferred again, such a
    Slice would take the whole axis)."""
    g = graph.clone()
    res = Resolved(g, list(symbols))
    inf = _Inferencer(g.opsets, res)
    inf.infer_graph(g)
    _rename_aliases(g, inf.aliases)
    if for_lowering:
        _fix_slices(g, inf)
    res.known = inf.known
    return res


def _ints(a) -> bool:
    return isinstance(a, np.ndarray) and a.dtype.kind in "iu"


class _Inferencer(Inferencer):
    """The graph-level inference, then per node: the polynomial values of small integer
    outputs (`sym`), and output sizes from them where inference could not tell."""

    def __init__(self, opsets, res: Resolved):
        super().__init__(opsets)
        self.res = res
        self.sym: dict[int, np.ndarray] = {}     # value id -> object array of Poly
        self.positive: set = set()                # sizes a guard keeps >= 1
        self.aliases: dict = {}                   # size name -> the name a guard makes it equal to

    def canon(self, name):
        """The name a size `name` stands as, after the aliases unify made."""
        while isinstance(name, str) and name in self.aliases:
            name = self.aliases[name]
        return name

    def unify(self, a: Poly, b: Poly, where: str) -> Poly:
        """`a`, given that the graph needs a == b (a Concat's other axes, a broadcast of two
        sizes neither of which is 1): equal polynomials, or, where they may differ (the 2x
        upsampled floor(H / 2) meeting H), a guard that they are equal at run time, under
        which one's name is an alias of the other's (an input's symbol stays the name; renamed
        throughout: `_rename_aliases`). Sizes that differ for every value of the symbols, or
        a symbol against an int, stay undecided."""
        if a == b:
            return a
        c = _compare_or_none(a, b)
        if c is not None or a.is_const or b.is_const:   # (a symbol against an int: left to the
            raise Undecided(f"{where}: {a} against {b}")  # blockers, kiln.lower.generic)
        ka, kb = self.canon(self.name(a)), self.canon(self.name(b))
        if ka == kb:                          # made equal before
            return self.res.poly(ka)
        inputs = set(self.res.symbols)
        if ka in inputs and kb in inputs:     # (an input's symbol is read from its shape: kept)
            raise Undecided(f"{where}: input sizes {a} and {b} must agree")
        if kb in inputs:                      # the input's symbol names both
            a, b, ka, kb = b, a, kb, ka
        self.res.guards += [Guard(a - b, 0, f"{where} needs {a} == {b}"),
                            Guard(b - a, 0, f"{where} needs {b} == {a}")]
        self.aliases[kb] = ka
        return self.res.poly(ka)

    # -- sizes <-> names --
    def dim_poly(self, d) -> Poly | None:
        return self.res.poly(d)

    def name(self, p: Poly):
        if p.is_const:
            if p.value < 0:
                raise Undecided(f"size {p} < 0")
            return p.value
        if len(p.terms) == 1 and p.terms[0][1] == 1 and len(p.terms[0][0]) == 1 and atom(p.terms[0][0][0]) is None:
            return p.terms[0][0][0]
        if (p.lower_bound() is None or p.lower_bound() < 1) and p not in self.positive:
            if not any(atom(s) for m, _ in p.terms for s in m):
                raise Undecided(f"size {p} may be below 1")
            # a floor division of an image size (a 2x2 pool of H: H//2) is 0 for small images:
            # the generic module covers the sizes >= 1; smaller images run specialised (where
            # the reference says whether they are valid at all)
            self.res.guards.append(Guard(-p, -1, f"size {p} must be at least 1"))
            self.positive.add(p)
        key = str(p)
        self.res.derived.setdefault(key, p)
        return key

    def resolved(self, t) -> bool:
        return not isinstance(t, TensorType) or (t.shape is not None and
                                                all(self.dim_poly(d) is not None for d in t.shape))

    def value_of(self, v) -> np.ndarray | None:
        """Input `v`'s value as an object array of Poly (known ints converted), or None."""
        if v is None:
            return None
        if v.id in self.sym:
            return self.sym[v.id]
        k = self.known_value(v)
        if _ints(k) and k.size <= 64:
            return np.vectorize(Poly.of, otypes=[object])(k) if k.size else k.astype(object)
        return None

    # -- per node --
    def infer_node(self, node: Node) -> None:
        super().infer_node(node)
        try:
            vals = _VALUES.get(node.op, lambda *_: None)(self, node) if not node.domain else None
        except (Undecided, ValueError, IndexError, TypeError):
            vals = None
        for v, val in zip(node.outputs, vals or ()):
            if v is None or val is None or not isinstance(v.type, TensorType) or not v.type.is_static:
                continue
            val = np.asarray(val, dtype=object).reshape(v.type.shape)
            self.sym[v.id] = val
            if all(p.is_const for p in val.reshape(-1)) and v.id not in self.known:
                self.known[v.id] = np.array([p.value for p in val.reshape(-1)],
                                            v.type.dtype.np).reshape(v.type.shape)
        if all(self.resolved(v.type) for v in node.outputs if v is not None):
            return
        rule = _SHAPES.get(node.op) if not node.domain else None
        if rule is None:
            return
        try:
            shapes = rule(self, node)
        except (Undecided, ValueError, IndexError, TypeError):
            return
        for v, shape in zip(node.outputs, shapes or ()):
            if v is not None and shape is not None:
                v.type = TensorType(v.type.dtype, tuple(self.name(Poly.of(d)) for d in shape))


# -- values of small integer tensors (shape vectors and their arithmetic) ------------------

def _in_polys(inf, node, i=0):
    t = node.inputs[i].type
    ps = [inf.dim_poly(d) for d in t.shape]
    if any(p is None for p in ps):
        raise Undecided("an unresolved size")
    return ps


def _shape_value(inf, node):
    ps = _in_polys(inf, node)
    sl = slice(*slice(node.attrs.get("start", 0), node.attrs.get("end", None)).indices(len(ps))[:2])
    return [np.array(ps[sl] or [], dtype=object)]


def _size_value(inf, node):
    return [np.array(math.prod(_in_polys(inf, node), start=Poly.of(1)), dtype=object)]


def _args(inf, node):
    vals = [inf.value_of(v) for v in node.inputs]
    if any(v is not None and x is None for v, x in zip(node.inputs, vals)):
        raise Undecided("an input value is unknown")
    return vals


def _known_ints(inf, node, i) -> list[int] | None:
    if i >= len(node.inputs) or node.inputs[i] is None:
        return None
    k = inf.known_value(node.inputs[i])
    if not _ints(k):
        raise Undecided("a parameter is unknown")
    return [int(x) for x in k.reshape(-1)]


def _gather_value(inf, node):
    data = inf.value_of(node.inputs[0])
    idx = inf.known_value(node.inputs[1])
    if data is None or not _ints(idx):
        return None
    return [np.take(data, idx.astype(np.int64), axis=node.attrs.get("axis", 0))]


def _same_data(inf, node):
    """Unsqueeze, Squeeze, Reshape, Flatten, Identity: the data in the output's (static) shape."""
    data = inf.value_of(node.inputs[0])
    return None if data is None else [data.reshape(-1)]


def _concat_value(inf, node):
    vals = _args(inf, node)
    return [np.concatenate([v.reshape(v.shape or (1,)) if v.ndim == 0 else v for v in vals],
                           axis=node.attrs.get("axis", 0))]


def _slice_value(inf, node):
    from kiln.ops.tensor import _clamped  # noqa: PLC0415
    data = inf.value_of(node.inputs[0])
    if data is None or data.ndim != 1:
        return None
    starts, ends = _known_ints(inf, node, 1), _known_ints(inf, node, 2)
    axes, steps = _known_ints(inf, node, 3), _known_ints(inf, node, 4)
    if (axes or [0]) != [0] or starts is None or len(starts) != 1:
        return None
    k = _clamped(len(data), slice(starts[0], ends[0], (steps or [1])[0]))
    return [data[k]]


def _cast_value(inf, node):
    t = node.outputs[0].type
    if not isinstance(t, TensorType) or t.dtype.name == "bool" or not (t.dtype.is_int or t.dtype.is_float):
        return None
    return _same_data(inf, node)


def _arith(fn):
    def value(inf, node):
        a, b = _args(inf, node)
        return [fn(*np.broadcast_arrays(a, b))]
    return value


def _div(a, b):
    out = np.empty(a.shape, dtype=object)
    for k in np.ndindex(a.shape):
        out[k] = Poly.of(a[k]) // Poly.of(b[k])
    return out


def _compare(pick):
    def value(inf, node):
        a, b = np.broadcast_arrays(*_args(inf, node))
        out = np.array([pick(Poly.of(x).compare(y)) for x, y in zip(a.reshape(-1), b.reshape(-1))], bool)
        inf.known[node.outputs[0].id] = out.reshape(a.shape)   # a decided comparison: known data
        return None
    return value


def _where_value(inf, node):
    cond = inf.known_value(node.inputs[0])
    a, b = inf.value_of(node.inputs[1]), inf.value_of(node.inputs[2])
    if cond is None or a is None or b is None:
        return None
    c, a, b = np.broadcast_arrays(cond.astype(bool), a, b)
    return [np.where(c, a, b)]


def _minmax(pick):
    def value(inf, node):
        vals = np.broadcast_arrays(*_args(inf, node))
        out = np.empty(vals[0].shape, dtype=object)
        for k in np.ndindex(out.shape):
            best = Poly.of(vals[0][k])
            for v in vals[1:]:
                if pick(Poly.of(v[k]).compare(best)):
                    best = Poly.of(v[k])
            out[k] = best
        return [out]
    return value


_VALUES = {
    "Shape": _shape_value, "Size": _size_value, "Gather": _gather_value, "Concat": _concat_value,
    "Slice": _slice_value, "Cast": _cast_value,
    **{op: _same_data for op in ("Unsqueeze", "Squeeze", "Reshape", "Flatten", "Identity")},
    "Add": _arith(lambda a, b: a + b), "Sub": _arith(lambda a, b: a - b), "Mul": _arith(lambda a, b: a * b),
    "Div": _arith(_div), "Neg": lambda inf, node: [-inf.value_of(node.inputs[0])],
    "Equal": _compare(lambda c: c == 0), "Less": _compare(lambda c: c < 0),
    "LessOrEqual": _compare(lambda c: c <= 0), "Greater": _compare(lambda c: c > 0),
    "GreaterOrEqual": _compare(lambda c: c >= 0), "Where": _where_value,
    "Max": _minmax(lambda c: c > 0), "Min": _minmax(lambda c: c < 0),
}


# -- output sizes from such values ---------------------------------------------------------

def _vector(inf, node, i) -> list[Poly]:
    v = inf.value_of(node.inputs[i])
    if v is None:
        raise Undecided("the size input is unknown")
    return [Poly.of(x) for x in v.reshape(-1)]


def _scalar(inf, node, i) -> Poly:
    v = _vector(inf, node, i)
    if len(v) != 1:
        raise Undecided("not a scalar")
    return v[0]


def _reshape_shape(inf, node):
    ins = _in_polys(inf, node)
    target = _vector(inf, node, 1)
    allowzero = node.attrs.get("allowzero", 0)
    dims = [ins[k] if (not allowzero and t == Poly.of(0)) else t for k, t in enumerate(target)]
    minus = [k for k, d in enumerate(dims) if d == Poly.of(-1)]
    if len(minus) > 1:
        raise Undecided("more than one -1")
    if minus:
        # sizes kept on both sides cancel first ([b, T, 768] -> [b, T, -1, 64], T = floor(n / 2) - 1:
        # b*T*768 / (b*T*64), whose divisor is not one term, is 768 / 64)
        left, right = list(ins), [d for k, d in enumerate(dims) if k != minus[0]]
        for d in list(right):
            if not d.is_const and d in left:
                left.remove(d)
                right.remove(d)
        rest = math.prod(right, start=Poly.of(1))
        q = math.prod(left, start=Poly.of(1)).exact_div(rest)
        if q is None:
            raise Undecided("the -1 is not a product of sizes")
        dims[minus[0]] = q
    return [dims]


def _flatten_shape(inf, node):
    ins = _in_polys(inf, node)
    a = node.attrs.get("axis", 1)
    a = a + len(ins) if a < 0 else a
    one = Poly.of(1)
    return [[math.prod(ins[:a], start=one), math.prod(ins[a:], start=one)]]


def _broadcast(a: list, b: list, unify=None) -> list:
    """numpy's broadcast of two shapes of Polys; sizes neither of which is 1 that may differ
    are equal under a guard where `unify` (_Inferencer.unify bound to a place) is given."""
    out = []
    for k in range(max(len(a), len(b))):
        x = a[len(a) - 1 - k] if k < len(a) else Poly.of(1)
        y = b[len(b) - 1 - k] if k < len(b) else Poly.of(1)
        if x == Poly.of(1):
            out.append(y)
        elif y == Poly.of(1) or x == y:
            out.append(x)
        elif unify is not None:
            out.append(unify(x, y))
        else:
            raise Undecided(f"{x} against {y}")
    return out[::-1]


def _elementwise_shape(inf, node):
    """A numpy-broadcasting op: its inputs' shapes broadcast, sizes that may differ made equal
    under a guard (the skip connection a 2x upsampling of floor(H / 2) is added to)."""
    where = f"{node.op} node {node.name!r}"
    shapes = [_in_polys(inf, node, i) for i, v in enumerate(node.inputs) if v is not None]
    out = shapes[0]
    for s in shapes[1:]:
        out = _broadcast(out, s, lambda x, y: inf.unify(x, y, where))
    return [out]


def _expand_shape(inf, node):
    return [_broadcast(_in_polys(inf, node), _vector(inf, node, 1))]


def _constant_of_shape_shape(inf, node):
    return [_vector(inf, node, 0)]


def _range_shape(inf, node):
    start, limit, delta = (_scalar(inf, node, i) for i in range(3))
    n = (limit - start).exact_div(delta)
    if n is None:
        raise Undecided("the count is not exact")
    return [[n]]


def _tile_shape(inf, node):
    return [[d * r for d, r in zip(_in_polys(inf, node), _vector(inf, node, 1))]]


def _slice_shape(inf, node):
    """Steps of 1 from a static start; the end a size: `seq` of an axis `seq` long is the
    whole axis; `seq` of a static axis of n is `seq - start` under the guard seq <= n."""
    ins = _in_polys(inf, node)
    starts = _known_ints(inf, node, 1)
    ends = _vector(inf, node, 2)
    axes = _known_ints(inf, node, 3) or list(range(len(starts)))
    steps = _known_ints(inf, node, 4) or [1] * len(starts)
    if starts is None or len(ends) != len(starts):
        raise Undecided("starts unknown")
    out, guards = list(ins), []
    where = f"{node.op} node {node.name!r}"
    for a, s, e, st in zip(axes, starts, ends, steps):
        a = a + len(ins) if a < 0 else a
        d = ins[a]
        if st != 1 or s < 0:
            raise Undecided("a step other than 1 or a start from the end")
        if e.is_const and e.value >= BIG:
            e = d
        elif e.is_const and e.value < 0:
            e = d + e.value
        else:
            c = _compare_or_none(e, d)
            if c is not None and c >= 0:
                e = d                          # clamped to the axis
            elif c is None:
                if not d.is_const:
                    raise Undecided(f"end {e} against the axis {d}")
                guards.append(Guard(e, d.value, f"{where} reads up to {e} of an axis of {d.value}"))
        n = e - s
        if n.lower_bound() is None or n.lower_bound() < 1:
            guards.append(Guard(-n, -1, f"{where} keeps {n} elements"))
        out[a] = n
    inf.res.guards += guards
    inf.positive.update(g.size * -1 for g in guards if g.bound == -1)
    return [out]


def _compare_or_none(a: Poly, b: Poly) -> int | None:
    try:
        return a.compare(b)
    except Undecided:
        return None


def _window_shape(inf, node):
    """Conv, MaxPool, AveragePool, LpPool: out = floor((size + pads - span) / stride) + 1 per
    spatial dim (kiln.ops.nn.window), a floor-division atom where it is not exact. A numerator
    that may be negative (a window wider than a small input) is guarded to be >= 0, the shapes
    the reference accepts; auto_pad SAME is taken at stride 1 (its pads do not depend on the
    size), ceil_mode not at all."""
    ins = _in_polys(inf, node)
    nd = len(ins) - 2
    if nd < 1:
        raise Undecided("no spatial dims")
    a = node.attrs
    if node.op == "Conv":
        wt = node.inputs[1].type
        if not isinstance(wt, TensorType) or wt.shape is None or not all(isinstance(d, int) for d in wt.shape):
            raise Undecided("the weight's shape is unknown")
        kernel = [int(k) for k in a.get("kernel_shape", wt.shape[2:])]
        channels = Poly.of(wt.shape[0])
    else:
        if int(a.get("ceil_mode", 0)) or "kernel_shape" not in a:
            raise Undecided("ceil_mode, or no kernel_shape")
        kernel = [int(k) for k in a["kernel_shape"]]
        channels = ins[1]
    strides = [int(v) for v in a.get("strides", [1] * nd)]
    dil = [int(v) for v in a.get("dilations", [1] * nd)]
    pads = [int(v) for v in a.get("pads", [0] * (2 * nd))]
    auto = a.get("auto_pad", "NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else str(auto)
    if len(kernel) != nd or len(strides) != nd or len(dil) != nd or len(pads) != 2 * nd:
        raise Undecided("window attributes of the wrong length")
    out = [ins[0], channels]
    where = f"{node.op} node {node.name!r}"
    for i, size in enumerate(ins[2:]):
        eff, st = (kernel[i] - 1) * dil[i] + 1, strides[i]
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            if st != 1:
                raise Undecided("auto_pad SAME with a stride (its pads depend on the size)")
            out.append(size)
            continue
        if auto == "VALID":
            pb = pe = 0
        elif auto == "NOTSET":
            pb, pe = pads[i], pads[nd + i]
        else:
            raise Undecided(f"auto_pad {auto}")
        num = size + pb + pe - eff
        if num.is_const:
            if num.value < 0:
                raise Undecided("a window wider than the input")
            out.append(Poly.of(num.value // st + 1))
            continue
        lo = num.lower_bound()
        o = num.floordiv(st, assume_nonnegative=True) + 1
        if lo is None or lo < 0:
            inf.res.guards.append(Guard(-num, 0, f"{where}'s window of {eff} must fit the padded input"))
            inf.positive.add(o)             # (so the size is at least 1)
        out.append(o)
    return [out]


def _resize_shape(inf, node):
    """Resize/Upsample by constant scales: out = floor(size * scale), the scale an exact
    fraction of ints (2.0 -> 2 * size, 0.5 -> floor(size / 2))."""
    from fractions import Fraction  # noqa: PLC0415
    ins = _in_polys(inf, node)
    idx = 1 if node.op == "Upsample" or inf.opsets.get("", 0) < 11 else 2
    if idx == 2 and len(node.inputs) > 3 and node.inputs[3] is not None and "axes" not in node.attrs:
        # sizes computed from the run-time shape (F.interpolate(x, size=y.shape[2:])): the
        # lowering resamples with the ratio of the run-time sizes
        policy = node.attrs.get("keep_aspect_ratio_policy", "stretch")
        if (policy.decode() if isinstance(policy, bytes) else str(policy)) != "stretch":
            raise Undecided("keep_aspect_ratio_policy")
        sizes = _vector(inf, node, 3)
        if len(sizes) != len(ins):
            raise Undecided("sizes of another rank")
        return [sizes]
    if len(node.inputs) <= idx or node.inputs[idx] is None or "axes" in node.attrs:
        raise Undecided("no scales input, or axes")
    k = inf.known_value(node.inputs[idx])
    if k is None or k.size != len(ins) or k.dtype.kind != "f":
        raise Undecided("scales unknown")
    out = []
    for size, sc in zip(ins, k.reshape(-1)):
        f = Fraction(float(sc))
        if f <= 0:
            raise Undecided("a scale <= 0")
        v = size * f.numerator
        out.append(v if f.denominator == 1 else v.floordiv(f.denominator))
    return [out]


def _concat_shape(inf, node):
    """Sizes add along the axis; the other axes are the first input's (inference checked
    that they agree)."""
    shapes = [_in_polys(inf, node, i) for i in range(len(node.inputs))]
    a = int(node.attrs.get("axis", 0))
    a = a + len(shapes[0]) if a < 0 else a
    out = list(shapes[0])
    where = f"{node.op} node {node.name!r}"
    for s in shapes[1:]:
        if len(s) != len(out):
            raise Undecided("inputs of different ranks")
        for k in range(len(out)):
            if k != a:
                out[k] = inf.unify(out[k], s[k], where)
    out[a] = sum((s[a] for s in shapes[1:]), start=shapes[0][a])
    return [out]


def _depth_space_shape(inf, node):
    """DepthToSpace: C / b^2, H * b, W * b; SpaceToDepth: C * b^2, H / b, W / b (exact
    divisions of a symbolic H only where the polynomial divides: else undecided)."""
    n, c, *sp = _in_polys(inf, node)
    b = int(node.attrs["blocksize"])
    if node.op == "DepthToSpace":
        return [[n, c // (b * b), *(d * b for d in sp)]]
    return [[n, c * (b * b), *(d // b for d in sp)]]


_SHAPES = {"Reshape": _reshape_shape, "Concat": _concat_shape, "DepthToSpace": _depth_space_shape,
           "SpaceToDepth": _depth_space_shape,
           **{op: _elementwise_shape for op in ("Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Mean",
                                                "Sum", "Where", "Equal", "Less", "LessOrEqual", "Greater",
                                                "GreaterOrEqual", "And", "Or", "Xor", "PRelu")}, "Flatten": _flatten_shape, "Expand": _expand_shape,
           "ConstantOfShape": _constant_of_shape_shape, "Range": _range_shape, "Tile": _tile_shape,
           "Slice": _slice_shape, "Conv": _window_shape, "MaxPool": _window_shape,
           "AveragePool": _window_shape, "LpPool": _window_shape, "Resize": _resize_shape}


def _rename_aliases(g: Graph, aliases: dict) -> None:
    """Sizes a guard made equal (_Inferencer.unify) named one way throughout `g`."""
    def canon(d):
        while isinstance(d, str) and d in aliases:
            d = aliases[d]
        return d
    if not aliases:
        return
    for v in [*g.inputs, *(x for n in g.nodes for x in (*n.inputs, *n.outputs)), *g.outputs]:
        t = None if v is None else v.type
        if isinstance(t, TensorType) and t.shape is not None and any(canon(d) != d for d in t.shape):
            v.type = TensorType(t.dtype, tuple(canon(d) for d in t.shape))


def _fix_slices(g: Graph, inf: _Inferencer) -> None:
    """A Slice whose ends are sizes known at run time: its output size is settled above, and
    its kernel reads from its starts alone (steps of 1), so the ends become a constant."""
    for n in g.nodes:
        if n.op != "Slice" or n.domain or len(n.inputs) < 3 or inf.known_value(n.inputs[2]) is not None:
            continue
        if not inf.resolved(n.outputs[0].type) or n.inputs[2].id not in inf.sym:
            continue
        count = len(inf.sym[n.inputs[2].id].reshape(-1))
        dt = n.inputs[2].type.dtype.np
        n.inputs[2] = const_value(f"{n.name}/ends_to_the_end", np.full(count, np.iinfo(dt).max, dt))


def positive_atoms(res: Resolved) -> dict[str, int]:
    """The floor-division atoms of `res`'s sizes that are at least 1 wherever the module runs
    (least value 1, or a guard keeps them so), sorted, each with that least value: each is a
    run-time value of its own (kiln.lower.generic), which the loops treat as a symbol."""
    least: dict = {}
    for g in res.guards:       # size <= bound, size = -(a + k): a >= -bound - k
        p = -g.size
        var = [(m, c) for m, c in p.terms if m]
        if len(var) == 1 and var[0][1] == 1 and len(var[0][0]) == 1:
            a = var[0][0][0]
            least[a] = max(least.get(a, 0), -g.bound - sum(c for m, c in p.terms if not m))
    out = {a: max(least_value(a), least.get(a, 0)) for a, spec in spelt_sizes(res.derived).items()
           if spec and spec[0] == "floordiv"}
    return {a: out[a] for a in sorted(out) if out[a] >= 1}


def spelt_sizes(derived: dict) -> dict:
    """`derived` (name -> Poly) as plain data for the runtime (kiln.runtime.generic): name ->
    its terms, and each floor-division atom they use -> ("floordiv", numerator terms, divisor)."""
    out = {k: p.terms for k, p in derived.items()}
    todo = [s for p in derived.values() for m, _ in p.terms for s in m]
    while todo:
        s = todo.pop()
        a = atom(s)
        if a is None or out.get(s, ("",))[0] == "floordiv":
            continue
        out[s] = ("floordiv", a[0].terms, a[1])     # (an atom named as a size itself: its definition)
        todo += [x for m, _ in a[0].terms for x in m]
    return out


__all__ = ["Guard", "Poly", "Resolved", "Undecided", "positive_atoms", "resolve", "spelt_sizes"]
