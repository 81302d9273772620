"""Elementwise operators: unary math and activations, broadcasting binary
arithmetic/comparison/logic, variadic Max/Min/Sum/Mean, Where, Clip, casts,
Dropout and Identity.

Most ops are registered from tables whose rows hold the NumPy reference, the
attributes with their defaults and the operand kind; kiln.lower.elementwise holds
the matching native lowerings (loop-expression builders). Float16/bfloat16 math is
computed in float32 and rounded back; every result is cast to the exact dtype
`infer` gave.
"""

from __future__ import annotations

import functools
import math

import ml_dtypes
import numpy as np

from kiln.dtypes import DType
from kiln.errors import KilnError
from kiln.graph.types import TensorType
from kiln.ops.registry import BROADCAST, ELEMWISE, INJECTIVE, OPAQUE, register, same_as
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


def _reg(name, infer, run, fusion):
    """Register with the family's attribute checks run before `infer` (compile-time values are
    propagated by the generic inference, which runs `run` on small known inputs)."""
    def checked_infer(ctx):
        _check_choices(ctx)
        return infer(ctx)
    register(name, infer=checked_infer, run=run, fusion=fusion)


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



# name -> (reference fn(x, **attrs), {attr: default}, input kind); the lowerings are kiln.lower.elementwise's
_UNARY = {
    "Abs": (np.abs, {}, "num"),
    "Neg": (np.negative, {}, "num"),
    "Sign": (np.sign, {}, "num"),
    "Relu": (lambda x: np.maximum(x, 0), {}, "num"),
    "Ceil": (np.ceil, {}, "float"),
    "Floor": (np.floor, {}, "float"),
    "Round": (np.round, {}, "float"),
    "Exp": (np.exp, {}, "float"),
    "Log": (np.log, {}, "float"),
    "Sqrt": (np.sqrt, {}, "float"),
    "Reciprocal": (np.reciprocal, {}, "float"),
    "Sin": (np.sin, {}, "float"),
    "Cos": (np.cos, {}, "float"),
    "Tan": (np.tan, {}, "float"),
    "Asin": (np.arcsin, {}, "float"),
    "Acos": (np.arccos, {}, "float"),
    "Atan": (np.arctan, {}, "float"),
    "Sinh": (np.sinh, {}, "float"),
    "Cosh": (np.cosh, {}, "float"),
    "Asinh": (np.arcsinh, {}, "float"),
    "Acosh": (np.arccosh, {}, "float"),
    "Atanh": (np.arctanh, {}, "float"),
    "Tanh": (np.tanh, {}, "float"),
    "Erf": (_erf, {}, "float"),
    "Sigmoid": (_sigmoid, {}, "float"),
    "Softsign": (lambda x: x / (1 + np.abs(x)), {}, "float"),
    "Softplus": (lambda x: np.logaddexp(0, x), {}, "float"),
    "Mish": (lambda x: x * np.tanh(np.logaddexp(0, x)), {}, "float"),
    "HardSwish": (lambda x: x * np.clip(x / 6 + 0.5, 0, 1), {}, "float"),
    "Elu": (lambda x, alpha: np.where(x > 0, x, alpha * np.expm1(x)), {"alpha": 1.0}, "float"),
    # max(x, 0) + min(0, a*expm1(x/a)) is x for x > 0 and the second term otherwise, for any a != 0
    "Celu": (lambda x, alpha: np.maximum(x, 0) + np.minimum(0, alpha * np.expm1(x / alpha)), {"alpha": 1.0},
             "float"),
    "Selu": (lambda x, alpha, gamma: gamma * np.where(x > 0, x, alpha * np.expm1(x)),
             {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875}, "float"),
    "LeakyRelu": (lambda x, alpha: np.where(x >= 0, x, alpha * x), {"alpha": 0.01}, "float"),
    "ThresholdedRelu": (lambda x, alpha: np.where(x > alpha, x, 0), {"alpha": 1.0}, "float"),
    "HardSigmoid": (lambda x, alpha, beta: np.clip(alpha * x + beta, 0, 1), {"alpha": 0.2, "beta": 0.5},
                    "float"),
    "Swish": (lambda x, alpha: x * _sigmoid(alpha * x), {"alpha": 1.0}, "float"),
    "Gelu": (_gelu, {"approximate": "none"}, "float"),
    "Shrink": (_shrink, {"bias": 0.0, "lambd": 0.5}, "num"),
}


def _attrs(ctx, defaults: dict) -> dict:
    return {k: _str_attr(ctx, k, d) if isinstance(d, str) else type(d)(ctx.attr(k, d))
            for k, d in defaults.items()}


