"""Elementwise lowerings (cpu target): the loop-expression forms of kiln.ops.elementwise's
unary, binary, variadic, Where, Clip, cast, BitCast and Dropout ops, and the injective schedule
they share. `L.` names are loop expressions; math on float16/bfloat16/float8 runs in float32
(`_wide`) and every result is cast to the dtype inference gave.
"""

from __future__ import annotations

import functools
import math

import ml_dtypes
import numpy as np

import kiln.loops as L
from kiln.codegen.csource import c_instance, c_source
from kiln.dtypes import DType
from kiln.loops.expr import walk
from kiln.loops.symbols import extent, static
from kiln.lower.schedules import symbolic_rows
from kiln.lower.decisions import parallel_min_work
from kiln.lower.nnutil import parallel_worth
from kiln.ops.elementwise import _BINARY, _F8, _UNARY, _attrs, _b_pad, _str_attr
from kiln.lower.context import lowering


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


def _injective_schedule(sch, outputs, target) -> None:
    """Outer loops fused and parallel, the innermost one vectorized and never fused: fusing it
    (as default_schedule does) leaves div/mod index math in the hot loop that the simplifier
    cannot fold back. The inner loop is split when the outer part is too short to give threads
    work, or to buffer `_let` stages a row (chunk) at a time inside the output's loop: a scalar
    loop of libm calls into a stack buffer, then a vector loop. Vectors are `target`'s."""
    lets = [st for st in sch.stages if st.tensor not in sch.outputs]
    rows = {}
    symbolic = any(not static(v.arg.dom[1]) for st in sch.stages for v in st.axis)
    for st in sch.stages:
        ext = [extent(v) for v in st.axis]
        if st in lets or not ext or 0 in ext:
            continue
        if symbolic:   # kiln.loops.symbols: rows of a run-time length, no splits
            symbolic_rows(st, math.prod(ext) >= parallel_min_work())
            continue
        axes = list(st.axis)
        lanes = max(target.vector_lanes(st.tensor.dtype.itemsize), 1)
        parallel = parallel_worth(math.prod(ext), target, "copy")   # past the floor, and worth the fork
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
        if symbolic:   # a row buffer of symbolic length would be a heap allocation per row
            st.compute_inline()
        elif len(users) == 1 and users[0] in rows:
            st.compute_at(users[0], rows[users[0]])
            if extent(st.axis[-1]) > 1:
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
    ctx.schedule(lambda sch, outputs: _injective_schedule(sch, outputs, ctx.target))


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


# Loop-expression forms of the same formulas. x is already widened (float16 -> float32).

def _sigmoid_e(x):
    """float32: the `sigmoid` intrinsic (the C backend's inline kiln_sigmoid_f32, 1.4x faster than
    a vector expf call); else the reference's overflow-free form, one exp: (x >= 0 ? 1 : e) /
    (1 + e), e = exp(-|x|)."""
    if x.dtype is DType.float32:
        return L.sigmoid(x)
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


# name -> lowering fn(x: Expr, **attrs); the attributes and their defaults are kiln.ops.elementwise._UNARY's
# (Round: half to even, as ONNX specifies: C's rint)
_UNARY_LOWER = {
    "Abs": L.abs_,
    "Neg": _neg_e,
    "Sign": L.sign,
    "Relu": lambda x: L.max_(x, 0),
    "Ceil": L.ceil,
    "Floor": L.floor,
    "Round": L.round_,
    "Exp": L.exp,
    "Log": L.log,
    "Sqrt": L.sqrt,
    "Reciprocal": lambda x: 1 / x,
    "Sin": L.sin,
    "Cos": L.cos,
    "Tan": L.tan,
    "Asin": L.asin,
    "Acos": L.acos,
    "Atan": L.atan,
    "Sinh": L.sinh,
    "Cosh": L.cosh,
    "Asinh": L.asinh,
    "Acosh": L.acosh,
    "Atanh": L.atanh,
    "Tanh": L.tanh,
    "Erf": L.erf,
    "Sigmoid": _sigmoid_e,
    "Softsign": lambda x: x / (1 + L.fabs(x)),
    "Softplus": _softplus_e,
    "Mish": lambda x: x * L.tanh(_softplus_e(x)),
    # a multiply: a division cost 20% more. The clamp is a maxps and a minps (kiln.codegen.c's
    # maxc / minc); a select of the constants 0 and 1 took two compares and three masked ops: dw
    # 3x3 + HardSwish 240ch 14x14 0.0146 -> 0.0119 ms (one thread, benchmarks/inverted_residual.py
    # --blocks mobilenet_v3's convs unfused, interleaved)
    "HardSwish": lambda x: x * _clamp01(x * (1 / 6) + 0.5),
    "Elu": lambda x, alpha: L.select(x > 0, x, alpha * _expm1_e(x)),
    "Celu": lambda x, alpha: L.select(x > 0, x, alpha * _expm1_e(x / alpha, alpha > 0)),
    "Selu": lambda x, alpha, gamma: gamma * L.select(x > 0, x, alpha * _expm1_e(x)),
    "LeakyRelu": lambda x, alpha: L.select(x >= 0, x, alpha * x),
    "ThresholdedRelu": lambda x, alpha: L.select(x > alpha, x, L.const(0, x.dtype)),
    "HardSigmoid": lambda x, alpha, beta: _clamp01(alpha * x + beta),
    "Swish": lambda x, alpha: x * _sigmoid_e(alpha * x),
    "Gelu": _gelu_e,
    "Shrink": _shrink_e,
}


