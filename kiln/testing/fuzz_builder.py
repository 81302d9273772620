"""The fuzzer's graph builder: values with a known shape, dtype and value range (`Val`),
the `GraphBuilder` that makes nodes of them, and a generated `Case`.

Validity is by construction: the builder knows every value's concrete shape, dtype and a
range of its values (`Val.lo`/`Val.hi`), so ops with a restricted domain get guarded inputs.
The reusable part of the generator (the mutation fuzzer builds on it).
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
STEP_OFFSET = 0.381966     # 2 - the golden ratio: added before a step function (GraphBuilder.off_steps)
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

    def off_steps(self, v: Val) -> Val:
        """v + STEP_OFFSET, the input of an op with steps at the integers or half-integers
        (Floor, Ceil, Round, Sign, a Cast to an integer type). A value that is an integer or a
        simple fraction by construction (a softmax's total 1, Relu's 0, x - max(x)) sits on a
        step, where two engines one ulp apart (a float32 sum in another order, both within
        tolerance) give results a whole step apart: not a bug, and no tolerance can tell it
        from one. Moved by the offset, integers and halves, thirds, quarters, tenths are at
        least 0.018 from every step; random values still fall on every side of every step."""
        if not v.is_float:
            return v
        c = self.const(np.array(STEP_OFFSET, dtype=v.dtype))
        return self.op1("Add", [v, c], v.dtype, v.shape, v.lo + STEP_OFFSET, v.hi + STEP_OFFSET)

    def break_ties(self, v: Val, axis: int) -> Val:
        """v plus a ramp along `axis` (i * delta at position i), the input of an op whose
        positions are compared (TopK's indices; ArgMax keeps its ties: select_last_index is
        about them, and no engine has split one so far). Equal values by construction (a
        Where of one scalar, a saturated Clip, Relu's zeros) are ties the reference keeps
        exact, while an engine may compute the same input an ulp apart in its vector body
        and scalar tail: another index, not a bug. delta (1e-3 of the range, 3e-2 in
        float16) is far beyond such ulps; random values keep their order but at near-ties."""
        axis %= v.rank
        n = v.shape[axis]
        if n < 2 or not v.is_float:
            return v
        delta = max(v.mag, 1e-2) * (3e-2 if v.dtype == np.float16 else 1e-3)
        ramp = (np.arange(n) * delta).astype(v.dtype).reshape((n,) + (1,) * (v.rank - 1 - axis))
        c = self.const(ramp, "ramp")
        return self.op1("Add", [v, c], v.dtype, v.shape, v.lo, v.hi + (n - 1) * delta)

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
