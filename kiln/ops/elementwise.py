"""Elementwise operators: unary math and activations, broadcasting binary
arithmetic/comparison/logic, variadic Max/Min/Sum/Mean, Where, Clip, casts,
Dropout and Identity.

Most ops are registered from tables whose rows hold both the NumPy reference
and the native lowering (a `kiln.loops` expression builder; `L.` names are loop
expressions, `np.` names the reference). Float16/bfloat16 math is computed in
float32 and rounded back; every result is cast to the exact dtype `infer` gave.
"""

from __future__ import annotations

import functools
import math

import ml_dtypes
import numpy as np

import kiln.loops as L
from kiln.dtypes import DType
from kiln.errors import KilnError
from kiln.graph.types import TensorType
from kiln.loops.expr import walk
from kiln.ops.registry import lowering, register, same_as
from kiln.ops.shapes import broadcast_shapes

# ---------------------------------------------------------------- helpers

_ML_FLOATS = {d.np for d in DType if d.is_float and d.np.kind != "f"}  # bfloat16, float8, float4


def _is_float(dt: np.dtype) -> bool:
    return dt.kind == "f" or dt in _ML_FLOATS


def _up(x: np.ndarray) -> np.ndarray:
    """Low-precision floats widen to float32 for math (numpy lacks bfloat16/float8 loops)."""
    return x.astype(np.float32) if _is_float(x.dtype) and x.dtype.itemsize < 4 else x


def _as(y, dt: np.dtype) -> np.ndarray:
    """A result as an array (never a numpy scalar) of exactly dtype `dt`."""
    return np.asarray(y).astype(dt, copy=False)


def _str_attr(ctx, name: str, *default: str) -> str:
    v = ctx.attr(name, *default)
    return v.decode() if isinstance(v, bytes) else str(v)


_KINDS = {  # operand constraints by name: what each accepts
    "float": lambda d: d.is_float,
    "num": lambda d: d.is_float or d.is_int,
    "int": lambda d: d.is_int,
    "bool": lambda d: d is DType.bool,
    "any": lambda d: True,
}


def _check_kind(ctx, kind: str, idx=(0,)) -> None:
    for i in idx:
        if ctx.has_input(i) and not _KINDS[kind](ctx.dtype(i)):
            ctx.fail(f"input {i} must be a {kind} tensor, got {ctx.dtype(i)}")


# attribute -> allowed values, checked at inference for every op of this family
_CHOICES = {"approximate": ("none", "tanh"), "direction": ("LEFT", "RIGHT"), "fmod": (0, 1),
            "round_mode": ("up", "down", "nearest")}


def _check_choices(ctx) -> None:
    for name, allowed in _CHOICES.items():
        if ctx.has_attr(name):
            v = _str_attr(ctx, name) if isinstance(allowed[0], str) else ctx.attr(name)
            if v not in allowed:
                ctx.fail(f"attribute {name} must be one of {allowed}, got {v!r}")


def _check_same_dtype(ctx, idx):
    dts = [ctx.dtype(i) for i in idx if ctx.has_input(i)]
    if len(set(dts)) > 1:
        ctx.fail(f"inputs must share one element type, got {', '.join(map(str, dts))}")
    return dts[0]


def _reg(name, infer, run):
    """Register with the family's attribute checks run before `infer` (compile-time values are
    propagated by the generic inference, which runs `run` on small known inputs)."""
    def checked_infer(ctx):
        _check_choices(ctx)
        return infer(ctx)
    register(name, infer=checked_infer, run=run)


# ---------------------------------------------------------------- native lowering helpers


def _at(t: L.Tensor, idx: tuple, pad: int = 0) -> L.Expr:
    """t's element at output index `idx` under numpy broadcasting: t's dims (plus `pad`
    trailing unit dims, the pre-opset-7 `axis` form) align right, size-1 dims read 0."""
    start = len(idx) - len(t.shape) - pad
    return t[tuple(0 if s == 1 else i for s, i in zip(t.shape, idx[start:]))]


def _wide(dt: DType) -> DType:
    """The dtype math runs in: float16, bfloat16, float8/float4 in float32 (as the reference),
    others as they are."""
    return DType.float32 if dt is DType.float16 or (dt.is_narrow and dt.is_float) else dt


def _up_e(e: L.Expr) -> L.Expr:
    return L.cast(_wide(e.dtype), e)