def _register_unary(name, fn, defaults, kind):
    def infer(ctx):
        _check_kind(ctx, kind)
        return [ctx.tensor(0)]

    def run(ctx, x):
        kw = _attrs(ctx, defaults)
        with np.errstate(all="ignore"):
            return _as(fn(_up(x), **kw), x.dtype)

    _reg(name, infer, run, ELEMWISE)


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


_reg("IsNaN", _predicate_infer, lambda ctx, x: _as(np.isnan(_up(x)), np.bool_), ELEMWISE)
_reg("IsInf", _predicate_infer, _is_inf, ELEMWISE)
_reg("Not", _kind_same_as("bool"), lambda ctx, x: _as(np.logical_not(x), np.bool_), ELEMWISE)
_reg("BitwiseNot", _kind_same_as("int"), lambda ctx, x: _as(np.invert(x), x.dtype), ELEMWISE)
_reg("Identity", same_as(0), lambda ctx, x: x, INJECTIVE)  # tensors, sequences (lists), optionals (None)


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



# name -> (reference fn(ctx, a, b), operand kind,
#          output dtype: "same" as both, "bool", or "base" (Pow's mixed types))
_BINARY = {
    "Add": (lambda c, a, b: np.add(a, b), "num", "same"),
    "Sub": (lambda c, a, b: np.subtract(a, b), "num", "same"),
    "Mul": (lambda c, a, b: np.multiply(a, b), "num", "same"),
    "Div": (lambda c, a, b: (_int_div_check(c, a, b, "division"), _div(a, b))[1], "num", "same"),
    "Pow": (lambda c, a, b: _pow(a, b), "num", "base"),
    "Mod": (lambda c, a, b: (_int_div_check(c, a, b, "modulo"),
                             (np.fmod if c.attr("fmod", 0) else np.mod)(a, b))[1], "num", "same"),
    "PRelu": (lambda c, a, b: np.where(a < 0, a * b, a), "num", "same"),
    "BitShift": (lambda c, a, b: _bitshift(a, b, _str_attr(c, "direction")), "int", "same"),
    "BitwiseAnd": (lambda c, a, b: np.bitwise_and(a, b), "int", "same"),
    "BitwiseOr": (lambda c, a, b: np.bitwise_or(a, b), "int", "same"),
    "BitwiseXor": (lambda c, a, b: np.bitwise_xor(a, b), "int", "same"),
    "And": (lambda c, a, b: np.logical_and(a, b), "bool", "bool"),
    "Or": (lambda c, a, b: np.logical_or(a, b), "bool", "bool"),
    "Xor": (lambda c, a, b: np.logical_xor(a, b), "bool", "bool"),
    "Equal": (lambda c, a, b: np.equal(a, b), "any", "bool"),
    "Less": (lambda c, a, b: np.less(a, b), "num", "bool"),
    "LessOrEqual": (lambda c, a, b: np.less_equal(a, b), "num", "bool"),
    "Greater": (lambda c, a, b: np.greater(a, b), "num", "bool"),
    "GreaterOrEqual": (lambda c, a, b: np.greater_equal(a, b), "num", "bool"),
}


def _register_binary(name, fn, kind, out):
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

    _reg(name, infer, run, BROADCAST)


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


_reg("SwiGLU", _swiglu_infer, _swiglu, OPAQUE)

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


_reg("Max", _variadic_infer, _variadic(np.maximum), BROADCAST)
_reg("Min", _variadic_infer, _variadic(np.minimum), BROADCAST)
_reg("Sum", _variadic_infer, _variadic(np.add), BROADCAST)
_reg("Mean", _variadic_infer, _variadic(np.add, mean=True), BROADCAST)

def _where_infer(ctx):
    if ctx.dtype(0) is not DType.bool:
        ctx.fail(f"condition must be bool, got {ctx.dtype(0)}")
    dt = _check_same_dtype(ctx, (1, 2))
    return [TensorType(dt, broadcast_shapes(ctx, ctx.shape(0), ctx.shape(1), ctx.shape(2)))]


_reg("Where", _where_infer, lambda ctx, c, x, y: _as(np.where(c, x, y), x.dtype), BROADCAST)


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


_reg("Clip", _clip_infer, _clip, BROADCAST)

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
     lambda ctx, x: _cast(ctx, x, _to_attr(ctx)), ELEMWISE)
_reg("CastLike", lambda ctx: _cast_infer(ctx, ctx.dtype(1)),
     lambda ctx, x, like: _cast(ctx, x, DType.from_numpy(like.dtype)), BROADCAST)

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


_reg("BitCast", _bitcast_infer, _bitcast, OPAQUE)

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


_reg("Dropout", _dropout_infer, _dropout, OPAQUE)