def _register_unary_lowering(name, lower_fn, defaults):
    @_lowers(name)
    def lower(ctx, x):
        kw = _attrs(ctx, defaults)
        return _map(ctx, lambda v: lower_fn(v, **kw), [x])


if _UNARY_LOWER.keys() != _UNARY.keys():  # a row in one table only would be an op without a lowering
    raise RuntimeError(f"unary tables differ in {sorted(_UNARY_LOWER.keys() ^ _UNARY.keys())}")
for _name, (_fn, _defaults, _kind) in _UNARY.items():
    _register_unary_lowering(_name, _UNARY_LOWER[_name], _defaults)


def _is_inf_e(ctx, x):
    pos, neg = bool(ctx.attr("detect_positive", 1)), bool(ctx.attr("detect_negative", 1))
    inf = L.isinf(x)
    return inf if pos and neg else inf & (x > 0) if pos else inf & (x < 0) if neg \
        else L.const(False, DType.bool)


_lowers("IsNaN")(lambda ctx, x: _map(ctx, L.isnan, [x]))
_lowers("IsInf")(lambda ctx, x: _map(ctx, lambda v: _is_inf_e(ctx, v), [x]))
_lowers("Not", "BitwiseNot")(lambda ctx, x: _map(ctx, lambda v: ~v, [x]))
_lowers("Identity")(lambda ctx, x: x)  # the kernel gives an output that is an input its own copy


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


# name -> lowering fn(ctx, a: Expr, b: Expr) (kiln.ops.elementwise._BINARY has the references)
_BINARY_LOWER = {
    "Add": lambda c, a, b: a + b,
    "Sub": lambda c, a, b: a - b,
    "Mul": lambda c, a, b: a * b,
    "Div": _div_e,
    "Pow": _pow_e,
    "Mod": _mod_e,
    "PRelu": lambda c, a, b: L.select(a < 0, a * b, a),
    "BitShift": _shift_e,
    "BitwiseAnd": lambda c, a, b: a & b,
    "BitwiseOr": lambda c, a, b: a | b,
    "BitwiseXor": lambda c, a, b: a ^ b,
    "And": lambda c, a, b: a & b,
    "Or": lambda c, a, b: a | b,
    "Xor": lambda c, a, b: a ^ b,
    "Equal": lambda c, a, b: a.eq(b),
    "Less": lambda c, a, b: a < b,
    "LessOrEqual": lambda c, a, b: a <= b,
    "Greater": lambda c, a, b: a > b,
    "GreaterOrEqual": lambda c, a, b: a >= b,
}


def _register_binary_lowering(name, lower_fn):
    @_lowers(name)
    def lower(ctx, a, b):
        pads = [0, _b_pad(ctx, len(a.shape), len(b.shape))]
        return _map(ctx, lambda x, y: lower_fn(ctx, x, y), [a, b], pads)


if _BINARY_LOWER.keys() != _BINARY.keys():
    raise RuntimeError(f"binary tables differ in {sorted(_BINARY_LOWER.keys() ^ _BINARY.keys())}")
for _name in _BINARY:
    _register_binary_lowering(_name, _BINARY_LOWER[_name])