def _injective_schedule(sch, outputs) -> None:
    """Outer loops fused and parallel, the innermost one vectorized and never fused: fusing it
    (as default_schedule does) leaves div/mod index math in the hot loop that the simplifier
    cannot fold back. The inner loop is split when the outer part is too short to give threads
    work, or to buffer `_let` stages a row (chunk) at a time inside the output's loop: a scalar
    loop of libm calls into a stack buffer, then a vector loop."""
    from kiln.lower.schedules import PARALLEL_MIN_WORK, vector_lanes
    lets = [st for st in sch.stages if st.tensor not in sch.outputs]
    rows = {}
    for st in sch.stages:
        ext = [v.arg.dom[1] for v in st.axis]
        if st in lets or not ext or 0 in ext:
            continue
        axes = list(st.axis)
        lanes = max(vector_lanes(st.tensor.dtype.itemsize), 1)
        parallel = math.prod(ext) >= PARALLEL_MIN_WORK
        inner, n = axes.pop(), ext[-1]
        chunk = _divisor_near(n, lanes * -(-n // (64 * lanes))) \
            if parallel and math.prod(ext[:-1]) < 64 and n >= 128 * lanes \
            else _divisor_near(n, _LET_ROW) if lets and (not axes or n > _LET_ROW) else None
        if chunk:
            outer_part, inner = st.split(inner, chunk)
            axes.append(outer_part)
        if n > 1:
            st.vectorize(inner)
        if axes:
            rows[st] = st.fuse(*axes) if len(axes) > 1 else axes[0]
            if parallel:
                st.parallel(rows[st])
    for st in lets:
        users = sch.consumers(st)
        if len(users) == 1 and users[0] in rows:
            st.compute_at(users[0], rows[users[0]])
            if st.axis[-1].arg.dom[1] > 1:
                st.vectorize(st.axis[-1])
        else:  # a 0-d output, or a stage read by another: evaluated where used
            st.compute_inline()


def _divisor_near(n: int, most: int) -> int:
    """A split factor <= most: a divisor of n in [most/4, most] when there is one (no tail)."""
    if n <= most:
        return n
    return next((d for d in range(most, most // 4 - 1, -1) if n % d == 0), most)


_LET_ROW = 1024  # elements of a `_let` stage buffered at a time (4 KiB of float32, on the stack)
_BINDERS: list = []  # while `_map` builds a body: how `_let` makes a stage at the current index


def _let(e: L.Expr) -> L.Expr:
    """Evaluate `e` once per element, as its own stage, where a formula uses it twice: C sees
    the expression tree, not the DAG, and does not merge repeated libm calls."""
    return _BINDERS[-1](e) if _BINDERS else e


def _bind(shape, idx, e: L.Expr) -> L.Expr:
    if not any(s.op == "load" for s in walk(e)):
        return e
    t = L.compute(shape, lambda *j: L.substitute(e, dict(zip(idx, j))), "t")
    return t[idx]


# ops whose lowering only selects or copies values: they move kiln_str elements as they are
_MOVES_STRINGS = {"Where", "Identity"}


def _native(ctx) -> None:
    """Fail clearly on element types the C backend cannot hold (string, complex; bfloat16,
    float8 and the sub-byte ints it stores as bytes and computes on in float32/int32), and pick
    the schedule."""
    for what, types in (("input", ctx.input_types), ("output", ctx.output_types)):
        for k, t in enumerate(types):
            if t is not None and (t.dtype.c_storage is None or
                                  (t.dtype is DType.string and ctx.node.op not in _MOVES_STRINGS)):
                ctx.fail(f"{what} {k} has element type {t.dtype}, which native code (C) cannot hold",
                         stage="lower")
    ctx.schedule(_injective_schedule)


def _lowers(*names):
    """Attach one lowering to several ops; it gets the C-type check and the injective schedule."""
    def deco(fn):
        def lower(ctx, *ins):
            if ctx.node.op == "Equal" and ctx.input_types[0].dtype is DType.string:
                from kiln.lower.strings import string_equal  # a C kernel over kiln_str
                return string_equal(ctx, *ins)
            _native(ctx)
            return fn(ctx, *ins)
        for n in names:
            lowering(n)(lower)
        return fn
    return deco


def _map(ctx, fn, ins, pads=None, k: int = 0) -> L.Tensor:
    """Output k as fn(*inputs at the broadcast index), each input widened (_wide), cast to the
    output dtype; `_let` inside fn makes per-element stages."""
    pads = pads or [0] * len(ins)
    dt, shape = ctx.out_dtype(k), ctx.out_shape(k)

    def body(*i):
        _BINDERS.append(functools.partial(_bind, shape, i))
        try:
            return L.cast(dt, fn(*(_up_e(_at(t, i, p)) for t, p in zip(ins, pads))))
        finally:
            _BINDERS.pop()
    return L.compute(shape, body, f"y{k}")


# ---------------------------------------------------------------- erf

_ERF_W, _ERF_N, _ERF_DEG = 0.25, 24, 10  # pieces of width W on [0, W*N); erf = 1 beyond (erf(6) = 1 - 2e-17)


def _erf_table() -> np.ndarray:
    """Per-piece Chebyshev fits of erf(x)/x (smooth and even, so x*fit keeps relative accuracy near 0)."""
    t = np.cos(np.pi * (np.arange(_ERF_DEG + 1) + 0.5) / (_ERF_DEG + 1))
    return np.array([np.polynomial.chebyshev.chebfit(
        t, [math.erf(v) / v for v in (i + (t + 1) / 2) * _ERF_W], _ERF_DEG) for i in range(_ERF_N)])


_ERF_C = _erf_table()


def _erf(x: np.ndarray) -> np.ndarray:
    """float64 erf to ~2e-15 relative: piecewise Chebyshev (Clenshaw) evaluation, vectorized."""
    x = np.asarray(x, dtype=np.float64)
    a = np.minimum(np.nan_to_num(np.abs(x), nan=0.0), _ERF_W * _ERF_N)
    i = np.minimum((a / _ERF_W).astype(np.intp), _ERF_N - 1)
    t = a * (2 / _ERF_W) - (2 * i + 1)
    b1 = b2 = np.zeros_like(t)
    for k in range(_ERF_DEG, 0, -1):
        b1, b2 = _ERF_C[:, k].take(i) + 2 * t * b1 - b2, b1
    y = np.where(a >= _ERF_W * _ERF_N, 1.0, a * (_ERF_C[:, 0].take(i) + t * b1 - b2))
    return np.where(np.isnan(x), np.nan, np.copysign(y, x))


# ---------------------------------------------------------------- unary


def _sigmoid(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _gelu(x, approximate):
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _shrink(x, bias, lambd):
    return np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, 0))


# Loop-expression forms of the same formulas. x is already widened (float16 -> float32).

def _sigmoid_e(x):
    """The reference's overflow-free form, one exp: (x >= 0 ? 1 : e) / (1 + e), e = exp(-|x|)."""
    e = _let(L.exp(-L.fabs(x)))
    return L.select(x >= 0, L.const(1, x.dtype), e) / (1 + e)


def _expm1_e(x, nonpositive=True):
    """exp(x) - 1 without cancellation near 0 (C's expm1 is not a loop intrinsic): 2t / (1 - t)
    with t = tanh(x/2) for x < 1 (1 - t >= 0.5 there), exp(x) - 1 above. Activations need
    only x <= 0 (their other branch is x itself), so they skip the second formula."""
    t = _let(L.tanh(x * 0.5))
    small = 2 * t / (1 - t)
    return small if nonpositive else L.select(x < 1, small, L.exp(x) - 1)


def _softplus_e(x):
    """log(1 + exp(x)) = max(x, 0) + log1p(e), e = exp(-|x|), log1p(e) = 2 atanh(e / (e + 2))
    (accurate for tiny e, where log(1 + e) rounds to 0)."""
    e = _let(L.exp(-L.fabs(x)))
    return L.max_(x, 0) + 2 * L.atanh(e / (e + 2))


def _gelu_e(x, approximate):
    if approximate == "tanh":
        return 0.5 * x * (1 + L.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * (x * x * x))))
    # 1 + erf(z) = erfc(-z), which does not cancel for z << 0: accurate in x's own precision
    return 0.5 * x * L.erfc(-x * (1.0 / math.sqrt(2.0)))


def _shrink_e(x, bias, lambd):
    if not x.dtype.is_float:
        x = L.cast(DType.float64, x)  # integers meet the float attributes in float64, as in numpy
    return L.select(x < -lambd, x + bias, L.select(x > lambd, x - bias, L.const(0, x.dtype)))


def _neg_e(x):
    return x * -1.0 if x.dtype.is_float else 0 - x  # x * -1 keeps -0.0 and NaN signs as negation


def _clamp01(y):
    return L.min_(L.max_(y, 0), 1)  # np.clip(y, 0, 1), NaN propagating


# name -> (reference fn(x, **attrs), lowering fn(x: Expr, **attrs), {attr: default}, input kind)
_UNARY = {
    "Abs": (np.abs, L.abs_, {}, "num"),
    "Neg": (np.negative, _neg_e, {}, "num"),
    "Sign": (np.sign, L.sign, {}, "num"),
    "Relu": (lambda x: np.maximum(x, 0), lambda x: L.max_(x, 0), {}, "num"),
    "Ceil": (np.ceil, L.ceil, {}, "float"),
    "Floor": (np.floor, L.floor, {}, "float"),
    "Round": (np.round, L.round_, {}, "float"),  # half to even, as ONNX specifies (C's rint)
    "Exp": (np.exp, L.exp, {}, "float"),
    "Log": (np.log, L.log, {}, "float"),
    "Sqrt": (np.sqrt, L.sqrt, {}, "float"),
    "Reciprocal": (np.reciprocal, lambda x: 1 / x, {}, "float"),
    "Sin": (np.sin, L.sin, {}, "float"),
    "Cos": (np.cos, L.cos, {}, "float"),
    "Tan": (np.tan, L.tan, {}, "float"),
    "Asin": (np.arcsin, L.asin, {}, "float"),
    "Acos": (np.arccos, L.acos, {}, "float"),
    "Atan": (np.arctan, L.atan, {}, "float"),
    "Sinh": (np.sinh, L.sinh, {}, "float"),
    "Cosh": (np.cosh, L.cosh, {}, "float"),
    "Asinh": (np.arcsinh, L.asinh, {}, "float"),
    "Acosh": (np.arccosh, L.acosh, {}, "float"),
    "Atanh": (np.arctanh, L.atanh, {}, "float"),
    "Tanh": (np.tanh, L.tanh, {}, "float"),
    "Erf": (_erf, L.erf, {}, "float"),
    "Sigmoid": (_sigmoid, _sigmoid_e, {}, "float"),
    "Softsign": (lambda x: x / (1 + np.abs(x)), lambda x: x / (1 + L.fabs(x)), {}, "float"),
    "Softplus": (lambda x: np.logaddexp(0, x), _softplus_e, {}, "float"),
    "Mish": (lambda x: x * np.tanh(np.logaddexp(0, x)), lambda x: x * L.tanh(_softplus_e(x)), {}, "float"),
    "HardSwish": (lambda x: x * np.clip(x / 6 + 0.5, 0, 1), lambda x: x * _clamp01(x / 6 + 0.5), {}, "float"),
    "Elu": (lambda x, alpha: np.where(x > 0, x, alpha * np.expm1(x)),
            lambda x, alpha: L.select(x > 0, x, alpha * _expm1_e(x)), {"alpha": 1.0}, "float"),
    # max(x, 0) + min(0, a*expm1(x/a)) is x for x > 0 and the second term otherwise, for any a != 0
    "Celu": (lambda x, alpha: np.maximum(x, 0) + np.minimum(0, alpha * np.expm1(x / alpha)),
             lambda x, alpha: L.select(x > 0, x, alpha * _expm1_e(x / alpha, alpha > 0)), {"alpha": 1.0},
             "float"),
    "Selu": (lambda x, alpha, gamma: gamma * np.where(x > 0, x, alpha * np.expm1(x)),
             lambda x, alpha, gamma: gamma * L.select(x > 0, x, alpha * _expm1_e(x)),
             {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875}, "float"),
    "LeakyRelu": (lambda x, alpha: np.where(x >= 0, x, alpha * x),
                  lambda x, alpha: L.select(x >= 0, x, alpha * x), {"alpha": 0.01}, "float"),
    "ThresholdedRelu": (lambda x, alpha: np.where(x > alpha, x, 0),
                        lambda x, alpha: L.select(x > alpha, x, L.const(0, x.dtype)), {"alpha": 1.0},
                        "float"),
    "HardSigmoid": (lambda x, alpha, beta: np.clip(alpha * x + beta, 0, 1),
                    lambda x, alpha, beta: _clamp01(alpha * x + beta), {"alpha": 0.2, "beta": 0.5}, "float"),
    "Swish": (lambda x, alpha: x * _sigmoid(alpha * x), lambda x, alpha: x * _sigmoid_e(alpha * x),
              {"alpha": 1.0}, "float"),
    "Gelu": (_gelu, _gelu_e, {"approximate": "none"}, "float"),
    "Shrink": (_shrink, _shrink_e, {"bias": 0.0, "lambd": 0.5}, "num"),
}


def _attrs(ctx, defaults: dict) -> dict:
    return {k: _str_attr(ctx, k, d) if isinstance(d, str) else type(d)(ctx.attr(k, d))
            for k, d in defaults.items()}


def _register_unary(name, fn, lower_fn, defaults, kind):
    def infer(ctx):
        _check_kind(ctx, kind)
        return [ctx.tensor(0)]

    def run(ctx, x):
        kw = _attrs(ctx, defaults)
        with np.errstate(all="ignore"):
            return _as(fn(_up(x), **kw), x.dtype)

    _reg(name, infer, run)

    @_lowers(name)
    def lower(ctx, x):
        kw = _attrs(ctx, defaults)
        return _map(ctx, lambda v: lower_fn(v, **kw), [x])


for _name, _spec in _UNARY.items():
    _register_unary(_name, *_spec)


def _predicate_infer(ctx):
    _check_kind(ctx, "float")
    return [TensorType(DType.bool, ctx.shape(0))]


def _kind_same_as(kind):
    def infer(ctx):
        _check_kind(ctx, kind)
        return [ctx.tensor(0)]
    return infer


def _is_inf(ctx, x):
    pos, neg = ctx.attr("detect_positive", 1), ctx.attr("detect_negative", 1)
    x = _up(x)
    return _as((np.isposinf(x) & bool(pos)) | (np.isneginf(x) & bool(neg)), np.bool_)


def _is_inf_e(ctx, x):
    pos, neg = bool(ctx.attr("detect_positive", 1)), bool(ctx.attr("detect_negative", 1))
    inf = L.isinf(x)
    return inf if pos and neg else inf & (x > 0) if pos else inf & (x < 0) if neg \
        else L.const(False, DType.bool)


_reg("IsNaN", _predicate_infer, lambda ctx, x: _as(np.isnan(_up(x)), np.bool_))
_reg("IsInf", _predicate_infer, _is_inf)
_reg("Not", _kind_same_as("bool"), lambda ctx, x: _as(np.logical_not(x), np.bool_))
_reg("BitwiseNot", _kind_same_as("int"), lambda ctx, x: _as(np.invert(x), x.dtype))
_reg("Identity", same_as(0), lambda ctx, x: x)  # tensors, sequences (lists), optionals (None)

_lowers("IsNaN")(lambda ctx, x: _map(ctx, L.isnan, [x]))
_lowers("IsInf")(lambda ctx, x: _map(ctx, lambda v: _is_inf_e(ctx, v), [x]))
_lowers("Not", "BitwiseNot")(lambda ctx, x: _map(ctx, lambda v: ~v, [x]))
_lowers("Identity")(lambda ctx, x: x)  # the kernel gives an output that is an input its own copy


# ---------------------------------------------------------------- binary


def _b_pad(ctx, rank_a: int, rank_b: int) -> int:
    """Trailing 1-dims to give B before numpy broadcasting, for two pre-opset-7 forms:
    `broadcast=1, axis=k` (B lines up with A from dim k) and PRelu's per-channel 1-D slope."""
    if ctx.opset >= 7:
        return 0
    if ctx.node.op == "PRelu":
        return rank_a - 2 if rank_b == 1 and rank_a >= 2 else 0
    if not ctx.attr("broadcast", 0) or not ctx.has_attr("axis"):
        return 0
    axis = int(ctx.attr("axis"))
    axis = axis + rank_a if axis < 0 else axis
    if not 0 <= axis <= rank_a - rank_b:
        ctx.fail(f"legacy broadcast axis {axis} does not fit B of rank {rank_b} into A of rank {rank_a}")
    return rank_a - axis - rank_b


def _int_div_check(c, a, b, op: str):
    """Integer division (Div, Mod) by zero, and Div's MIN / -1 (whose quotient does not fit),
    are errors, as ONNX Runtime raises them."""
    if a.dtype.kind not in "iu":
        return
    if np.any(b == 0):
        c.fail(f"integer {op} by zero")
    if op == "division" and a.dtype.kind == "i":
        bad = (b == -1) & (a == np.iinfo(a.dtype).min)
        if np.any(bad):
            c.fail(f"integer division overflows: {np.iinfo(a.dtype).min} / -1 does not fit {a.dtype}")


def _div(a, b):
    """Integer division truncates toward zero (C semantics), unlike numpy's floor."""
    if a.dtype.kind == "i":
        q = np.floor_divide(a, b)
        return q + ((np.remainder(a, b) != 0) & ((a < 0) != (b < 0))).astype(q.dtype)
    if a.dtype.kind == "u":
        return np.floor_divide(a, b)
    return np.true_divide(a, b)


def _pow(a, b):
    """Output keeps the base dtype; integer bases with negative or float exponents go through float64."""
    if a.dtype.kind in "iu" and (b.dtype.kind not in "iu" or np.any(b < 0)):
        return np.trunc(np.power(a.astype(np.float64), b.astype(np.float64)))
    if a.dtype.kind in "iu":
        wide = np.int64 if a.dtype.kind == "i" else np.uint64
        return np.power(a.astype(wide), b.astype(wide))
    return np.power(a, b.astype(a.dtype) if b.dtype.kind in "iu" else b)


def _bitshift(a, b, direction):
    """Shifts by a negative amount or by >= the bit width give the sign fill (0, or -1 right-shifting negatives)."""
    ok = (b >= 0) & (b < a.dtype.itemsize * 8)
    amount = np.where(ok, b, 0).astype(a.dtype)
    if direction == "LEFT":
        return np.where(ok, np.left_shift(a, amount), 0)
    fill = np.where(a < 0, -1, 0) if a.dtype.kind == "i" else 0
    return np.where(ok, np.right_shift(a, amount), fill)


def _div_e(c, a, b):
    """Integer division truncates toward zero. x / 0 and MIN / -1 fail the kernel (a KilnError
    naming the node, as ONNX Runtime raises) and never reach a C division (which would trap)."""
    if a.dtype.is_float:
        return a / b
    zero = L.const(0, a.dtype)
    if not a.dtype.is_signed:
        q = L.truncdiv(a, L.select(b.eq(0), L.const(1, b.dtype), b))
        return _nonzero_check(c, a, b, L.select(b.eq(0), zero, q), "division")
    q = L.truncdiv(a, L.select(b.eq(0) | b.eq(-1), L.const(1, b.dtype), b))
    q = L.select(b.eq(0), zero, L.select(b.eq(-1), zero - a, q))
    low = L.const(int(ml_dtypes.iinfo(a.dtype.np).min), a.dtype)   # (int4/int2 too)
    q = c.check(q, b.ne(-1) | a.ne(low), L.cast(L.INDEX, a),
                f"integer division overflows: {{value}} / -1 does not fit {a.dtype}")
    return _nonzero_check(c, a, b, q, "division")


def _nonzero_check(c, a, b, q, op: str):
    sym = "/" if op == "division" else "%"
    return c.check(q, b.ne(0), L.cast(L.INDEX, a), f"integer {op} by zero ({{value}} {sym} 0)")


def _mod_e(c, a, b):
    """fmod=1: C's fmod / remainder (sign of the dividend). fmod=0: the sign of the divisor,
    floats as numpy's divmod (a zero result takes the divisor's sign). Integer x % 0 fails the
    kernel, as ONNX Runtime raises; MIN % -1 is 0 (never a C remainder, which would trap)."""
    if a.dtype.is_float:
        r = L.fmod(a, b)
        if c.attr("fmod", 0):
            return r
        r = _let(r)
        return L.select(r.ne(0), L.select((r < 0).ne(b < 0), r + b, r),
                        L.select(b < 0, L.const(-0.0, a.dtype), L.const(0.0, a.dtype)))
    bad = b.eq(0) | b.eq(-1) if a.dtype.is_signed else b.eq(0)  # x % -1 is 0; MIN % -1 traps in C
    safe = L.select(bad, L.const(1, b.dtype), b)
    r = L.select(bad, L.const(0, a.dtype), L.truncmod(a, safe) if c.attr("fmod", 0) else a % safe)
    return _nonzero_check(c, a, b, r, "modulo")


def _ipow(a, b, bits: int):
    """a**b for 0 <= b < 2**bits by binary powering, wrapping like numpy's integer power."""
    one = L.const(1, a.dtype)
    r, p = one, a
    for k in range(bits):
        r = r * L.select(((b >> k) & 1).ne(0), p, one)
        p = p * p if k + 1 < bits else p
    return r


def _pow_e(c, a, b):
    """The base's dtype out. Floats compute in the wider float of the two; integer bases are
    exact for integer exponents in [0, 64) (binary powering in 64 bits, then wrapped) and go
    through float64 otherwise, as the reference does for negative/float exponents."""
    if a.dtype.is_float:
        w = b.dtype if b.dtype.is_float and b.dtype.itemsize > a.dtype.itemsize else a.dtype
        k = c.value(1)
        if w == a.dtype and k is not None and k.size == 1 and float(k.reshape(())) in (2.0, 3.0, 4.0):
            # a known small integer exponent: multiplications (vector powf is slow, and glibc's
            # falls back to scalar code for negative bases)
            sq = a * a
            return {2.0: sq, 3.0: sq * a, 4.0: sq * sq}[float(k.reshape(()))]
        return L.pow_(L.cast(w, a), L.cast(w, b))
    f64, i64 = DType.float64, DType.int64
    via_float = L.cast(a.dtype, L.pow_(L.cast(f64, a), L.cast(f64, b)))
    if b.dtype.is_float:
        return via_float
    e = L.cast(i64, b)
    exact = L.cast(a.dtype, _ipow(L.cast(i64 if a.dtype.is_signed else DType.uint64, a), e, 6))
    # exponents >= 64: even bases wrap to 0; +-1 (and 0) are exact through float64
    big = L.select((a & 1).eq(0), L.const(0, a.dtype), via_float)
    return L.select((e >= 0) & (e < 64), exact, L.select(e < 0, via_float, big))


def _shift_e(c, a, b):
    ok = (b >= 0) & (b < a.dtype.itemsize * 8)
    amount = L.select(ok, b, L.const(0, b.dtype))
    if _str_attr(c, "direction") == "LEFT":
        return L.select(ok, a << amount, L.const(0, a.dtype))
    fill = L.select(a < 0, L.const(-1, a.dtype), L.const(0, a.dtype)) if a.dtype.is_signed \
        else L.const(0, a.dtype)
    return L.select(ok, a >> amount, fill)


# name -> (reference fn(ctx, a, b), lowering fn(ctx, a: Expr, b: Expr), operand kind,
#          output dtype: "same" as both, "bool", or "base" (Pow's mixed types))
_BINARY = {
    "Add": (lambda c, a, b: np.add(a, b), lambda c, a, b: a + b, "num", "same"),
    "Sub": (lambda c, a, b: np.subtract(a, b), lambda c, a, b: a - b, "num", "same"),
    "Mul": (lambda c, a, b: np.multiply(a, b), lambda c, a, b: a * b, "num", "same"),
    "Div": (lambda c, a, b: (_int_div_check(c, a, b, "division"), _div(a, b))[1], _div_e, "num", "same"),
    "Pow": (lambda c, a, b: _pow(a, b), _pow_e, "num", "base"),
    "Mod": (lambda c, a, b: (_int_div_check(c, a, b, "modulo"),
                             (np.fmod if c.attr("fmod", 0) else np.mod)(a, b))[1], _mod_e, "num", "same"),
    "PRelu": (lambda c, a, b: np.where(a < 0, a * b, a), lambda c, a, b: L.select(a < 0, a * b, a),
              "num", "same"),
    "BitShift": (lambda c, a, b: _bitshift(a, b, _str_attr(c, "direction")), _shift_e, "int", "same"),
    "BitwiseAnd": (lambda c, a, b: np.bitwise_and(a, b), lambda c, a, b: a & b, "int", "same"),
    "BitwiseOr": (lambda c, a, b: np.bitwise_or(a, b), lambda c, a, b: a | b, "int", "same"),
    "BitwiseXor": (lambda c, a, b: np.bitwise_xor(a, b), lambda c, a, b: a ^ b, "int", "same"),
    "And": (lambda c, a, b: np.logical_and(a, b), lambda c, a, b: a & b, "bool", "bool"),
    "Or": (lambda c, a, b: np.logical_or(a, b), lambda c, a, b: a | b, "bool", "bool"),
    "Xor": (lambda c, a, b: np.logical_xor(a, b), lambda c, a, b: a ^ b, "bool", "bool"),
    "Equal": (lambda c, a, b: np.equal(a, b), lambda c, a, b: a.eq(b), "any", "bool"),
    "Less": (lambda c, a, b: np.less(a, b), lambda c, a, b: a < b, "num", "bool"),
    "LessOrEqual": (lambda c, a, b: np.less_equal(a, b), lambda c, a, b: a <= b, "num", "bool"),
    "Greater": (lambda c, a, b: np.greater(a, b), lambda c, a, b: a > b, "num", "bool"),
    "GreaterOrEqual": (lambda c, a, b: np.greater_equal(a, b), lambda c, a, b: a >= b, "num", "bool"),
}


def _register_binary(name, fn, lower_fn, kind, out):
    def infer(ctx):
        _check_kind(ctx, kind, (0, 1))
        dt = ctx.dtype(0) if out == "base" else _check_same_dtype(ctx, (0, 1))
        sa, sb = ctx.shape(0), ctx.shape(1)
        if sa is not None and sb is not None:
            sb = tuple(sb) + (1,) * _b_pad(ctx, len(sa), len(sb))
        return [TensorType(DType.bool if out == "bool" else dt, broadcast_shapes(ctx, sa, sb))]

    def run(ctx, a, b):
        b = b.reshape(b.shape + (1,) * _b_pad(ctx, a.ndim, b.ndim))
        with np.errstate(all="ignore"):
            y = fn(ctx, _up(a), _up(b))
        return _as(y, np.bool_ if out == "bool" else a.dtype)

    _reg(name, infer, run)

    @_lowers(name)
    def lower(ctx, a, b):
        pads = [0, _b_pad(ctx, len(a.shape), len(b.shape))]
        return _map(ctx, lambda x, y: lower_fn(ctx, x, y), [a, b], pads)


for _name, _spec in _BINARY.items():
    _register_binary(_name, *_spec)


def _swiglu_infer(ctx):
    _check_kind(ctx, "float", (0, 1))
    _check_same_dtype(ctx, (0, 1))
    sa, sb = ctx.shape(0), ctx.shape(1)
    if sa is not None and sb is not None and (
            len(sa) != len(sb) or any(isinstance(p, int) and isinstance(q, int) and p != q
                                      for p, q in zip(sa, sb))):
        ctx.fail(f"inputs A and B must have identical shapes (no broadcasting), got {sa} and {sb}")
    return [ctx.tensor(0) if sa is not None else ctx.tensor(1)]


def _swiglu(ctx, a, b):
    alpha = float(ctx.attr("alpha", 1.0))
    x, y = _up(a), _up(b)
    with np.errstate(all="ignore"):
        return _as(x * _sigmoid(alpha * x) * y, a.dtype)


_reg("SwiGLU", _swiglu_infer, _swiglu)


@_lowers("SwiGLU")
def _swiglu_lower(ctx, a, b):
    alpha = float(ctx.attr("alpha", 1.0))
    return _map(ctx, lambda x, y: x * _sigmoid_e(alpha * x) * y, [a, b])


# ---------------------------------------------------------------- variadic and ternary


def _variadic_infer(ctx):
    idx = [i for i in range(ctx.num_inputs) if ctx.has_input(i)]
    if not idx:
        ctx.fail("needs at least one input")
    dt = _check_same_dtype(ctx, idx)
    return [TensorType(dt, broadcast_shapes(ctx, *(ctx.shape(i) for i in idx)))]


def _variadic(fn, mean=False):
    def run(ctx, *xs):
        present = [x for x in xs if x is not None]
        with np.errstate(all="ignore"):
            y = functools.reduce(fn, [_up(x) for x in present])
            if mean:
                y = y / np.asarray(len(present), dtype=y.dtype)
        return _as(y, present[0].dtype)
    return run


_reg("Max", _variadic_infer, _variadic(np.maximum))
_reg("Min", _variadic_infer, _variadic(np.minimum))
_reg("Sum", _variadic_infer, _variadic(np.add))
_reg("Mean", _variadic_infer, _variadic(np.add, mean=True))


def _variadic_lower(combine, mean=False):
    """Left fold in the widened dtype (one rounding at the end, as the reference); integer
    Mean divides in float64 and truncates, as numpy's true division then cast."""
    def lower(ctx, *xs):
        present = [x for x in xs if x is not None]

        def fn(*vs):
            y = functools.reduce(combine, vs)
            if mean:
                y = (y if y.dtype.is_float else L.cast(DType.float64, y)) / len(vs)
            return y
        return _map(ctx, fn, present)
    return lower


_lowers("Max")(_variadic_lower(L.max_))
_lowers("Min")(_variadic_lower(L.min_))
_lowers("Sum")(_variadic_lower(lambda a, b: a + b))
_lowers("Mean")(_variadic_lower(lambda a, b: a + b, mean=True))


def _where_infer(ctx):
    if ctx.dtype(0) is not DType.bool:
        ctx.fail(f"condition must be bool, got {ctx.dtype(0)}")
    dt = _check_same_dtype(ctx, (1, 2))
    return [TensorType(dt, broadcast_shapes(ctx, ctx.shape(0), ctx.shape(1), ctx.shape(2)))]


_reg("Where", _where_infer, lambda ctx, c, x, y: _as(np.where(c, x, y), x.dtype))
_lowers("Where")(lambda ctx, c, x, y: _map(ctx, L.select, [c, x, y]))


def _clip_bounds(ctx, lo, hi):
    """Clip-6 takes min/max attributes; Clip-11+ optional scalar inputs."""
    if ctx.opset < 11:
        return ctx.attr("min", -np.inf), ctx.attr("max", np.inf)
    for name, v in (("min", lo), ("max", hi)):
        if v is not None and v.size != 1:
            ctx.fail(f"input {name} must be a scalar, got shape {v.shape}")
    return (None if lo is None else lo.reshape(())), (None if hi is None else hi.reshape(()))


def _clip_infer(ctx):
    _check_same_dtype(ctx, (0, 1, 2) if ctx.opset >= 11 else (0,))
    return [ctx.tensor(0)]


def _clip(ctx, x, lo=None, hi=None):
    lo, hi = _clip_bounds(ctx, lo, hi)
    y = _up(x)
    if lo is not None:
        y = np.maximum(y, np.asarray(lo).astype(y.dtype))
    if hi is not None:
        y = np.minimum(y, np.asarray(hi).astype(y.dtype))
    return _as(y, x.dtype)


_reg("Clip", _clip_infer, _clip)


@_lowers("Clip")
def _clip_lower(ctx, x, lo=None, hi=None):
    """max then min, NaN-propagating; bounds are attributes (Clip-6) or size-1 tensors."""
    def bound(y, t, attr, default):
        if ctx.opset < 11:
            v = float(ctx.attr(attr, default))
            return None if v == default else L.const(v, y.dtype)
        if t is None:
            return None
        if math.prod(t.shape) != 1:
            ctx.fail(f"input {attr} must be a scalar, got shape {tuple(t.shape)}")
        return L.cast(y.dtype, t[(0,) * len(t.shape)])

    def fn(*i):
        y = _up_e(x[i])
        for t, attr, default, comb in ((lo, "min", -math.inf, L.max_), (hi, "max", math.inf, L.min_)):
            b = bound(y, t, attr, default)
            y = y if b is None else comb(y, b)
        return L.cast(x.dtype, y)
    return L.compute(x.shape, fn, "y0")


# ---------------------------------------------------------------- casts

_F8 = {DType.float8e4m3fn, DType.float8e4m3fnuz, DType.float8e5m2, DType.float8e5m2fnuz}
_BITS = {DType.int4: 4, DType.uint4: 4, DType.float4e2m1: 4, DType.int2: 2, DType.uint2: 2,
         DType.bool: 8}


def _parse_number(s) -> float | int:
    s = (s.decode() if isinstance(s, bytes) else str(s)).strip()
    try:
        return int(s)
    except ValueError:
        return float(s)  # accepts 1e-5, INF, +INF, -inf, NaN in any case


def _from_string(ctx, x: np.ndarray, to: DType) -> np.ndarray:
    try:
        vals = [_parse_number(s) for s in x.ravel()]
    except ValueError as e:
        ctx.fail(f"cannot cast string to {to}: {e}")
    if to.is_int:
        ints = [v if isinstance(v, int) else int(v) for v in vals]
        wide = np.uint64 if any(v > np.iinfo(np.int64).max for v in ints) else np.int64
        arr = np.array(ints, dtype=wide)
    else:
        arr = np.array(vals, dtype=np.float64)
    return arr.reshape(x.shape).astype(to.np)


def _to_string(x: np.ndarray) -> np.ndarray:
    """Print numbers as ONNX Runtime does: integers in full, bools as 1/0, floats with 8
    significant digits and NaN / INF / -INF."""
    if not _is_float(x.dtype):
        return x.astype(np.uint8 if x.dtype == np.bool_ else x.dtype).astype(np.str_).astype(object)
    f = x.astype(np.float64)
    s = np.char.mod("%.8g", f)
    s = np.where(np.isnan(f), "NaN", np.where(np.isinf(f), np.where(f > 0, "INF", "-INF"), s))
    return s.astype(object)


def _to_e8m0(x: np.ndarray, saturate: bool, round_mode: str) -> np.ndarray:
    """float -> E8M0 (a bare power-of-two exponent) from float32 bits: keep the exponent, round by mantissa."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    exp = ((bits >> 23) & 0xFF).astype(np.int32)
    mant = bits & 0x7FFFFF
    special = exp == 0xFF
    if round_mode == "up":
        exp = exp + (mant > 0)
    elif round_mode == "nearest":
        guard, rest = (mant >> 22) & 1, mant & 0x3FFFFF
        exp = exp + ((guard == 1) & ((rest > 0) | (exp > 0)))
    exp = np.minimum(exp, 0xFE) if saturate else exp
    exp = np.where(special | (exp > 0xFE), 0xFF, exp)
    return exp.astype(np.uint8).view(ml_dtypes.float8_e8m0fnu)


def _cast(ctx, x: np.ndarray, to: DType) -> np.ndarray:
    """ONNX Cast: saturating float8 by default, E8M0 rounding modes, string parsing/printing."""
    saturate = bool(ctx.attr("saturate", 1))
    src = DType.from_numpy(x.dtype)
    if src is to:
        return x
    if to is DType.string:
        return _to_string(x)
    if src is DType.string:
        return _from_string(ctx, x, to)
    with np.errstate(all="ignore"):
        if src.np in _ML_FLOATS:
            x = x.astype(np.float32)  # exact; ml_dtypes lacks some direct conversions (e.g. to bool)
        if to is DType.float8e8m0:
            return _to_e8m0(x, saturate, _str_attr(ctx, "round_mode", "up"))
        if to in _F8 and saturate and src is not DType.bool:
            info = ml_dtypes.finfo(to.np)
            x = np.clip(x, float(info.min), float(info.max))
        return x.astype(to.np)


def _to_attr(ctx) -> DType:
    to = ctx.attr("to")
    if isinstance(to, DType):
        return to
    try:  # Cast-1 spelled `to` as a string ("FLOAT", "DOUBLE", "INT64")
        if isinstance(to, str):
            return DType.from_name({"float": "float32", "double": "float64"}.get(to.lower(), to.lower()))
        return DType.from_onnx(int(to))
    except KilnError:
        ctx.fail(f"attribute to={to!r} is not a supported element type")


def _cast_infer(ctx, to: DType):
    t = ctx.tensor(0)
    return [TensorType(to, t.shape)]


_reg("Cast", lambda ctx: _cast_infer(ctx, _to_attr(ctx)),
     lambda ctx, x: _cast(ctx, x, _to_attr(ctx)))
_reg("CastLike", lambda ctx: _cast_infer(ctx, ctx.dtype(1)),
     lambda ctx, x, like: _cast(ctx, x, DType.from_numpy(like.dtype)))
# C conversions are numpy's: float -> int truncates, float -> bool is x != 0 (NaN is true);
# float16 goes through float32 (exact). Conversions to bfloat16/float8/float4/int4/int2 are
# ml_dtypes' (kiln.codegen.narrow); a cast Expr's `arg` names the C backend's conversion
# mode where Cast's attributes differ from that: "sat" (float8, saturate=1: +-max instead of
# Inf/NaN, as the reference's clip) and float8e8m0's round_mode, "_sat" appended if saturate.


def _cast_mode(ctx, src: DType, to: DType) -> str | None:
    saturate = bool(ctx.attr("saturate", 1))
    if to is DType.float8e8m0:
        return _str_attr(ctx, "round_mode", "up") + ("_sat" if saturate else "")
    return "sat" if to in _F8 and saturate and src is not DType.bool else None


@_lowers("Cast", "CastLike")
def _cast_lower(ctx, x, like=None):
    to = ctx.out_dtype()
    mode = None if x.dtype is to else _cast_mode(ctx, x.dtype, to)
    return _map(ctx, (lambda v: v) if mode is None else (lambda v: L.Expr("cast", to, (v,), mode)), [x])


def _bit_width(dt: DType) -> int:
    return _BITS.get(dt, dt.itemsize * 8)


def _bitcast_infer(ctx):
    src, to = ctx.dtype(0), _to_attr(ctx)
    if DType.string in (src, to) or _bit_width(src) != _bit_width(to):
        ctx.fail(f"BitCast needs non-string types of equal bit width, got {src} "
                 f"({_bit_width(src)} bits) to {to} ({_bit_width(to)} bits)")
    return [TensorType(to, ctx.shape(0))]


def _bitcast(ctx, x):
    to = _to_attr(ctx)
    if _bit_width(to) < 8:  # sub-byte values sit in the low bits of one byte each
        return (np.ascontiguousarray(x).view(np.uint8) & ((1 << _bit_width(to)) - 1)).view(to.np)
    return np.ascontiguousarray(x).view(to.np).reshape(x.shape)


_reg("BitCast", _bitcast_infer, _bitcast)


@_lowers("BitCast")
def _bitcast_lower(ctx, x):
    """A byte copy: reinterpreting bits is no arithmetic a compute can express."""
    n = math.prod(x.shape) * x.dtype.itemsize
    return ctx.extern(f"memcpy(out0, in0, {n}ULL);\n  return 0;", [x], [(ctx.out_shape(), ctx.out_dtype())])


# ---------------------------------------------------------------- dropout


def _dropout_infer(ctx):
    x = ctx.tensor(0)
    if ctx.opset >= 12 and ctx.has_input(1) and not ctx.dtype(1).is_float:
        ctx.fail(f"ratio must be a float scalar, got {ctx.dtype(1)}")
    mask_dt = DType.bool if ctx.opset >= 10 else x.dtype
    return [x, TensorType(mask_dt, x.shape)][:max(1, ctx.num_outputs)]


def _dropout(ctx, x, ratio=None, training=None):
    """Identity at inference; Dropout-12 in training mode drops with a (seedable) uniform mask.

    Older forms (is_test / ratio attributes) are always run as inference, as runtimes do.
    """
    mask_dt = np.bool_ if ctx.opset >= 10 else x.dtype
    r = 0.5 if ratio is None else float(np.asarray(ratio))
    train = ctx.opset >= 12 and training is not None and bool(np.asarray(training))
    if not train or r == 0:
        return x, np.ones(x.shape, dtype=mask_dt)
    if not 0 <= r < 1:
        ctx.fail(f"ratio must be in [0, 1), got {r}")
    seed = ctx.attr("seed", None)
    rng = np.random.RandomState(None if seed is None else int(seed) % 2 ** 32)
    mask = rng.uniform(0.0, 1.0, x.shape) >= r
    y = _up(x) * mask * np.asarray(1.0 / (1.0 - r), dtype=_up(x).dtype)
    return _as(y, x.dtype), mask.astype(mask_dt)


_reg("Dropout", _dropout_infer, _dropout)


@_lowers("Dropout")
def _dropout_lower(ctx, x, ratio=None, training=None):
    """Inference (training_mode absent or known false, or ratio known 0): a copy and a mask of
    ones. Otherwise a C kernel that reads training_mode (and ratio) at run time and, when
    training, draws the mask from the reference's generator (kiln.ops.random.mt19937_init):
    a seeded node gives exactly the reference's mask. Ratio outside [0, 1) fails (status 1)."""
    r = 0.5 if not ctx.has_input(1) else ctx.value(1)
    if ctx.opset >= 12 and ctx.has_input(2):
        t = ctx.value(2)
        if t is None or (bool(np.asarray(t)) and (r is None or float(np.asarray(r)) != 0)):
            return _dropout_training(ctx, x, ratio, training)
    outs = [_map(ctx, lambda v: v, [x])]
    if ctx.num_outputs > 1:
        outs.append(L.compute(ctx.out_shape(1), lambda *i: L.const(1, ctx.out_dtype(1)), "mask"))
    return outs


def _dropout_training(ctx, x, ratio, training):
    from kiln.lower.random import mt19937_init
    for k, what in ((0, "data"), (1, "ratio")):
        if ctx.has_input(k) and ctx.input_types[k].dtype.c is None:
            ctx.fail(f"{what} of type {ctx.input_types[k].dtype} has no C type for the training-mode "
                     "kernel", stage="lower")
    n, t = math.prod(x.shape), x.dtype.c
    wide = "double" if x.dtype == DType.float64 else "float"  # as the reference computes
    # the present inputs are in0 (data), in1 (ratio, if given), then training_mode
    r, train = ("(double)in1[0]", "in2") if ctx.has_input(1) else ("0.5", "in1")
    mask = "  out1[i] = keep;\n" if ctx.num_outputs > 1 else ""
    ones = "  for (int64_t i = 0; i < N; ++i) out1[i] = 1;\n".replace("N", str(n)) if mask else ""
    body = f"""  const double r = {r};
  if (!{train}[0] || r == 0) {{
    memcpy(out0, in0, {n} * sizeof({t}));
{ones}    return 0;
  }}
  if (!(r >= 0 && r < 1)) return 1;
  const {wide} scale = ({wide})(1.0 / (1.0 - r));
{mt19937_init(ctx.attr("seed", None))}  for (int64_t i = 0; i < {n}; ++i) {{
    double u;
    KILN_MT_DRAW(u);
    const bool keep = u >= r;
    out0[i] = ({t})(keep ? ({wide})in0[i] * scale : ({wide})0);
  {mask}  }}
  return 0;
#undef KILN_MT_NEXT
#undef KILN_MT_DRAW"""
    outs = [(ctx.out_shape(0), ctx.out_dtype(0))]
    if ctx.num_outputs > 1:  # opset >= 12: a bool mask
        outs.append((tuple(x.shape), DType.bool))
    return ctx.extern(body, [x, ratio, training], outs)
