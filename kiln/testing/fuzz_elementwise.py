"""The fuzzer's elementwise segments: unary and binary ops (with guarded domains), Clip,
integer detours, comparisons with Where, and the epilogue chains that follow an anchor.
"""

from __future__ import annotations

import math

import numpy as np

from kiln.testing.fuzz_builder import BOOL, F16, F32, F64, GraphBuilder, I32, I64, I8, MAX_ELEMS, U8, Val, _sample_range


# ---------------------------------------------------------------- elementwise ops


def _np_sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _np_softplus(x):
    return np.logaddexp(0, x)


# name: (numpy function for the range, min opset, domain ("any"/"pos"/"unit"/"small"/"step"), attrs)
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
    "Floor": (np.floor, 1, "step", {}),
    "Ceil": (np.ceil, 1, "step", {}),
    "Round": (np.round, 11, "step", {}),
    "Sign": (np.sign, 9, "step", {}),
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
    elif dom == "step":
        v = b.off_steps(v)
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
    x = b.cast(b.off_steps(v), dt)
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
