"""Random valid ONNX graphs, seeded: the fuzzer's program generator.

`generate(seed)` returns a `Case` (model, input feeds, the -O levels to test). A graph is
built from segments, each growing the current value:

- anchors (Conv of every kind, ConvTranspose, MatMul/Gemm, reductions, pooling, Resize,
  Gather, Softmax, normalizations) followed by an epilogue chain of elementwise ops;
- injective prologues and view chains (Reshape, Transpose, Slice, Expand, Concat, Split, ...);
- fan-out (a value read again later, also by its own epilogue) and extra graph outputs
  (intermediates exported);

over random static or symbolic shapes (1-sized and odd dims included), dtypes and opsets.

Validity is by construction: `GraphBuilder` knows every value's concrete shape, dtype and a
range of its values (`Val.lo`/`Val.hi`, by interval arithmetic for the anchors, by sampling
the function for unaries), so ops with a restricted domain get guarded inputs (Log and Sqrt
see positive values, divisors stay away from 0, Exp's argument stays moderate): the
comparison then tests the compiler, not ill-conditioned arithmetic.

The builder is the reusable part (a mutation fuzzer builds on it): `GraphBuilder.input`,
`.const`, `.node`, `.op1` ..., `.model()`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSETS = (11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21)
LEVELS = (0, 1, 2, 3)
MAX_ELEMS = 8192           # elements of any one value: graphs stay small and quick to run
_NP = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
       np.dtype(np.float16): TensorProto.FLOAT16, np.dtype(np.int32): TensorProto.INT32,
       np.dtype(np.int64): TensorProto.INT64, np.dtype(np.int8): TensorProto.INT8,
       np.dtype(np.uint8): TensorProto.UINT8, np.dtype(np.bool_): TensorProto.BOOL}
F32, F64, F16 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16)
I32, I64, U8, I8, BOOL = (np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.uint8),
                          np.dtype(np.int8), np.dtype(np.bool_))


@dataclass
class Val:
    """A value of the graph being built: its name, dtype, concrete shape, range of values."""
    name: str
    dtype: np.dtype
    shape: tuple
    lo: float = -1.0
    hi: float = 1.0

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_float(self) -> bool:
        return self.dtype.kind == "f"

    @property
    def mag(self) -> float:
        return max(abs(self.lo), abs(self.hi))


@dataclass
class Case:
    """One generated test: a model, its input feeds and the -O levels to compile it at."""
    seed: int
    model: onnx.ModelProto
    feeds: dict
    levels: tuple = LEVELS
    ops: list = field(default_factory=list)     # op types used, for coverage statistics


def levels_for(seed: int, per_graph: int) -> tuple:
    """`per_graph` of the -O levels, rotating with the seed so that consecutive seeds cover all."""
    per_graph = max(1, min(per_graph, len(LEVELS)))
    start = (seed * per_graph) % len(LEVELS)
    return tuple(sorted(LEVELS[(start + k) % len(LEVELS)] for k in range(per_graph)))


# ---------------------------------------------------------------- the builder


class GraphBuilder:
    """Builds an ONNX graph value by value, tracking each value's shape, dtype and range."""

    def __init__(self, rng: np.random.Generator, opset: int, sym_prob: float = 0.0, big: bool = False):
        self.rng, self.opset, self.sym_prob = rng, opset, sym_prob
        self.big = big              # larger GEMM/conv sizes: past the register tiles, with tails
        self.nodes: list = []
        self.inits: list = []
        self.inputs: list = []
        self.feeds: dict = {}
        self.vals: dict = {}        # name -> Val
        self.ops: list = []
        self._n = 0

    # -- names, inputs, constants, nodes

    def fresh(self, base: str) -> str:
        self._n += 1
        return f"{base}{self._n}"

    def input(self, shape, dtype=F32, lo=-2.0, hi=2.0, name=None) -> Val:
        """A graph input fed with uniform random values in [lo, hi] (ints: that range rounded);
        some dims declared symbolic (a name per size, as exporters name batch/seq dims),
        now and then -1 or left out, as old exporters write "any size"."""
        name = name or self.fresh("in")
        shape = tuple(int(d) for d in shape)
        dims = []
        for d in shape:
            r = self.rng.random()
            if r < self.sym_prob * 0.8:
                dims.append(f"n{d}")
            elif r < self.sym_prob * 0.9:
                dims.append(-1)
            elif r < self.sym_prob:
                dims.append(None)
            else:
                dims.append(d)
        vi = helper.make_tensor_value_info(name, _NP[np.dtype(dtype)], dims)
        for d, given in zip(vi.type.tensor_type.shape.dim, dims):
            if given is None:
                d.Clear()
        self.inputs.append(vi)
        self.feeds[name] = self.random_array(shape, dtype, lo, hi)
        v = Val(name, np.dtype(dtype), shape, float(lo), float(hi))
        if v.dtype == BOOL:
            v.lo, v.hi = 0.0, 1.0
        self.vals[name] = v
        return v

    def random_array(self, shape, dtype, lo, hi) -> np.ndarray:
        dt = np.dtype(dtype)
        if dt == BOOL:
            return self.rng.random(shape) < 0.5
        if dt.kind in "iu":
            return self.rng.integers(math.ceil(lo), math.floor(hi) + 1, size=shape).astype(dt)
        return self.rng.uniform(lo, hi, size=shape).astype(dt)

    def const(self, arr, base="c") -> Val:
        arr = np.asarray(arr)
        name = self.fresh(base)
        self.inits.append(numpy_helper.from_array(arr, name))
        lo = float(arr.min()) if arr.size else 0.0
        hi = float(arr.max()) if arr.size else 0.0
        v = Val(name, arr.dtype, tuple(arr.shape), lo, hi)
        self.vals[name] = v
        return v

    def ints(self, values) -> Val:
        return self.const(np.asarray(values, dtype=np.int64), "i")

    def node(self, op: str, inputs: list, outs: list, **attrs) -> list[Val]:
        """Append a node; `outs` are (dtype, shape, lo, hi) of its outputs. Inputs may be
        Vals, names or None (an omitted optional input)."""
        names = ["" if x is None else (x.name if isinstance(x, Val) else x) for x in inputs]
        while names and names[-1] == "":
            names.pop()
        out_vals = [Val(self.fresh("v"), np.dtype(dt), tuple(int(s) for s in shape), float(lo), float(hi))
                    for dt, shape, lo, hi in outs]
        self.nodes.append(helper.make_node(op, names, [v.name for v in out_vals], **attrs))
        self.ops.append(op)
        for v in out_vals:
            self.vals[v.name] = v
        return out_vals

    def op1(self, op: str, inputs: list, dtype, shape, lo, hi, **attrs) -> Val:
        lo, hi = _finite_range(lo, hi)
        return self.node(op, inputs, [(dtype, shape, lo, hi)], **attrs)[0]

    def model(self, outputs: list[Val]) -> onnx.ModelProto:
        outs, seen = [], set()
        for v in outputs:
            if v.name in seen:
                continue
            seen.add(v.name)
            # static graphs declare the true output shapes (kiln's inference is checked
            # against them); with symbolic inputs, the rank alone
            dims = list(v.shape) if self.sym_prob == 0 else [None] * v.rank
            outs.append(helper.make_tensor_value_info(v.name, _NP[v.dtype], dims))
        g = helper.make_graph(self.nodes, "fuzz", self.inputs, outs, self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", self.opset)])
        m.ir_version = 8 if self.opset <= 18 else 10 if self.opset <= 21 else m.ir_version
        return m

    # -- guards: keep values in the domains where the comparison is meaningful

    def scale_to(self, v: Val, bound: float) -> Val:
        """v, multiplied down when its range exceeds `bound`."""
        if v.mag <= bound or not v.is_float:
            return v
        k = bound / v.mag
        c = self.const(np.array(k, dtype=v.dtype))
        return self.op1("Mul", [v, c], v.dtype, v.shape, v.lo * k, v.hi * k)

    def positive(self, v: Val, least: float = 0.5) -> Val:
        """v made >= least: Abs(v)+c, v*v+c, Softplus(v)+c or Sigmoid(v)+c, at random."""
        if v.lo >= least:
            return v
        v = self.scale_to(v, 8.0)
        how = self.rng.choice(["abs", "square", "softplus", "sigmoid"])
        if how == "abs":
            u = self.op1("Abs", [v], v.dtype, v.shape, 0, v.mag)
        elif how == "square":
            u = self.op1("Mul", [v, v], v.dtype, v.shape, 0, v.mag ** 2)
        elif how == "softplus":
            u = self.op1("Softplus", [v], v.dtype, v.shape, 0, max(v.hi, 0) + 0.7)
        else:
            u = self.op1("Sigmoid", [v], v.dtype, v.shape, 0, 1)
        c = self.const(np.array(least, dtype=v.dtype))
        return self.op1("Add", [u, c], v.dtype, v.shape, least, u.hi + least)

    def unit(self, v: Val, bound: float = 0.9) -> Val:
        """v squashed into (-bound, bound) (for Asin, Acos, Atanh)."""
        if v.mag <= bound:
            return v
        if self.rng.random() < 0.5:
            t = self.op1("Tanh", [v], v.dtype, v.shape, -1, 1)
            return self.scale_to(Val(t.name, t.dtype, t.shape, -1, 1), bound)
        return self.scale_to(v, bound)

    # -- shapes

    def reshape(self, v: Val, shape) -> Val:
        shape = tuple(int(s) for s in shape)
        if shape == v.shape:
            return v
        target = list(shape)
        if 0 in shape:      # a literal 0 means "copy the dim" unless allowzero (opset 14)
            if self.opset < 14:
                return self.input(shape, v.dtype)
            return self.op1("Reshape", [v, self.ints(target)], v.dtype, shape, v.lo, v.hi, allowzero=1)
        if self.rng.random() < 0.3:     # ONNX's 0 (copy the dim) and -1 (infer it)
            k = int(self.rng.integers(len(target)))
            if k < v.rank and v.shape[k] == target[k] and self.rng.random() < 0.5:
                target[k] = 0
            else:
                target[k] = -1
        return self.op1("Reshape", [v, self.ints(target)], v.dtype, shape, v.lo, v.hi)

    def cast(self, v: Val, dtype) -> Val:
        dtype = np.dtype(dtype)
        if v.dtype == dtype:
            return v
        lo, hi = v.lo, v.hi
        if dtype.kind in "iu":
            lo, hi = math.trunc(lo), math.trunc(hi)
        if dtype == BOOL:
            lo, hi = 0, 1
        return self.op1("Cast", [v], dtype, v.shape, lo, hi, to=_NP[dtype])


def _finite_range(lo, hi):
    lo, hi = float(lo), float(hi)
    if not math.isfinite(lo):
        lo = -1e30
    if not math.isfinite(hi):
        hi = 1e30
    return min(lo, hi), max(lo, hi)


def _sample_range(fn, lo, hi, dtype=np.float64):
    """The range of a continuous unary fn over [lo, hi], by sampling (with a 5% margin)."""
    xs = np.linspace(lo, hi, 257)
    if lo < 0 < hi:
        xs = np.append(xs, 0.0)
    with np.errstate(all="ignore"):
        ys = np.asarray(fn(xs.astype(dtype)), dtype=np.float64)
    ys = ys[np.isfinite(ys)]
    if ys.size == 0:
        return -1.0, 1.0
    a, b = float(ys.min()), float(ys.max())
    pad = 0.05 * (b - a) + 1e-3
    return a - pad, b + pad


# ---------------------------------------------------------------- elementwise ops


def _np_sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _np_softplus(x):
    return np.logaddexp(0, x)


# name: (numpy function for the range, min opset, domain ("any"/"pos"/"unit"/"small"), attrs)
UNARY = {
    "Relu": (lambda x: np.maximum(x, 0), 1, "any", {}),
    "LeakyRelu": (lambda x: np.where(x > 0, x, 0.1 * x), 1, "any", {"alpha": 0.1}),
    "Elu": (lambda x: np.where(x > 0, x, np.expm1(x)), 1, "small", {"alpha": 1.0}),
    "Selu": (lambda x: 1.0507 * np.where(x > 0, x, 1.6733 * np.expm1(x)), 1, "small", {}),
    "Celu": (lambda x: np.where(x > 0, x, 0.8 * np.expm1(x / 0.8)), 12, "small", {"alpha": 0.8}),
    "Sigmoid": (_np_sigmoid, 1, "any", {}),
    "HardSigmoid": (lambda x: np.clip(0.2 * x + 0.5, 0, 1), 1, "any", {}),
    "HardSwish": (lambda x: x * np.clip(x / 6 + 0.5, 0, 1), 14, "any", {}),
    "Tanh": (np.tanh, 1, "any", {}),
    "Softplus": (_np_softplus, 1, "small", {}),
    "Softsign": (lambda x: x / (1 + np.abs(x)), 1, "any", {}),
    "Mish": (lambda x: x * np.tanh(_np_softplus(x)), 18, "small", {}),
    "Gelu": (lambda x: x * 0.5 * (1 + np.tanh(0.79788456 * (x + 0.044715 * x ** 3))), 20, "small", {}),
    "ThresholdedRelu": (lambda x: np.where(x > 0.3, x, 0), 10, "any", {"alpha": 0.3}),
    "Shrink": (lambda x: np.where(x < -0.4, x + 0.1, np.where(x > 0.4, x - 0.1, 0)), 9, "any",
               {"lambd": 0.4, "bias": 0.1}),
    "Exp": (np.exp, 1, "small", {}),
    "Log": (np.log, 1, "pos", {}),
    "Sqrt": (np.sqrt, 1, "pos", {}),
    "Reciprocal": (lambda x: 1 / x, 1, "pos", {}),
    "Abs": (np.abs, 1, "any", {}),
    "Neg": (np.negative, 1, "any", {}),
    "Floor": (np.floor, 1, "any", {}),
    "Ceil": (np.ceil, 1, "any", {}),
    "Round": (np.round, 11, "any", {}),
    "Sign": (np.sign, 9, "any", {}),
    "Sin": (np.sin, 7, "small", {}),
    "Cos": (np.cos, 7, "small", {}),
    "Tan": (np.tan, 7, "unit", {}),
    "Asin": (np.arcsin, 7, "unit", {}),
    "Acos": (np.arccos, 7, "unit", {}),
    "Atan": (np.arctan, 7, "any", {}),
    "Sinh": (np.sinh, 9, "small", {}),
    "Cosh": (np.cosh, 9, "small", {}),
    "Asinh": (np.arcsinh, 9, "any", {}),
    "Acosh": (lambda x: np.arccosh(x + 1.0), 9, "pos1", {}),
    "Atanh": (np.arctanh, 9, "unit", {}),
    "Erf": (lambda x: np.tanh(1.2 * x), 9, "any", {}),
    "Identity": (lambda x: x, 1, "any", {}),
}
BINARY = ("Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "PRelu", "Mean", "Sum")
COMPARE = ("Greater", "Less", "Equal", "GreaterOrEqual", "LessOrEqual")
INT_UNARY = ("Abs", "Neg", "Relu", "Sign", "Identity")
INT_BINARY = ("Add", "Sub", "Mul", "Max", "Min", "Div", "Mod")


def unary(b: GraphBuilder, v: Val, op: str | None = None) -> Val:
    """One unary activation on a float value, its input guarded into the op's domain."""
    names = [n for n, (_, o, _, _) in UNARY.items() if o <= b.opset and (n != "Celu" or v.dtype == F32)]
    op = op or str(b.rng.choice(names))
    fn, _, dom, attrs = UNARY[op]
    if dom == "pos":
        v = b.positive(v, 0.25 if op != "Reciprocal" else 0.5)
    elif dom == "pos1":
        v = b.positive(v, 1.05)
    elif dom == "unit":
        v = b.unit(v, 0.9 if op != "Tan" else 1.2)
    elif dom == "small":
        v = b.scale_to(v, 6.0)
    if op == "Acosh":
        lo, hi = _sample_range(np.arccosh, v.lo, v.hi)
    else:
        lo, hi = _sample_range(fn, v.lo, v.hi)
    if op == "Gelu" and b.rng.random() < 0.5:
        attrs = {"approximate": "tanh"}
    return b.op1(op, [v], v.dtype, v.shape, lo, hi, **attrs)


def broadcast_shape(rng, shape: tuple, widen: bool = False) -> tuple:
    """A shape that broadcasts with `shape` to `shape` (right-aligned, dims kept or 1, maybe
    fewer leading dims); `widen`: some size-1 dims of `shape` become larger in the result
    (bidirectional broadcasting)."""
    r = len(shape)
    keep = int(rng.integers(0, r + 1))
    out = []
    for d in shape[r - keep:]:
        if d == 1 and widen and rng.random() < 0.5:
            out.append(int(rng.integers(2, 4)))
        else:
            out.append(d if rng.random() < 0.6 else 1)
    return tuple(out)


def _bshape(a: tuple, b: tuple) -> tuple:
    return tuple(np.broadcast_shapes(a, b))


def operand(b: GraphBuilder, v: Val, pool: list, widen: bool = True, lo=-2.0, hi=2.0) -> Val:
    """The other operand of a binary op on v: a broadcasting constant, a new graph input,
    v itself, or an earlier value whose shape broadcasts with v's (fan-out)."""
    rng = b.rng
    r = rng.random()
    if r < 0.15:
        return v
    if r < 0.35:
        cands = [p for p in pool if p.dtype == v.dtype and p.name != v.name and _broadcasts(p.shape, v.shape)
                 and math.prod(_bshape(p.shape, v.shape)) <= MAX_ELEMS]
        if cands:
            return cands[int(rng.integers(len(cands)))]
    shape = broadcast_shape(rng, v.shape, widen and v.size * 3 <= MAX_ELEMS)
    if r < 0.7:
        arr = b.random_array(shape, v.dtype, lo, hi)
        if rng.random() < 0.2 and arr.ndim == 0:
            arr = np.asarray(arr.item(), dtype=v.dtype)
        return b.const(arr)
    return b.input(shape, v.dtype, lo, hi)


def _broadcasts(a: tuple, b: tuple) -> bool:
    try:
        np.broadcast_shapes(a, b)
        return True
    except ValueError:
        return False


def binary(b: GraphBuilder, v: Val, pool: list, op: str | None = None) -> Val:
    """A binary elementwise op of v and a broadcasting operand, guarded (divisors away from 0,
    Pow on a positive base with a constant exponent)."""
    rng = b.rng
    op = op or str(rng.choice(BINARY))
    v = b.scale_to(v, 50.0)
    if op == "Div":
        if rng.random() < 0.5:
            w = operand(b, v, [], lo=0.5, hi=2.0)
            if w.name == v.name:
                w = b.const(np.array(rng.choice([-2.0, 0.75, 1.5]), dtype=v.dtype))
            if w.lo < 0.5:
                w = b.positive(w)
        else:
            w = b.positive(operand(b, v, pool))
            if rng.random() < 0.5 and w.lo > 0:
                w = b.op1("Neg", [w], w.dtype, w.shape, -w.hi, -w.lo)
        q = [v.lo / w.lo, v.lo / w.hi, v.hi / w.lo, v.hi / w.hi]
        return b.op1("Div", [v, w], v.dtype, _bshape(v.shape, w.shape), min(q), max(q))
    if op == "Pow":
        base = b.scale_to(b.positive(v, 0.25), 4.0)
        e = rng.choice([0.5, 2.0, 3.0, -1.0, 1.5, -0.5])
        shape = broadcast_shape(rng, base.shape) if rng.random() < 0.3 else ()
        ex = b.const(np.full(shape, e, dtype=v.dtype))
        lo, hi = _sample_range(lambda x: np.power(x, e), base.lo, base.hi)
        return b.op1("Pow", [base, ex], v.dtype, _bshape(base.shape, shape), lo, hi)
    if op == "PRelu":   # the slope broadcasts to x (unidirectionally)
        slope = b.const(b.random_array(broadcast_shape(rng, v.shape), v.dtype, -0.5, 0.5))
        return b.op1("PRelu", [v, slope], v.dtype, v.shape, min(v.lo, -0.5 * v.mag), max(v.hi, 0.5 * v.mag))
    w = operand(b, v, pool)
    w = b.scale_to(w, 50.0)
    shape = _bshape(v.shape, w.shape)
    if op in ("Mean", "Sum") and rng.random() < 0.4:   # variadic: a third operand
        u = operand(b, v, pool, widen=False)
        if not _broadcasts(u.shape, shape):
            u = b.const(b.random_array(broadcast_shape(rng, shape), v.dtype, -2, 2))
        u = b.scale_to(u, 50.0)
        shape = _bshape(shape, u.shape)
        ins = [v, w, u]
    else:
        ins = [v, w]
    if op in ("Add", "Sum"):
        lo, hi = sum(x.lo for x in ins), sum(x.hi for x in ins)
    elif op == "Mean":
        lo, hi = min(x.lo for x in ins), max(x.hi for x in ins)
    elif op == "Sub":
        lo, hi = v.lo - w.hi, v.hi - w.lo
    elif op == "Mul":
        p = [v.lo * w.lo, v.lo * w.hi, v.hi * w.lo, v.hi * w.hi]
        lo, hi = min(p), max(p)
    elif op == "Max":
        lo, hi = max(v.lo, w.lo), max(v.hi, w.hi)
    else:
        lo, hi = min(v.lo, w.lo), min(v.hi, w.hi)
    return b.op1(op, ins, v.dtype, shape, lo, hi)


def clip(b: GraphBuilder, v: Val) -> Val:
    """Clip with constant bounds (attributes before opset 11), graph-input bounds, or one bound."""
    rng = b.rng
    a = float(rng.uniform(v.lo, (v.lo + v.hi) / 2)) if v.hi > v.lo else v.lo
    c = float(rng.uniform((v.lo + v.hi) / 2, v.hi)) if v.hi > v.lo else v.hi
    if b.opset < 11:
        return b.op1("Clip", [v], v.dtype, v.shape, a, c, min=a, max=c)
    form = rng.choice(["both", "min", "max", "inputs"])
    if form == "inputs":
        lo_in = b.input((), v.dtype, a, a)
        hi_in = b.input((), v.dtype, c, c)
        b.feeds[lo_in.name] = np.asarray(a, dtype=v.dtype)
        b.feeds[hi_in.name] = np.asarray(c, dtype=v.dtype)
        return b.op1("Clip", [v, lo_in, hi_in], v.dtype, v.shape, a, c)
    lo_c = b.const(np.array(a, dtype=v.dtype)) if form in ("both", "min") else None
    hi_c = b.const(np.array(c, dtype=v.dtype)) if form in ("both", "max") else None
    return b.op1("Clip", [v, lo_c, hi_c], v.dtype, v.shape, a if lo_c else v.lo, c if hi_c else v.hi)


def int_detour(b: GraphBuilder, v: Val) -> Val:
    """Cast to an integer type, a few integer ops, cast back: exact arithmetic in the middle."""
    rng = b.rng
    dt = np.dtype(rng.choice([I32, I64, I8, U8] if b.opset >= 14 else [I32, I64]))
    if dt == U8 or dt == I8:
        v = b.scale_to(v, 100.0)
        if dt == U8:
            v = b.op1("Relu", [v], v.dtype, v.shape, max(v.lo, 0), max(v.hi, 0))
    x = b.cast(v, dt)
    for _ in range(int(rng.integers(0, 3))):
        op = str(rng.choice(INT_BINARY + INT_UNARY))
        if op in INT_UNARY:
            if dt == U8 and op in ("Neg", "Abs", "Sign", "Relu"):
                continue
            if op in ("Relu", "Sign") and b.opset < 14 and op == "Relu":
                continue
            fn = {"Abs": abs, "Neg": lambda t: -t, "Relu": lambda t: max(t, 0), "Sign": np.sign,
                  "Identity": lambda t: t}[op]
            ends = [fn(x.lo), fn(x.hi)] + ([fn(0)] if x.lo < 0 < x.hi else [])
            x = b.op1(op, [x], dt, x.shape, min(ends), max(ends))
            continue
        if op in ("Max", "Min") and b.opset < 12:
            continue
        if op in ("Div", "Mod"):
            k = int(rng.integers(2, 6))
            w = b.const(np.array(k, dtype=dt))
            x = b.op1(op, [x, w], dt, x.shape, min(x.lo, -k), max(x.hi, k))
            continue
        k = int(rng.integers(1, 4))
        w = b.const(b.random_array(broadcast_shape(rng, x.shape), dt, 0 if dt == U8 else -k, k))
        ends = [x.lo + w.lo, x.hi + w.hi] if op == "Add" else \
            [x.lo - w.hi, x.hi - w.lo] if op == "Sub" else \
            [x.lo * w.lo, x.lo * w.hi, x.hi * w.lo, x.hi * w.hi] if op == "Mul" else [x.lo, x.hi, w.lo, w.hi]
        if dt in (U8, I8) and (min(ends) < np.iinfo(dt).min or max(ends) > np.iinfo(dt).max):
            continue   # wraparound differs by design between engines: stay in range
        x = b.op1(op, [x, w], dt, _bshape(x.shape, w.shape), min(ends), max(ends))
    return b.cast(x, v.dtype if rng.random() < 0.8 else F32)


def compare_where(b: GraphBuilder, v: Val, pool: list) -> Val:
    """A comparison into a bool mask (maybe Not/And/Or/Xor), then Where(mask, v, other)."""
    rng = b.rng
    w = operand(b, v, pool, widen=False)
    op = str(rng.choice(COMPARE if b.opset >= 12 else COMPARE[:3]))
    m = b.op1(op, [v, w], BOOL, _bshape(v.shape, w.shape), 0, 1)
    if rng.random() < 0.3:
        m = b.op1("Not", [m], BOOL, m.shape, 0, 1)
    if rng.random() < 0.3:
        m2 = b.input(broadcast_shape(rng, m.shape), BOOL)
        m = b.op1(str(rng.choice(["And", "Or", "Xor"])), [m, m2], BOOL, _bshape(m.shape, m2.shape), 0, 1)
    if rng.random() < 0.25:
        return b.cast(m, v.dtype)
    other = operand(b, v, pool)
    shape = _bshape(_bshape(m.shape, v.shape), other.shape)
    return b.op1("Where", [m, v, other], v.dtype, shape, min(v.lo, other.lo), max(v.hi, other.hi))


def epilogue(b: GraphBuilder, v: Val, pool: list, length: int) -> tuple[Val, list]:
    """A chain of elementwise ops after v; returns the last value and the chain's values
    (fan-out: later ops may read earlier chain values, e.g. x * sigmoid(x))."""
    rng = b.rng
    chain = [v]
    for _ in range(length):
        if v.size > MAX_ELEMS:
            break
        r = rng.random()
        if r < 0.4:
            v = unary(b, v)
        elif r < 0.68:
            v = binary(b, v, chain + pool if rng.random() < 0.7 else pool)
        elif r < 0.76:
            v = clip(b, v)
        elif r < 0.82:
            v = int_detour(b, v)
        elif r < 0.87:
            v = compare_where(b, v, chain)
        elif r < 0.92 and v.dtype != F16:
            other = F64 if v.dtype == F32 else F32
            v = b.cast(b.cast(b.scale_to(v, 1000.0), other), v.dtype)
        else:   # fan-out inside the group: u = f(v); v = v op u
            u = unary(b, v, str(rng.choice(["Sigmoid", "Tanh", "Relu", "Abs", "Exp", "Neg"])))
            if u.shape == v.shape:
                op = str(rng.choice(["Mul", "Add", "Sub", "Max"]))
                v2 = b.scale_to(v, 50.0)
                u = b.scale_to(u, 50.0)
                p = [v2.lo * u.lo, v2.lo * u.hi, v2.hi * u.lo, v2.hi * u.hi]
                lo, hi = {"Mul": (min(p), max(p)), "Add": (v2.lo + u.lo, v2.hi + u.hi),
                          "Sub": (v2.lo - u.hi, v2.hi - u.lo), "Max": (max(v2.lo, u.lo), max(v2.hi, u.hi))}[op]
                v = b.op1(op, [v2, u], v.dtype, v.shape, lo, hi)
            else:
                v = u
        if not v.is_float:
            v = b.cast(v, F32)
        chain.append(v)
    return v, chain


# ---------------------------------------------------------------- anchors


def _dims(rng, rank: int, most: int = 7) -> list:
    """Random dims, small, with 1s and odd sizes."""
    return [int(rng.choice([1, 2, 3, 4, 5, 6, 7, 8][:most])) for _ in range(rank)]


def _fit(b: GraphBuilder, v: Val, rank: int, want=None) -> Val:
    """v as a value of `rank` (dims `want` where given: a new input if v cannot be reshaped)."""
    rng = b.rng
    if want is not None:
        want = tuple(want)
        if math.prod(want) == v.size and rng.random() < 0.8:
            return b.reshape(v, want)
        return b.input(want, v.dtype if v.is_float else F32)
    if v.rank == rank and rng.random() < 0.8:
        return v
    shape = _factor(rng, v.size, rank)
    if shape is not None and v.size and rng.random() < 0.8:
        return b.reshape(v, shape)
    return b.input(_dims(rng, rank), v.dtype if v.is_float else F32)


def _factor(rng, n: int, rank: int):
    """A random shape of `rank` dims with product n (None when rank == 0 and n != 1)."""
    if rank == 0:
        return () if n == 1 else None
    if n == 0:      # an empty tensor: some dim 0, the others anything
        dims = [int(rng.integers(1, 4)) for _ in range(rank)]
        dims[int(rng.integers(rank))] = 0
        return tuple(dims)
    dims = [1] * rank
    m = n
    for p in _primes(n):
        dims[int(rng.integers(rank))] *= p
        m //= p
    return tuple(dims)


def _primes(n: int) -> list:
    out, p = [], 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    if n > 1:
        out.append(n)
    return out


_SIZES = {False: [1, 2, 3, 5, 7, 8, 16], True: [1, 4, 9, 16, 17, 24, 31, 33, 40]}


def _batch(rng) -> int:
    """A batch size: mostly 1, sometimes 2, now and then 0 (an empty batch)."""
    return int(rng.choice([1] * 12 + [2] * 5 + [0]))


def _weight(b: GraphBuilder, shape, fan_in: int, dtype) -> Val:
    s = 1.0 / math.sqrt(max(fan_in, 1))
    return b.const(b.random_array(shape, dtype, -s, s), "w")


def _lin_range(x: Val, w: np.ndarray, axes: tuple, bias: np.ndarray | None = None) -> tuple:
    """Range of a linear map of x with weights w summed over `axes` per output (|x| bound)."""
    s = float(np.abs(w.astype(np.float64)).sum(axis=axes).max()) if w.size else 0.0
    m = x.mag * s + (float(np.abs(bias).max()) if bias is not None and bias.size else 0.0)
    return -m, m


def _arr(b: GraphBuilder, v: Val) -> np.ndarray:
    return next(numpy_helper.to_array(t) for t in b.inits if t.name == v.name)


def conv(b: GraphBuilder, x: Val) -> Val:
    """Conv: 1-D/2-D/3-D, grouped or depthwise, strided, dilated, padded (explicit or auto_pad),
    with or without bias."""
    rng = b.rng
    nd = int(rng.choice([1, 2, 2, 2, 3]))
    kind = rng.choice(["plain", "plain", "grouped", "depthwise", "pointwise"])
    group = 1
    cin = int(rng.choice([1, 2, 3, 4, 6, 8] + ([16, 17, 32] if b.big else [])))
    if kind == "grouped":
        group = int(rng.choice([2, 3]))
        cin = group * int(rng.integers(1, 3))
    elif kind == "depthwise":
        group = cin
    cout = group * int(rng.integers(1, 4)) if group > 1 else \
        int(rng.choice([1, 2, 3, 4, 5, 8] + ([16, 17, 24, 32] if b.big else [])))
    ksz = [1] * nd if kind == "pointwise" else [int(rng.choice([1, 2, 3, 3, 5])) for _ in range(nd)]
    if nd == 3:
        ksz = [min(k, 3) for k in ksz]
    strides = [int(rng.choice([1, 1, 2, 3])) for _ in range(nd)]
    dil = [int(rng.choice([1, 1, 1, 2])) for _ in range(nd)]
    pads = [int(rng.integers(0, k)) if rng.random() < 0.5 else 0 for k in ksz] * 2
    sp_most = (5 if nd == 3 else 8 if nd == 2 else 12) * (2 if b.big else 1)
    spatial = [max(int(rng.integers(1, sp_most + 1)), (k - 1) * d + 1) for k, d in zip(ksz, dil)]
    n = _batch(rng)
    x = _fit(b, x, nd + 2, [n, cin] + spatial)
    x = b.scale_to(x, 4.0)
    w = _weight(b, (cout, cin // group, *ksz), cin // group * math.prod(ksz), x.dtype)
    ins = [x, w]
    bias = None
    if rng.random() < 0.6:
        bias = b.const(b.random_array((cout,), x.dtype, -0.5, 0.5), "bias")
        ins.append(bias)
    attrs = {"kernel_shape": ksz} if rng.random() < 0.7 else {}
    if any(s > 1 for s in strides) or rng.random() < 0.3:
        attrs["strides"] = strides
    if any(d > 1 for d in dil):
        attrs["dilations"] = dil
    if group > 1:
        attrs["group"] = group
    auto = rng.random() < 0.15
    if auto:
        attrs["auto_pad"] = str(rng.choice(["SAME_UPPER", "SAME_LOWER", "VALID"]))
        if attrs["auto_pad"] != "VALID" and any(d > 1 for d in dil):
            attrs["auto_pad"] = "VALID"
        if attrs["auto_pad"] == "VALID":
            out = [(s - ((k - 1) * d + 1)) // st + 1 for s, k, d, st in zip(spatial, ksz, dil, strides)]
        else:
            out = [-(-s // st) for s, st in zip(spatial, strides)]
    else:
        if any(pads):
            attrs["pads"] = pads
        out = [(s + pads[i] + pads[i + nd] - ((k - 1) * d + 1)) // st + 1
               for i, (s, k, d, st) in enumerate(zip(spatial, ksz, dil, strides))]
    lo, hi = _lin_range(x, _arr(b, w), tuple(range(1, nd + 2)), None if bias is None else _arr(b, bias))
    return b.op1("Conv", ins, x.dtype, (n, cout, *out), lo, hi, **attrs)


def conv_transpose(b: GraphBuilder, x: Val) -> Val:
    rng = b.rng
    nd = int(rng.choice([1, 2, 2]))
    group = int(rng.choice([1, 1, 2]))
    cin = group * int(rng.integers(1, 4))
    cout_g = int(rng.integers(1, 4))
    ksz = [int(rng.choice([1, 2, 3])) for _ in range(nd)]
    strides = [int(rng.choice([1, 2])) for _ in range(nd)]
    dil = [int(rng.choice([1, 1, 2])) for _ in range(nd)]
    spatial = [int(rng.integers(1, 6)) for _ in range(nd)]
    pads = [int(rng.integers(0, k)) if rng.random() < 0.4 else 0 for k in ksz] * 2
    opad = [int(rng.integers(0, st)) if rng.random() < 0.3 else 0 for st in strides]
    out = [st * (s - 1) + op + ((k - 1) * d + 1) - pads[i] - pads[i + nd]
           for i, (s, st, op, k, d) in enumerate(zip(spatial, strides, opad, ksz, dil))]
    if any(o < 1 for o in out):
        pads = [0] * (2 * nd)
        out = [st * (s - 1) + op + ((k - 1) * d + 1) for s, st, op, k, d in zip(spatial, strides, opad, ksz, dil)]
    nb = _batch(rng)
    x = _fit(b, x, nd + 2, [nb, cin] + spatial)
    x = b.scale_to(x, 4.0)
    w = _weight(b, (cin, cout_g, *ksz), cin // group * math.prod(ksz), x.dtype)
    ins = [x, w]
    if rng.random() < 0.5:
        ins.append(b.const(b.random_array((cout_g * group,), x.dtype, -0.5, 0.5), "bias"))
    attrs = {"strides": strides, "kernel_shape": ksz}
    if any(d > 1 for d in dil):
        attrs["dilations"] = dil
    if any(pads):
        attrs["pads"] = pads
    if any(opad):
        attrs["output_padding"] = opad
    if group > 1:
        attrs["group"] = group
    m = x.mag * float(np.abs(_arr(b, w)).sum()) + 0.5
    return b.op1("ConvTranspose", ins, x.dtype, (nb, cout_g * group, *out), -m, m, **attrs)


def matmul(b: GraphBuilder, x: Val) -> Val:
    """MatMul with batch broadcasting (1-D operands too), constant or input right operands."""
    rng = b.rng
    ra = int(rng.choice([1, 2, 2, 3, 4]))
    rb = int(rng.choice([1, 2, 2, 3]))
    m, k, n = (int(rng.choice(_SIZES[b.big])) for _ in range(3))
    batch = _dims(rng, max(ra, rb) - 2, 4) if max(ra, rb) > 2 else []
    a_shape = ([k] if ra == 1 else batch[len(batch) - (ra - 2):] + [m, k] if ra > 2 else [m, k])
    b_batch = batch[len(batch) - (rb - 2):] if rb > 2 else []
    b_batch = [1 if rng.random() < 0.3 else d for d in b_batch]
    b_shape = [k] if rb == 1 else b_batch + [k, n]
    x = _fit(b, x, ra, a_shape)
    x = b.scale_to(x, 4.0)
    if rng.random() < 0.7:
        w = _weight(b, b_shape, k, x.dtype)
        lo, hi = _lin_range(x, _arr(b, w), (-2,) if rb > 1 else (0,))
    else:
        w = b.input(b_shape, x.dtype, -1, 1)
        lo, hi = -x.mag * k, x.mag * k
    out = np.matmul(np.zeros(a_shape, np.float32), np.zeros(b_shape, np.float32)).shape
    return b.op1("MatMul", [x, w], x.dtype, out, lo, hi)


def gemm(b: GraphBuilder, x: Val) -> Val:
    """Gemm with transA/transB, alpha/beta and a broadcast C (or none)."""
    rng = b.rng
    m, k, n = (int(rng.choice(_SIZES[b.big])) for _ in range(3))
    ta, tb = int(rng.random() < 0.3), int(rng.random() < 0.5)
    x = _fit(b, x, 2, [k, m] if ta else [m, k])
    x = b.scale_to(x, 4.0)
    w = _weight(b, (n, k) if tb else (k, n), k, x.dtype) if rng.random() < 0.8 else \
        b.input((n, k) if tb else (k, n), x.dtype, -1, 1)
    ins = [x, w]
    alpha = float(rng.choice([1.0, 1.0, 0.5, 2.0]))
    beta = float(rng.choice([1.0, 1.0, 0.5]))
    if rng.random() < 0.7 or b.opset < 11:
        cshape = [(), (n,), (1, n), (m, 1), (m, n)][int(rng.integers(5))]
        ins.append(b.const(b.random_array(cshape, x.dtype, -1, 1), "bias"))
    attrs = {}
    if ta:
        attrs["transA"] = 1
    if tb:
        attrs["transB"] = 1
    if alpha != 1.0:
        attrs["alpha"] = alpha
    if beta != 1.0:
        attrs["beta"] = beta
    mag = alpha * x.mag * k * w.mag + beta
    return b.op1("Gemm", ins, x.dtype, (m, n), -mag, mag, **attrs)


REDUCE = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
          "ReduceLogSumExp", "ReduceSumSquare", "ReduceLogSum")


def reduce(b: GraphBuilder, x: Val) -> Val:
    """A Reduce*, ArgMax/ArgMin, Softmax/LogSoftmax, CumSum or a normalization over random axes."""
    rng = b.rng
    if x.rank == 0 or x.size > MAX_ELEMS:
        x = _fit(b, x, int(rng.integers(1, 5)))
    x = b.scale_to(x, 4.0)
    r = x.rank
    kind = rng.random()
    if kind < 0.15:
        op = str(rng.choice(["Softmax", "LogSoftmax"]))
        axis = int(rng.integers(-r, r))
        lo, hi = (0, 1) if op == "Softmax" else (-2 * x.mag - math.log(max(x.size, 1)) - 1, 0)
        return b.op1(op, [x], x.dtype, x.shape, lo, hi, axis=axis)
    if kind < 0.25:
        op = str(rng.choice(["ArgMax", "ArgMin"]))
        axis = int(rng.integers(-r, r))
        keep = int(rng.random() < 0.5)
        shape = tuple(1 if k == axis % r else d for k, d in enumerate(x.shape)) if keep else \
            tuple(d for k, d in enumerate(x.shape) if k != axis % r)
        attrs = {"axis": axis, "keepdims": keep}
        if b.opset >= 12 and rng.random() < 0.3:
            attrs["select_last_index"] = 1
        y = b.op1(op, [x], I64, shape, 0, x.shape[axis % r] - 1, **attrs)
        return b.cast(y, x.dtype)
    if kind < 0.32 and (x.dtype != F16 or b.opset >= 14):
        axis = int(rng.integers(-r, r))
        attrs = {k: 1 for k in ("exclusive", "reverse") if rng.random() < 0.3}
        n = x.shape[axis % r]
        return b.op1("CumSum", [x, b.ints(axis) if rng.random() < 0.5 else
                                b.const(np.array(axis, np.int32))], x.dtype, x.shape, -n * x.mag, n * x.mag, **attrs)
    if kind < 0.42 and b.opset >= 17 and r >= 1:
        axis = int(rng.integers(-r, r))
        nshape = x.shape[axis % r:]
        scale = b.const(b.random_array(nshape, x.dtype, 0.5, 1.5))
        ins = [x, scale]
        if rng.random() < 0.6:
            ins.append(b.const(b.random_array(nshape, x.dtype, -0.5, 0.5)))
        n = math.prod(nshape)
        bound = 1.5 * math.sqrt(n) + 0.5
        return b.op1("LayerNormalization", ins, x.dtype, x.shape, -bound, bound, axis=axis, epsilon=1e-3)
    op = str(rng.choice(REDUCE))
    if op == "ReduceLogSum":
        x = b.positive(x, 0.5)
    if op == "ReduceProd":
        x = b.scale_to(x, 1.0)
    axes = sorted(int(a) for a in rng.choice(r, size=int(rng.integers(1, r + 1)), replace=False)) \
        if r and rng.random() < 0.85 else None
    if axes is not None and rng.random() < 0.3:
        axes = [a - r for a in axes]
    keep = int(rng.random() < 0.5)
    red = set(range(r)) if axes is None else {a % r for a in axes}
    shape = tuple(1 if k in red else d for k, d in enumerate(x.shape)) if keep else \
        tuple(d for k, d in enumerate(x.shape) if k not in red)
    n = math.prod(x.shape[k] for k in red) if red else 1
    mag = x.mag
    lo, hi = {"ReduceSum": (-n * mag, n * mag), "ReduceMean": (-mag, mag), "ReduceMax": (x.lo, x.hi),
              "ReduceMin": (x.lo, x.hi), "ReduceProd": (-1, 1), "ReduceL1": (0, n * mag),
              "ReduceL2": (0, math.sqrt(n) * mag), "ReduceLogSumExp": (x.lo, x.hi + math.log(max(n, 1)) + 1e-3),
              "ReduceSumSquare": (0, n * mag * mag), "ReduceLogSum": (math.log(max(x.lo, 1e-3)), math.log(max(n * mag, 1e-3)) + 1)}[op]
    attrs = {"keepdims": keep}
    ins = [x]
    axes_as_input = b.opset >= 18 or (op == "ReduceSum" and b.opset >= 13)
    if axes is not None:
        if axes_as_input:
            ins.append(b.ints(axes))
        else:
            attrs["axes"] = axes
    return b.op1(op, ins, x.dtype, shape, lo, hi, **attrs)


def pool(b: GraphBuilder, x: Val) -> Val:
    """MaxPool/AveragePool (pads, strides, ceil_mode, count_include_pad, dilations), global
    pools and LpPool, 1-D to 3-D."""
    rng = b.rng
    nd = int(rng.choice([1, 2, 2, 3]))
    op = str(rng.choice(["MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LpPool"]))
    c = int(rng.integers(1, 5))
    spatial = [int(rng.integers(1, 8 if nd < 3 else 5)) for _ in range(nd)]
    nb = _batch(rng)
    x = _fit(b, x, nd + 2, [nb, c] + spatial)
    x = b.scale_to(x, 4.0)
    if op.startswith("Global"):
        return b.op1(op, [x], x.dtype, (nb, c) + (1,) * nd, x.lo, x.hi)
    ksz = [int(rng.integers(1, s + 1)) for s in spatial]
    strides = [int(rng.choice([1, 1, 2])) for _ in range(nd)]
    pads = [int(rng.integers(0, k)) if rng.random() < 0.4 else 0 for k in ksz] * 2
    dil = [1] * nd
    if op == "MaxPool" and b.opset >= 10 and rng.random() < 0.3:
        dil = [int(rng.choice([1, 2])) if s >= 2 * k - 1 else 1 for s, k in zip(spatial, ksz)]
    ceil = int(b.opset >= 10 and op != "LpPool" and rng.random() < 0.3)
    eff = [(k - 1) * d + 1 for k, d in zip(ksz, dil)]
    out = []
    for i, (s, e, st) in enumerate(zip(spatial, eff, strides)):
        span = s + pads[i] + pads[i + nd] - e
        out.append((-(-span // st) if ceil else span // st) + 1)
        if ceil and (out[-1] - 1) * st >= s + pads[i]:
            # a last window starting in the right padding: the spec (opset 19's note) drops it,
            # onnx's shape inference does not; stay out of that disagreement
            ceil = 0
    if not ceil:
        out = [(s + pads[i] + pads[i + nd] - e) // st + 1 for i, (s, e, st) in enumerate(zip(spatial, eff, strides))]
    attrs = {"kernel_shape": ksz}
    if any(s > 1 for s in strides):
        attrs["strides"] = strides
    if any(pads):
        attrs["pads"] = pads
    if ceil:
        attrs["ceil_mode"] = 1
    if any(d > 1 for d in dil):
        attrs["dilations"] = dil
    lo, hi = x.lo, x.hi
    if op == "AveragePool":
        if any(pads) and rng.random() < 0.5:
            attrs["count_include_pad"] = 1
        lo, hi = min(lo, 0), max(hi, 0)
    if op == "LpPool":
        attrs["p"] = int(rng.choice([1, 2]))
        lo, hi = 0, x.mag * math.prod(ksz)
    if op == "MaxPool" and any(pads):
        lo, hi = min(lo, x.lo), hi
    return b.op1(op, [x], x.dtype, (nb, c, *out), lo, hi, **attrs)


def resize(b: GraphBuilder, x: Val) -> Val:
    """Resize (opset >= 11): nearest (every rounding mode) or linear/cubic on the two inner
    dims, by scales or sizes, with the coordinate transformation modes."""
    rng = b.rng
    mode = str(rng.choice(["nearest", "linear", "cubic"]))
    h, w = int(rng.integers(1, 6)), int(rng.integers(1, 6))
    x = _fit(b, x, 4, [1, int(rng.integers(1, 4)), h, w])
    x = b.scale_to(x, 4.0)
    ctm = str(rng.choice(["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel"]))
    attrs = {"mode": mode, "coordinate_transformation_mode": ctm}
    if mode == "nearest":
        attrs["nearest_mode"] = str(rng.choice(["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]))
    if mode == "cubic" and rng.random() < 0.5:
        attrs["cubic_coeff_a"] = -0.5
    empty = b.const(np.zeros(0, x.dtype if b.opset < 13 else np.float32), "roi") if b.opset < 13 else None
    roi = empty if b.opset < 13 else None
    if rng.random() < 0.5:
        sc = [1.0, 1.0] + [float(rng.choice([0.5, 1.0, 1.5, 2.0, 3.0])) for _ in range(2)]
        out = [int(math.floor(d * s)) for d, s in zip(x.shape, sc)]
        if min(out) < 1:
            sc, out = [1.0, 1.0, 2.0, 2.0], [x.shape[0], x.shape[1], 2 * h, 2 * w]
        if ctm == "align_corners" and any(d * s != o for d, s, o in zip(x.shape, sc, out)):
            # the spec's length_resized is length * scale (2.5), ORT's the floored size (2)
            attrs["coordinate_transformation_mode"] = ctm = "half_pixel"
        ins = [x, roi if roi is not None else "", b.const(np.array(sc, np.float32), "scales")]
    else:
        out = list(x.shape[:2]) + [int(rng.integers(1, 9)) for _ in range(2)]
        scales = b.const(np.zeros(0, np.float32), "scales") if b.opset < 13 else None
        ins = [x, roi if roi is not None else "", scales if scales is not None else "", b.ints(out)]
    if ctm == "align_corners" and min(out[2:]) == 1:
        attrs["coordinate_transformation_mode"] = "half_pixel"   # 0/0 there: engines differ
    m = x.mag * (1.6 if mode == "cubic" else 1.0)
    return b.op1("Resize", ins, x.dtype, tuple(out), -m, m, **attrs)


def gather(b: GraphBuilder, x: Val) -> Val:
    """Gather along a random axis with constant (negative ones too) or input indices."""
    rng = b.rng
    if x.rank == 0:
        x = _fit(b, x, 2)
    if x.size == 0:
        x = b.input(_dims(rng, x.rank), x.dtype)
    axis = int(rng.integers(-x.rank, x.rank))
    n = x.shape[axis % x.rank]
    ishape = tuple(_dims(rng, int(rng.integers(0, 3)), 4))
    idx = rng.integers(-n, n, size=ishape)
    if rng.random() < 0.7:
        iv = b.const(idx.astype(rng.choice([np.int64, np.int32])), "idx")
    else:
        iv = b.input(ishape, I64, -n, n - 1)
    a = axis % x.rank
    shape = x.shape[:a] + ishape + x.shape[a + 1:]
    return b.op1("Gather", [x, iv], x.dtype, shape, x.lo, x.hi, axis=axis)


def normalize(b: GraphBuilder, x: Val) -> Val:
    """BatchNormalization (inference) or InstanceNormalization on (N, C, ...)."""
    rng = b.rng
    c = int(rng.integers(1, 5))
    x = _fit(b, x, int(rng.choice([3, 4])), None)
    if x.rank < 3:
        x = _fit(b, x, 4, [1, c, 3, 3])
    c = x.shape[1]
    x = b.scale_to(x, 4.0)
    scale = b.const(b.random_array((c,), x.dtype, 0.5, 1.5))
    bias = b.const(b.random_array((c,), x.dtype, -0.5, 0.5))
    if rng.random() < 0.5:
        mean = b.const(b.random_array((c,), x.dtype, -0.5, 0.5))
        var = b.const(b.random_array((c,), x.dtype, 0.5, 1.5))
        m = (x.mag + 0.5) * 1.5 / math.sqrt(0.5) + 0.5
        return b.op1("BatchNormalization", [x, scale, bias, mean, var], x.dtype, x.shape, -m, m, epsilon=1e-3)
    n = math.prod(x.shape[2:])
    m = 1.5 * math.sqrt(n) + 0.5
    return b.op1("InstanceNormalization", [x, scale, bias], x.dtype, x.shape, -m, m, epsilon=1e-3)


ANCHORS = {"Conv": conv, "ConvTranspose": conv_transpose, "MatMul": matmul, "Gemm": gemm,
           "Reduce": reduce, "Pool": pool, "Resize": resize, "Gather": gather, "Normalize": normalize}
ANCHOR_WEIGHTS = {"Conv": 5, "ConvTranspose": 1.5, "MatMul": 3, "Gemm": 2, "Reduce": 3, "Pool": 2,
                  "Resize": 1.2, "Gather": 1.2, "Normalize": 1}


# ---------------------------------------------------------------- views and injective ops


def view(b: GraphBuilder, x: Val, pool: list) -> tuple[Val, list]:
    """One view/injective op; returns the new value and extra outputs worth exporting."""
    rng = b.rng
    ops = ["Reshape", "Transpose", "Slice", "Expand", "Concat", "Split", "Unsqueeze", "Squeeze",
           "Flatten", "Pad", "Tile"]
    op = str(rng.choice(ops))
    r = x.rank
    if op == "Reshape" or (r == 0 and op in ("Transpose", "Slice", "Concat", "Split", "Squeeze", "Pad",
                                              "Tile", "Flatten")):
        rank = int(rng.integers(1, 5))
        shape = _factor(rng, x.size, rank)
        return b.reshape(x, shape), []
    if op == "Transpose":
        perm = [int(p) for p in rng.permutation(r)]
        attrs = {"perm": perm} if rng.random() < 0.85 else {}
        if not attrs:
            perm = list(range(r))[::-1]
        return b.op1("Transpose", [x], x.dtype, tuple(x.shape[p] for p in perm), x.lo, x.hi, **attrs), []
    if op == "Slice":
        axes = sorted(int(a) for a in rng.choice(r, size=int(rng.integers(1, r + 1)), replace=False))
        starts, ends, steps, shape = [], [], [], list(x.shape)
        for a in axes:
            n = x.shape[a]
            step = int(rng.choice([1, 1, 1, 2, -1, -2]))
            s = int(rng.integers(-n, n)) if n > 0 else 0
            e = int(rng.integers(-n - 1, n + 2))
            if rng.random() < 0.15:
                e = 2 ** 31 - 1 if step > 0 else -(2 ** 31)      # "to the end" as exporters write it
            length = len(range(n)[slice(s, e, step)])
            if length == 0:
                s, e, step, length = 0, n, 1, n
            starts.append(s)
            ends.append(e)
            steps.append(step)
            shape[a] = length
        ins = [x, b.ints(starts), b.ints(ends)]
        if rng.random() < 0.5 or any(s != 1 for s in steps) or axes != list(range(len(axes))):
            ins.append(b.ints([a - r if rng.random() < 0.3 else a for a in axes]))
            if any(s != 1 for s in steps) or rng.random() < 0.5:
                ins.append(b.ints(steps))
        return b.op1("Slice", ins, x.dtype, tuple(shape), x.lo, x.hi), []
    if op == "Expand":
        extra = int(rng.integers(0, 2)) if x.rank < 4 else 0
        target = [int(rng.integers(1, 4)) for _ in range(extra)] + \
                 [int(rng.integers(2, 4)) if d == 1 and rng.random() < 0.6 else d for d in x.shape]
        out = _bshape(x.shape, tuple(target))
        if math.prod(out) > MAX_ELEMS:
            return x, []
        shape_in = [1 if (rng.random() < 0.3 and k >= extra and target[k] == x.shape[k - extra]) else t
                    for k, t in enumerate(target)]
        return b.op1("Expand", [x, b.ints(shape_in)], x.dtype, out, x.lo, x.hi), []
    if op == "Concat":
        axis = int(rng.integers(-r, r))
        a = axis % r
        parts = [x]
        for _ in range(int(rng.integers(1, 3))):
            shape = list(x.shape)
            shape[a] = int(rng.integers(1, 4))
            c = rng.random()
            if c < 0.3:
                parts.append(x)
            elif c < 0.6:
                parts.append(b.const(b.random_array(shape, x.dtype, x.lo, x.hi)))
            else:
                parts.append(b.input(shape, x.dtype, -1, 1))
        out = list(x.shape)
        out[a] = sum(p.shape[a] for p in parts)
        return b.op1("Concat", parts, x.dtype, tuple(out), min(p.lo for p in parts),
                     max(p.hi for p in parts), axis=axis), []
    if op == "Split":
        cands = [k for k in range(r) if x.shape[k] >= 2]
        if not cands:
            return x, []
        a = int(rng.choice(cands))
        n = x.shape[a]
        k = int(rng.integers(2, min(n, 4) + 1))
        cuts = sorted(int(c) for c in rng.choice(range(1, n), size=k - 1, replace=False))
        sizes = [e - s for s, e in zip([0] + cuts, cuts + [n])]
        attrs = {"axis": a - r if rng.random() < 0.3 else a}
        ins = [x]
        equal = n % k == 0 and rng.random() < 0.4
        if equal:
            sizes = [n // k] * k
            if b.opset >= 18:
                attrs["num_outputs"] = k
        elif b.opset >= 13:
            ins.append(b.ints(sizes))
        else:
            attrs["split"] = sizes
        outs = []
        for s in sizes:
            shape = list(x.shape)
            shape[a] = s
            outs.append((x.dtype, tuple(shape), x.lo, x.hi))
        vs = b.node("Split", ins, outs, **attrs)
        pick = int(rng.integers(len(vs)))
        return vs[pick], [v for i, v in enumerate(vs) if i != pick and rng.random() < 0.5]
    if op == "Unsqueeze":
        k = int(rng.integers(0, r + 1))
        out = x.shape[:k] + (1,) + x.shape[k:]
        ax = [k if rng.random() < 0.7 else k - (r + 1)]
        if b.opset >= 13:
            return b.op1("Unsqueeze", [x, b.ints(ax)], x.dtype, out, x.lo, x.hi), []
        return b.op1("Unsqueeze", [x], x.dtype, out, x.lo, x.hi, axes=ax), []
    if op == "Squeeze":
        ones = [k for k in range(r) if x.shape[k] == 1]
        if not ones:
            return x, []
        ax = ones if rng.random() < 0.5 else [int(rng.choice(ones))]
        out = tuple(d for k, d in enumerate(x.shape) if k not in ax)
        if len(ax) == len(ones) and rng.random() < 0.3:
            return b.op1("Squeeze", [x], x.dtype, out, x.lo, x.hi), []
        if b.opset >= 13:
            return b.op1("Squeeze", [x, b.ints(ax)], x.dtype, out, x.lo, x.hi), []
        return b.op1("Squeeze", [x], x.dtype, out, x.lo, x.hi, axes=ax), []
    if op == "Flatten":
        axis = int(rng.integers(-r, r + 1))
        a = axis + r if axis < 0 else axis
        out = (math.prod(x.shape[:a]), math.prod(x.shape[a:]))
        return b.op1("Flatten", [x], x.dtype, out, x.lo, x.hi, axis=axis), []
    if op == "Pad":
        mode = str(rng.choice(["constant", "reflect", "edge"]))
        pads = [int(rng.integers(0, 3)) if rng.random() < 0.5 else 0 for _ in range(2 * r)]
        if mode == "reflect":
            pads = [max(0, min(p, x.shape[k % r] - 1)) for k, p in enumerate(pads)]
        if mode != "constant":   # an empty axis has nothing to mirror or repeat
            pads = [0 if x.shape[k % r] == 0 else p for k, p in enumerate(pads)]
        out = tuple(d + pads[k] + pads[k + r] for k, d in enumerate(x.shape))
        if math.prod(out) > MAX_ELEMS:
            return x, []
        ins = [x, b.ints(pads)]
        lo, hi = x.lo, x.hi
        if mode == "constant":
            cv = float(rng.uniform(-1, 1))
            if rng.random() < 0.6:
                ins.append(b.const(np.array(cv, dtype=x.dtype)))
            else:
                cv = 0.0
            lo, hi = min(lo, cv), max(hi, cv)
        return b.op1("Pad", ins, x.dtype, out, lo, hi, mode=mode), []
    # Tile
    reps = [int(rng.choice([1, 1, 2, 3])) for _ in range(r)]
    out = tuple(d * k for d, k in zip(x.shape, reps))
    if math.prod(out) > MAX_ELEMS:
        return x, []
    return b.op1("Tile", [x, b.ints(reps)], x.dtype, out, x.lo, x.hi), []


# ---------------------------------------------------------------- motifs the passes rewrite


def motif(b: GraphBuilder, x: Val, pool: list) -> tuple[Val, list]:
    """A subgraph in the form exporters write and kiln's passes recognise or simplify:
    LayerNorm and GELU spelled out, attention, Conv+BatchNorm, MatMul+Add, transpose
    sandwiches, no-op chains, duplicated subexpressions, constant subgraphs and the
    Shape->Gather->Concat->Reshape idiom of dynamic exporters."""
    rng = b.rng
    names = ["layernorm", "gelu", "attention", "conv_bn", "matmul_add", "transposes", "nops",
             "duplicate", "const_subgraph", "dynamic_reshape", "residual", "softmax_spelled",
             "mobile_block", "mobile_block"]
    kind = str(rng.choice(names))
    x = x if x.is_float else b.cast(x, F32)
    if x.rank == 0:
        x = _fit(b, x, 2)
    x = b.scale_to(x, 4.0)
    dt = x.dtype
    c = lambda v: b.const(np.array(v, dtype=dt))  # noqa: E731
    if kind == "mobile_block":
        return mobile_block(b, x), []
    if kind == "layernorm":
        axis = -1 if rng.random() < 0.7 else -x.rank
        axes = [axis] if axis == -1 else list(range(x.rank))
        mean = _reduce_mean(b, x, axes)
        d = b.op1("Sub", [x, mean], dt, x.shape, -2 * x.mag, 2 * x.mag)
        sq = b.op1("Pow", [d, c(2.0)], dt, x.shape, 0, 4 * x.mag ** 2) if rng.random() < 0.5 else \
            b.op1("Mul", [d, d], dt, x.shape, 0, 4 * x.mag ** 2)
        var = _reduce_mean(b, sq, axes)
        ve = b.op1("Add", [var, c(1e-3)], dt, var.shape, 1e-3, var.hi + 1e-3)
        sd = b.op1("Sqrt", [ve], dt, var.shape, 0.03, math.sqrt(ve.hi))
        nrm = b.op1("Div", [d, sd], dt, x.shape, -math.sqrt(x.size) - 1, math.sqrt(x.size) + 1)
        g = b.const(b.random_array(x.shape[-1:], dt, 0.5, 1.5))
        y = b.op1("Mul", [nrm, g], dt, x.shape, nrm.lo * 1.5, nrm.hi * 1.5)
        bias = b.const(b.random_array(x.shape[-1:], dt, -0.5, 0.5))
        return b.op1("Add", [y, bias], dt, x.shape, y.lo - 0.5, y.hi + 0.5), []
    if kind == "gelu":
        if rng.random() < 0.5:    # 0.5 * x * (1 + erf(x / sqrt(2)))
            t = b.op1("Div", [x, c(math.sqrt(2.0))], dt, x.shape, x.lo / 1.5, x.hi / 1.5)
            e = b.op1("Erf", [t], dt, x.shape, -1, 1)
        else:                     # 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
            x3 = b.op1("Pow", [x, c(3.0)], dt, x.shape, -x.mag ** 3, x.mag ** 3)
            t = b.op1("Mul", [x3, c(0.044715)], dt, x.shape, -0.05 * x.mag ** 3, 0.05 * x.mag ** 3)
            t = b.op1("Add", [x, t], dt, x.shape, -x.mag - t.hi, x.mag + t.hi)
            t = b.op1("Mul", [t, c(math.sqrt(2 / math.pi))], dt, x.shape, t.lo, t.hi)
            e = b.op1("Tanh", [t], dt, x.shape, -1, 1)
        e1 = b.op1("Add", [e, c(1.0)], dt, x.shape, 0, 2)
        h = b.op1("Mul", [x, c(0.5)], dt, x.shape, x.lo / 2, x.hi / 2)
        return b.op1("Mul", [h, e1], dt, x.shape, -x.mag, x.mag), []
    if kind == "attention":
        s, d = int(rng.integers(1, 9)), int(rng.choice([2, 4, 8]))
        heads = int(rng.choice([1, 2]))
        q = _fit(b, x, 3, [heads, s, d])
        k = b.input((heads, s, d), dt, -1, 1)
        v = b.input((heads, s, d), dt, -1, 1)
        kt = b.op1("Transpose", [k], dt, (heads, d, s), -1, 1, perm=[0, 2, 1])
        sc = b.op1("MatMul", [q, kt], dt, (heads, s, s), -q.mag * d, q.mag * d)
        sc = b.op1("Mul" if rng.random() < 0.5 else "Div", [sc, c(1 / math.sqrt(d)) if rng.random() < 0.5
                                                            else c(math.sqrt(d))],
                   dt, sc.shape, -q.mag * d, q.mag * d)
        if rng.random() < 0.4:
            mask = b.const(np.where(np.tril(np.ones((s, s))) > 0, 0.0, -1e4).astype(dt))
            sc = b.op1("Add", [sc, mask], dt, sc.shape, -1e4 - sc.mag, sc.mag)
        p = b.op1("Softmax", [sc], dt, sc.shape, 0, 1, axis=-1)
        return b.op1("MatMul", [p, v], dt, (heads, s, d), -1, 1), [sc] if rng.random() < 0.2 else []
    if kind == "conv_bn":
        y = conv(b, x)
        ch = y.shape[1]
        scale = b.const(b.random_array((ch,), dt, 0.5, 1.5))
        bias = b.const(b.random_array((ch,), dt, -0.5, 0.5))
        mean = b.const(b.random_array((ch,), dt, -0.5, 0.5))
        var = b.const(b.random_array((ch,), dt, 0.5, 1.5))
        m = (y.mag + 0.5) * 1.5 / math.sqrt(0.5) + 0.5
        return b.op1("BatchNormalization", [y, scale, bias, mean, var], dt, y.shape, -m, m, epsilon=1e-3), []
    if kind == "matmul_add":
        y = matmul(b, x) if rng.random() < 0.7 else gemm(b, x)
        bias = b.const(b.random_array(y.shape[-1:] if y.rank else (), dt, -1, 1))
        out = b.op1("Add", [y, bias] if rng.random() < 0.7 else [bias, y], dt, y.shape, y.lo - 1, y.hi + 1)
        return out, []
    if kind == "transposes":
        perm = [int(p) for p in rng.permutation(x.rank)]
        t = b.op1("Transpose", [x], dt, tuple(x.shape[p] for p in perm), x.lo, x.hi, perm=perm)
        t = unary(b, t, str(rng.choice(["Relu", "Neg", "Sigmoid", "Abs"])))
        if rng.random() < 0.5:
            t = binary(b, t, [], str(rng.choice(["Add", "Mul"])))
        back = [perm.index(k) for k in range(x.rank)] if rng.random() < 0.6 else \
            [int(p) for p in rng.permutation(t.rank)]
        return b.op1("Transpose", [t], dt, tuple(t.shape[p] for p in back), t.lo, t.hi, perm=back), []
    if kind == "nops":
        y = x
        for _ in range(int(rng.integers(1, 4))):
            op = str(rng.choice(["mul1", "add0", "reshape2", "cast_same", "identity", "dropout", "pad0",
                                 "slice_all", "expand_same", "sub0", "div1"]))
            if op in ("mul1", "add0", "sub0", "div1"):
                k = {"mul1": 1.0, "div1": 1.0, "add0": 0.0, "sub0": 0.0}[op]
                onnx_op = {"mul1": "Mul", "div1": "Div", "add0": "Add", "sub0": "Sub"}[op]
                shape = broadcast_shape(rng, y.shape)
                y = b.op1(onnx_op, [y, b.const(np.full(shape, k, dtype=dt))], dt, y.shape, y.lo, y.hi)
            elif op == "reshape2":
                mid = _factor(rng, y.size, int(rng.integers(1, 4)))
                y = b.reshape(b.reshape(y, mid), y.shape)
            elif op == "cast_same":
                y = b.op1("Cast", [y], dt, y.shape, y.lo, y.hi, to=_NP[dt])
            elif op == "identity":
                y = b.op1("Identity", [y], dt, y.shape, y.lo, y.hi)
            elif op == "dropout":
                y = b.node("Dropout", [y], [(dt, y.shape, y.lo, y.hi)])[0]
            elif op == "pad0":
                y = b.op1("Pad", [y, b.ints([0] * (2 * y.rank))], dt, y.shape, y.lo, y.hi)
            elif op == "slice_all" and y.rank:
                y = b.op1("Slice", [y, b.ints([0]), b.ints([2 ** 62]), b.ints([0])], dt, y.shape, y.lo, y.hi)
            elif op == "expand_same":
                y = b.op1("Expand", [y, b.ints(list(y.shape))], dt, y.shape, y.lo, y.hi)
        return y, []
    if kind == "duplicate":    # the same computation twice (CSE), combined
        op = str(rng.choice(["Sigmoid", "Exp", "Relu", "Tanh"]))
        u = unary(b, x, op)
        w = b.op1(op, [b.vals[b.nodes[-1].input[0]]], dt, u.shape, u.lo, u.hi)
        return b.op1("Add", [u, w], dt, u.shape, 2 * u.lo, 2 * u.hi), []
    if kind == "const_subgraph":   # weights computed from constants (constant folding)
        kdim = x.shape[-1]
        n = int(rng.choice(_SIZES[b.big]))
        w = _weight(b, (n, kdim), kdim, dt)
        wt = b.op1("Transpose", [w], dt, (kdim, n), w.lo, w.hi, perm=[1, 0])
        if rng.random() < 0.5:
            wt = b.op1("Mul", [wt, c(0.5)], dt, wt.shape, wt.lo / 2, wt.hi / 2)
        lo, hi = -x.mag * kdim * wt.mag, x.mag * kdim * wt.mag
        out = x.shape[:-1] + (n,) if x.rank > 1 else (n,)
        return b.op1("MatMul", [x, wt], dt, out, lo, hi), []
    if kind == "dynamic_reshape" and x.rank >= 2 and x.size:   # [d0, -1] of 0 elements is ambiguous
        # Shape -> Gather(0) -> Unsqueeze -> Concat([-1]) -> Reshape: flatten all but dim 0
        sh = b.op1("Shape", [x], I64, (x.rank,), 0, max(x.shape))
        d0 = b.op1("Gather", [sh, b.ints(0)], I64, (), 0, x.shape[0], axis=0)
        u = b.op1("Unsqueeze", [d0, b.ints([0])], I64, (1,), 0, x.shape[0]) if b.opset >= 13 else \
            b.op1("Unsqueeze", [d0], I64, (1,), 0, x.shape[0], axes=[0])
        tgt = b.op1("Concat", [u, b.ints([-1])], I64, (2,), -1, x.shape[0], axis=0)
        y = b.op1("Reshape", [x, tgt], dt, (x.shape[0], x.size // max(x.shape[0], 1)), x.lo, x.hi)
        return unary(b, y), []
    if kind == "residual":     # y = x + f(x): the anchor's input read again by its epilogue
        if x.rank == 4:
            ch = x.shape[1]
            w = _weight(b, (ch, ch, 1, 1), ch, dt)
            y = b.op1("Conv", [x, w], dt, x.shape, -x.mag * 2, x.mag * 2)
        else:
            kdim = x.shape[-1]
            w = _weight(b, (kdim, kdim), kdim, dt)
            y = b.op1("MatMul", [x, w], dt, x.shape, -x.mag * math.sqrt(kdim), x.mag * math.sqrt(kdim))
        y = unary(b, y, str(rng.choice(["Relu", "Sigmoid", "Tanh"])))
        return b.op1("Add", [x, y], dt, x.shape, x.lo + y.lo, x.hi + y.hi), []
    # softmax spelled out: exp(x - max) / sum(exp(x - max))
    mx = _reduce(b, "ReduceMax", x, [-1])
    d = b.op1("Sub", [x, mx], dt, x.shape, -2 * x.mag, 0)
    e = b.op1("Exp", [d], dt, x.shape, 0, 1)
    sm = _reduce(b, "ReduceSum", e, [-1])
    return b.op1("Div", [e, sm], dt, x.shape, 0, 1), []


def _conv2d(b: GraphBuilder, x: Val, cout: int, k: int, stride: int = 1, group: int = 1,
            bias: bool = True) -> Val:
    """A 2-D conv with 'same' padding (k odd) and constant weights."""
    n, cin, h, w = x.shape
    wt = _weight(b, (cout, cin // group, k, k), cin // group * k * k, x.dtype)
    ins = [x, wt]
    bv = None
    if bias:
        bv = b.const(b.random_array((cout,), x.dtype, -0.5, 0.5), "bias")
        ins.append(bv)
    p = k // 2
    out = (n, cout, (h + 2 * p - k) // stride + 1, (w + 2 * p - k) // stride + 1)
    lo, hi = _lin_range(x, _arr(b, wt), (1, 2, 3), None if bv is None else _arr(b, bv))
    attrs = {"kernel_shape": [k, k], "pads": [p] * 4}
    if stride > 1:
        attrs["strides"] = [stride, stride]
    if group > 1:
        attrs["group"] = group
    return b.op1("Conv", ins, x.dtype, out, lo, hi, **attrs)


def _act(b: GraphBuilder, x: Val) -> Val:
    """ReLU, ReLU6 (Clip 0..6) or HardSwish, as mobile nets write them."""
    r = b.rng.random()
    if r < 0.4:
        return b.op1("Relu", [x], x.dtype, x.shape, max(x.lo, 0), max(x.hi, 0))
    if r < 0.8 or b.opset < 14:
        if b.opset < 11:
            return b.op1("Clip", [x], x.dtype, x.shape, 0, 6, min=0.0, max=6.0)
        z, six = b.const(np.array(0, x.dtype)), b.const(np.array(6, x.dtype))
        return b.op1("Clip", [x, z, six], x.dtype, x.shape, 0, 6)
    return unary(b, x, "HardSwish")


def mobile_block(b: GraphBuilder, x: Val) -> Val:
    """A MobileNet-style block on float32 NCHW with channel counts that fill vector blocks:
    (stem 3x3 from 3 channels |) 1x1 expand -> act -> 3x3 depthwise -> act -> 1x1 project
    (+ residual), maybe a MaxPool: what the NCHWc layout pass rewrites at -O3."""
    rng = b.rng
    if x.dtype != F32:
        x = b.cast(x, F32)
    h, w = int(rng.integers(3, 11)), int(rng.integers(3, 11))
    if rng.random() < 0.4:
        x = _fit(b, x, 4, [1, 3, h, w])
        x = b.scale_to(x, 4.0)
        x = _act(b, _conv2d(b, x, int(rng.choice([8, 16, 32])), 3, int(rng.choice([1, 2]))))
    else:
        x = _fit(b, x, 4, [1, int(rng.choice([8, 16, 24, 32])), h, w])
        x = b.scale_to(x, 4.0)
    for _ in range(int(rng.integers(1, 3))):
        c = x.shape[1]
        e = int(rng.choice([16, 32, 48]))
        y = _act(b, _conv2d(b, x, e, 1, bias=rng.random() < 0.8))
        y = _act(b, _conv2d(b, y, e, 3, int(rng.choice([1, 1, 2])), group=e))
        y = b.scale_to(y, 8.0)
        cout = c if rng.random() < 0.6 else int(rng.choice([16, 24, 32]))
        y = _conv2d(b, y, cout, 1, bias=rng.random() < 0.8)
        if y.shape == x.shape and rng.random() < 0.7:
            y = b.op1("Add", [x, y], F32, y.shape, x.lo + y.lo, x.hi + y.hi)
        x = b.scale_to(y, 8.0)
    if rng.random() < 0.3 and min(x.shape[2:]) >= 2:
        out = (1, x.shape[1], (x.shape[2] - 2) // 2 + 1, (x.shape[3] - 2) // 2 + 1)
        x = b.op1("MaxPool", [x], F32, out, x.lo, x.hi, kernel_shape=[2, 2], strides=[2, 2])
    return x


def _reduce(b: GraphBuilder, op: str, x: Val, axes: list) -> Val:
    """op over `axes` with keepdims (axes an input from the opset where it is one)."""
    red = {a % x.rank for a in axes}
    shape = tuple(1 if k in red else d for k, d in enumerate(x.shape))
    n = math.prod(x.shape[k] for k in red)
    lo, hi = (x.lo, x.hi) if op != "ReduceSum" else (n * min(x.lo, 0), n * max(x.hi, 0))
    if b.opset >= 18 or (op == "ReduceSum" and b.opset >= 13):
        return b.op1(op, [x, b.ints(axes)], x.dtype, shape, lo, hi, keepdims=1)
    return b.op1(op, [x], x.dtype, shape, lo, hi, axes=axes, keepdims=1)


def _reduce_mean(b: GraphBuilder, x: Val, axes: list) -> Val:
    return _reduce(b, "ReduceMean", x, axes)


# ---------------------------------------------------------------- control flow, data-dependent sizes


def if_block(b: GraphBuilder, x: Val, pool: list) -> Val:
    """If(cond) with an anchor and its epilogue in the then-branch (reading x from the outer
    scope) and a small elementwise branch of the same type as the else-branch; cond is a
    graph input."""
    rng = b.rng
    start = len(b.nodes)
    names = [n for n in ANCHORS if n != "Resize" or b.opset >= 11]
    t = ANCHORS[str(rng.choice(names))](b, x)
    t, _ = epilogue(b, t, [], int(rng.integers(0, 3)))
    if not t.is_float:
        t = b.cast(t, F32)
    then_nodes = b.nodes[start:]
    del b.nodes[start:]
    then_out = unary(b, t, "Identity") if not then_nodes else t
    then_nodes += b.nodes[start:]
    del b.nodes[start:]
    other = b.input(t.shape, t.dtype, -1, 1) if rng.random() < 0.5 else \
        b.const(b.random_array(t.shape, t.dtype, -1, 1))
    e = unary(b, other, str(rng.choice(["Neg", "Sigmoid", "Abs", "Relu"])))
    else_nodes = b.nodes[start:]
    del b.nodes[start:]
    vi = lambda v: helper.make_tensor_value_info(v.name, _NP[v.dtype], list(v.shape))  # noqa: E731
    then_g = helper.make_graph(then_nodes, b.fresh("then"), [], [vi(then_out)])
    else_g = helper.make_graph(else_nodes, b.fresh("else"), [], [vi(e)])
    cond = b.input((), BOOL)
    b.feeds[cond.name] = np.array(rng.random() < 0.75)
    return b.node("If", [cond], [(t.dtype, t.shape, min(then_out.lo, e.lo), max(then_out.hi, e.hi))],
                  then_branch=then_g, else_branch=else_g)[0]


def data_dependent(b: GraphBuilder, x: Val, pool: list) -> Val:
    """Ops whose output size depends on the data (NonZero -> GatherND, Compress) or on a
    run-time k (TopK), then an epilogue: what the cpu target runs in stages."""
    rng = b.rng
    x = x if x.is_float else b.cast(x, F32)
    if x.rank == 0:
        x = _fit(b, x, 2)
    if x.size == 0:
        x = b.input(_dims(rng, x.rank), x.dtype)
    kind = str(rng.choice(["nonzero", "compress", "topk"]))
    if kind == "nonzero":
        thr = b.const(np.array(float(rng.uniform(x.lo, x.hi)) if x.hi > x.lo else 0.0, dtype=x.dtype))
        m = b.op1("Greater", [x, thr], BOOL, x.shape, 0, 1)
        nz = b.node("NonZero", [m], [(I64, (x.rank, x.size), 0, max(x.shape))])[0]
        idx = b.op1("Transpose", [nz], I64, (x.size, x.rank), 0, max(x.shape), perm=[1, 0])
        y = b.op1("GatherND", [x, idx], x.dtype, (x.size,), x.lo, x.hi)
    elif kind == "compress":
        axis = int(rng.integers(0, x.rank))
        n = x.shape[axis]
        cond = b.input((n,), BOOL)
        shape = list(x.shape)
        y = b.op1("Compress", [x, cond], x.dtype, tuple(shape), x.lo, x.hi, axis=axis)
    else:
        axis = int(rng.integers(-x.rank, x.rank))
        n = x.shape[axis % x.rank]
        k = int(rng.integers(1, n + 1))
        attrs = {"axis": axis}
        if rng.random() < 0.3:
            attrs["largest"] = 0
        shape = list(x.shape)
        shape[axis % x.rank] = k
        vals, idx = b.node("TopK", [x, b.ints([k])], [(x.dtype, tuple(shape), x.lo, x.hi),
                                                      (I64, tuple(shape), 0, n - 1)], **attrs)
        fi = b.cast(idx, x.dtype)
        y = b.op1("Add", [vals, fi], x.dtype, vals.shape, vals.lo, vals.hi + n)
    # shapes of NonZero/Compress results are data-dependent: the builder's shape is an upper
    # bound, so what follows is elementwise with scalar constants, then a reduction to ()
    for _ in range(int(rng.integers(0, 3))):
        op = str(rng.choice(["Relu", "Sigmoid", "Tanh", "Neg", "Abs"]))
        y = unary(b, y, op)
        if rng.random() < 0.4:
            y = b.op1("Mul", [y, b.const(np.array(rng.uniform(0.5, 2), dtype=y.dtype))], y.dtype,
                      y.shape, y.lo * 2 if y.lo < 0 else y.lo * 0.5, y.hi * 2)
    if kind == "topk":
        return y
    return b.op1("ReduceSum", [y], y.dtype, (), -y.mag * y.size, y.mag * y.size, keepdims=0)


# ---------------------------------------------------------------- whole graphs


def random_model(rng: np.random.Generator, opset: int | None = None) -> tuple[GraphBuilder, list[Val]]:
    """A random valid model: returns the builder (nodes, inputs, feeds) and its outputs."""
    opset = int(rng.choice(OPSETS)) if opset is None else opset
    sym_prob = float(rng.choice([0.0, 0.0, 0.3, 0.6]))
    b = GraphBuilder(rng, opset, sym_prob, big=rng.random() < 0.25)
    dtype = np.dtype(rng.choice([F32] * 8 + [F64, F16]))
    dims = _dims(rng, int(rng.integers(1, 5)))
    if rng.random() < 0.02:
        dims[int(rng.integers(len(dims)))] = 0      # an empty tensor
    x = b.input(dims, dtype)
    pool, outputs = [x], []
    for _ in range(int(rng.integers(1, 5))):
        r = rng.random()
        if r < 0.05:
            x = if_block(b, x, pool)
            pool.append(x)
        elif r < 0.09:
            x = data_dependent(b, x, pool)
            pool.append(x)
        elif r < 0.24:
            x, extra = motif(b, x, pool)
            outputs += extra
            pool.append(x)
            x, chain = epilogue(b, x, pool, int(rng.integers(0, 3)))
            pool += chain[1:]
        elif r < 0.65:
            names = list(ANCHORS)
            w = np.array([ANCHOR_WEIGHTS[n] for n in names])
            name = str(rng.choice(names, p=w / w.sum()))
            if name == "Resize" and opset < 11:
                name = "Conv"
            if rng.random() < 0.3:   # an injective prologue before the anchor
                for _ in range(int(rng.integers(1, 3))):
                    x, extra = view(b, x, pool)
                    outputs += extra
            x = ANCHORS[name](b, x)
            pool.append(x)
            if rng.random() < 0.15:
                outputs.append(x)        # the anchor's result exported, and also used by the epilogue
            x, chain = epilogue(b, x, pool, int(rng.integers(0, 5)))
            pool += chain[1:]
        elif r < 0.88:
            for _ in range(int(rng.integers(1, 4))):
                x, extra = view(b, x, pool)
                outputs += extra
                pool.append(x)
        else:
            x, chain = epilogue(b, x, pool, int(rng.integers(1, 5)))
            pool += chain[1:]
        if x.size > MAX_ELEMS:
            x = b.op1("ReduceMax", [x], x.dtype, (), x.lo, x.hi, keepdims=0)
        if rng.random() < 0.2 and len(pool) > 2:
            outputs.append(pool[int(rng.integers(1, len(pool)))])   # an intermediate exported
    outputs.insert(0, x)
    if x.name in b.feeds:     # the graph did nothing to its input: give it one op
        outputs[0] = unary(b, x, "Neg") if x.is_float else b.cast(x, F32)
    outputs = [o for o in outputs if o.name not in b.feeds]
    return b, outputs


def generate(seed: int, levels_per_graph: int = len(LEVELS), opset: int | None = None) -> Case:
    """The case of `seed`: the same seed always gives the same model, feeds and levels."""
    rng = np.random.default_rng([seed, 0x6B696C6E])
    b, outputs = random_model(rng, opset)
    model = b.model(outputs)
    return Case(seed, model, dict(b.feeds), levels_for(seed, levels_per_graph), list(b.ops))