@_lowers("SwiGLU")
def _swiglu_lower(ctx, a, b):
    alpha = float(ctx.attr("alpha", 1.0))
    return _map(ctx, lambda x, y: x * _sigmoid_e(alpha * x) * y, [a, b])


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


_lowers("Where")(lambda ctx, c, x, y: _map(ctx, L.select, [c, x, y]))


@_lowers("Clip")
def _clip_lower(ctx, x, lo=None, hi=None):
    """max then min, NaN-propagating; bounds are attributes (Clip-6) or size-1 tensors. A bound
    loaded from an initializer known not to be NaN clamps as `b > y ? b : y` (`b < y ? b : y`):
    a NaN y stays NaN, and GCC makes it one maxps / minps where the NaN-checking max_ took a
    compare, a NaN test and a blend (a third of a depthwise conv's time: 9 FMAs a vector). An
    attribute is a constant: max_ / min_, which the C emitter makes the same (maxc / minc)."""
    def bound(y, i, t, attr, default):
        if ctx.opset < 11:
            v = float(ctx.attr(attr, default))
            return (None, True) if v == default else (L.const(v, y.dtype), False)
        if t is None:
            return None, True
        if math.prod(t.shape) != 1:
            ctx.fail(f"input {attr} must be a scalar, got shape {tuple(t.shape)}")
        known = ctx.value(i)
        return L.cast(y.dtype, t[(0,) * len(t.shape)]), known is not None and not np.isnan(known).any()

    def fn(*i):
        y = _up_e(x[i])
        for k, t, attr, default, below in ((1, lo, "min", -math.inf, True), (2, hi, "max", math.inf, False)):
            b, number = bound(y, k, t, attr, default)
            if b is None:
                continue
            if number:      # (a bound of an integer dtype: the same)
                y = L.select(b > y if below else b < y, b, y)
            else:
                y = L.max_(y, b) if below else L.min_(y, b)
        return L.cast(x.dtype, y)
    return L.compute(x.shape, fn, "y0")


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


@_lowers("BitCast")
def _bitcast_lower(ctx, x):
    """A byte copy: reinterpreting bits is no arithmetic a compute can express."""
    n = math.prod(x.shape) * x.dtype.itemsize
    return ctx.extern(f"memcpy(out0, in0, {n}ULL);\n  return 0;", [x], [(ctx.out_shape(), ctx.out_dtype())])


@_lowers("Dropout")
def _dropout_lower(ctx, x, ratio=None, training=None):
    """Inference (training_mode absent or known false, or ratio known 0): a copy and a mask of
    ones. Otherwise a C kernel that reads training_mode (and ratio) at run time and, when
    training, draws the mask from the reference's generator (MT19937, c_src/dropout.c):
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
    """kiln/codegen/c_src/dropout.c: training_mode (and ratio) read at run time."""
    for k, what in ((0, "data"), (1, "ratio")):
        if ctx.has_input(k) and ctx.input_types[k].dtype.c is None:
            ctx.fail(f"{what} of type {ctx.input_types[k].dtype} has no C type for the training-mode "
                     "kernel", stage="lower")
    seed = ctx.attr("seed", None)
    fn = f"kiln_dropout_{x.dtype.name}"
    macros = {"KILN_DROPOUT_T": x.dtype.c, "KILN_DROPOUT_W": "double" if x.dtype == DType.float64 else "float",
              "KILN_DROPOUT_FN": fn}
    preamble = c_source("kiln_random.h") + c_instance("dropout.c", macros, fn.upper())
    # the present inputs are in0 (data), in1 (ratio, if given), then training_mode
    r, train = ("(double)in1[0]", "in2") if ctx.has_input(1) else ("0.5", "in1")
    body = (f"  return {fn}(in0, out0, {'out1' if ctx.num_outputs > 1 else 'NULL'}, {math.prod(x.shape)}, {r}, "
            f"{train}[0] != 0, {int(seed is not None)}, {0 if seed is None else int(seed) % 2 ** 32}U);")
    outs = [(ctx.out_shape(0), ctx.out_dtype(0))]
    if ctx.num_outputs > 1:  # opset >= 12: a bool mask
        outs.append((tuple(x.shape), DType.bool))
    return ctx.extern(body, [x, ratio, training], outs, preamble=preamble)
