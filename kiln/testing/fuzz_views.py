"""The fuzzer's injective segments and pass motifs: view chains (Reshape, Transpose, Slice,
Expand, Concat, Split, ...) and the shapes the graph passes rewrite (BatchNorm folding,
LayerNorm and GELU patterns, transpose pairs, mobile blocks, ...).
"""

from __future__ import annotations

import math

import numpy as np

from kiln.testing.fuzz_builder import F32, GraphBuilder, I64, MAX_ELEMS, Val, _NP
from kiln.testing.fuzz_elementwise import _bshape, binary, broadcast_shape, unary
from kiln.testing.fuzz_anchors import _SIZES, _arr, _factor, _fit, _lin_range, _weight, conv, gemm, matmul


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
        if x.rank == 4 and 0 not in x.shape[2:]:   # a 1x1 window over an empty image: refused (ORT too)
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
