"""The fuzzer's anchors: Conv of every kind, ConvTranspose, MatMul/Gemm, reductions, pooling,
Resize, Gather and normalizations, on random shapes, with weights whose value ranges are
known (interval arithmetic), so the epilogue that follows sees bounded values.
"""

from __future__ import annotations

import math

import numpy as np
from onnx import numpy_helper

from kiln.testing.fuzz_builder import F16, F32, GraphBuilder, I64, MAX_ELEMS, Val


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
    if kind < 0.25 and any(x.shape):
        op = str(rng.choice(["ArgMax", "ArgMin"]))
        axis = int(rng.integers(-r, r))
        if x.shape[axis % r] == 0:   # no index of an extreme in an empty set: a KilnError, not a case
            live = [k for k, d in enumerate(x.shape) if d]
            axis = live[int(rng.integers(len(live)))]
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
    if n == 0 and op == "ReduceMean":   # ONNX: the mean of nothing is undefined (kiln NaN, ORT 0)
        op = "ReduceSum"
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
