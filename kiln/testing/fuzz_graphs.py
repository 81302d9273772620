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

The generator's parts, one module each: the builder (`fuzz_builder`), the elementwise
segments and epilogues (`fuzz_elementwise`), the anchors (`fuzz_anchors`), the view chains
and pass motifs (`fuzz_views`); this module adds control flow and data-dependent sizes and
puts whole graphs together (`random_model`, `generate`).
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from kiln.testing.fuzz_builder import (BOOL, Case, F16, F32, F64, GraphBuilder, I64, LEVELS, MAX_ELEMS, OPSETS, Val,
                                       _NP, levels_for)
from kiln.testing.fuzz_elementwise import epilogue, unary
from kiln.testing.fuzz_anchors import ANCHORS, ANCHOR_WEIGHTS, _dims, _fit
from kiln.testing.fuzz_views import motif, view


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
        x = b.break_ties(x, axis)
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
