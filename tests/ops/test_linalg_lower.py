"""Native (C) lowerings of MatMul, Gemm, MatMulInteger, Einsum and Det against the interpreter.

Each test builds one-node models, lowers every node to a kernel, builds them all as
one C module (one compiler run, cached by source hash) and compares each kernel's
result with the NumPy reference on random inputs. Shapes include odd and prime
sizes (edge tiles of the GEMM micro-kernel), batches with broadcasting, 1-D operands
and every transpose combination.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from onnx import helper, numpy_helper

import kiln
from kiln.codegen import build_c
from kiln.interpreter import Interpreter
from kiln.loops import LoopModule
from kiln.lower.kernel import lower_node
from kiln.targets.target import Target

rng = np.random.default_rng(0)


def rand(shape, dtype=np.float32):
    if np.dtype(dtype).kind == "f":
        return np.asarray(rng.standard_normal(shape), dtype=dtype)
    info = np.iinfo(dtype)
    return np.asarray(rng.integers(max(info.min, -100), min(info.max, 100), size=shape, endpoint=True), dtype=dtype)


def model(op, inputs, consts=None, opset=21, **attrs):
    """One-node graph: `inputs` are runtime arrays (None: an absent optional input),
    `consts` maps input position -> initializer array."""
    consts = consts or {}
    n = len(inputs) + len(consts)
    it = iter(inputs)
    slots = [("c", consts[k]) if k in consts else ("x", next(it)) for k in range(n)]
    names = ["" if x is None else f"x{k}" for k, (_, x) in enumerate(slots)]
    vi = [helper.make_tensor_value_info(f"x{k}", helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
          for k, (kind, x) in enumerate(slots) if kind == "x" and x is not None]
    inits = [numpy_helper.from_array(np.asarray(x), f"x{k}") for k, (kind, x) in enumerate(slots) if kind == "c"]
    node = helper.make_node(op, names, ["y"], name="n0", **attrs)
    g = helper.make_graph([node], "g", vi, [helper.make_empty_tensor_value_info("y")], initializer=inits)
    return kiln.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]))


def check(cases, rtol=1e-4, atol=1e-4):
    """cases: (op, inputs, consts, attrs). Lower all, build once, compare each with the interpreter."""
    graphs = [model(op, ins, consts, **attrs) for op, ins, consts, attrs in cases]
    funcs = []
    for k, g in enumerate(graphs):
        node = g.nodes[0]
        funcs.append(lower_node(node, 21, [None if v is None else v.const for v in node.inputs], f"k{k}"))
    mod = build_c(LoopModule(funcs))
    for k, ((op, ins, consts, attrs), g) in enumerate(zip(cases, graphs)):
        xs = [x for x in ins if x is not None]
        want = Interpreter(g).run(xs)[0]
        got = np.empty(want.shape, want.dtype)
        args = [v.const if v.const is not None else xs.pop(0) for v in g.nodes[0].inputs if v is not None]
        mod[f"k{k}"](*[np.require(x, requirements="C") for x in args], got)
        assert got.dtype == want.dtype and got.shape == want.shape, (op, attrs)
        if want.dtype.kind == "f":
            scale = max(1.0, float(np.abs(want).max(initial=0)))
            np.testing.assert_allclose(got, want, rtol=rtol, atol=atol * scale, err_msg=f"{op} {attrs} case {k}")
        else:
            np.testing.assert_array_equal(got, want, err_msg=f"{op} {attrs} case {k}")


def mm(a_shape, b_shape, dtype=np.float32):
    return ("MatMul", [rand(a_shape, dtype), rand(b_shape, dtype)], None, {})


def test_matmul_2d_odd_and_prime_sizes():
    sizes = [(1, 1, 1), (1, 7, 5), (5, 1, 3), (3, 5, 1), (7, 13, 11), (17, 31, 29), (13, 37, 64),
             (31, 33, 17), (64, 10, 97), (97, 101, 53), (128, 96, 64)]
    check([mm((m, k), (k, n)) for m, n, k in sizes])


def test_matmul_batched_broadcast_and_1d():
    check([mm((2, 3, 5, 7), (2, 3, 7, 4)),        # batch on both
           mm((3, 5, 7), (7, 19)),                # batch on A only
           mm((7,), (3, 7, 9)),                   # 1-D A against a batch
           mm((2, 1, 5, 6), (3, 6, 33)),          # broadcast batch dims
           mm((4, 1, 6), (2, 1, 6, 3)),           # broadcast the other way
           mm((6,), (6,)),                        # dot product: 0-d result
           mm((5, 6), (6,)),                      # matrix-vector
           mm((2, 5, 6), (6,)),
           mm((6,), (6, 40)),
           mm((37, 64), (64,)), mm((3, 1, 64), (64, 1))])   # matrix-vector: k vectorized (rfactor)


def test_matmul_dtypes():
    check([mm((9, 17), (17, 35), np.float64), mm((9, 17), (17, 35), np.int32),
           mm((3, 9, 17), (17, 5), np.int64)])
    check([mm((9, 33), (33, 35), np.float16)], rtol=1e-2, atol=1e-2)


def _gemm(m, n, k, trans_a, trans_b, c_shape=None, consts=None, **attrs):
    a = rand((k, m) if trans_a else (m, k))
    b = rand((n, k) if trans_b else (k, n))
    ins = [a, b] + ([] if c_shape is None else [rand(c_shape)])
    return ("Gemm", ins, consts, dict(attrs, transA=trans_a, transB=trans_b))


def test_gemm_transposes():
    check([_gemm(m, n, k, ta, tb) for ta in (0, 1) for tb in (0, 1)
           for m, n, k in [(1, 1, 1), (7, 13, 5), (64, 40, 100)]]
          + [_gemm(1, 45, 64, 0, 1, c_shape=(45,))])        # a Linear at batch 1: dot products


def test_gemm_alpha_beta_and_c_broadcast():
    m, n, k = 33, 70, 19
    shapes = [(), (1,), (n,), (1, n), (m, 1), (m, n)]
    check([_gemm(m, n, k, s % 2, s // 2 % 2, c, alpha=0.5, beta=-2.0) for s, c in enumerate(shapes)]
          + [_gemm(m, n, k, 0, 1, consts={2: rand((n,))}, alpha=1.5)])  # bias as an initializer


def test_gemm_integer_and_double():
    a, b, c = rand((5, 7), np.int32), rand((7, 3), np.int32), rand((3,), np.int32)
    check([("Gemm", [a, b, c], None, {}), ("Gemm", [a, b, c], None, dict(alpha=0.5, beta=3.0)),
           ("Gemm", [rand((6, 4), np.float64), rand((5, 6), np.float64)], None, dict(transA=1, transB=1))])


def test_matmul_integer_zero_points():
    a, b = rand((9, 21), np.uint8), rand((21, 35), np.int8)
    check([("MatMulInteger", [a, b], None, {}),
           ("MatMulInteger", [a, b, np.array(3, np.uint8), np.array(-2, np.int8)], None, {}),
           ("MatMulInteger", [a, b, rand((9,), np.uint8), rand((35,), np.int8)], None, {}),
           ("MatMulInteger", [rand((2, 4, 21), np.int8), b, np.array([5], np.int8)], None, {}),
           ("MatMulInteger", [rand((21,), np.uint8), b], None, {})])



def test_qlinear_matmul_requantizes_like_the_reference():
    a, b = rand((9, 21), np.uint8), rand((21, 35), np.int8)
    f32 = lambda *v: np.array(v if len(v) > 1 else v[0], np.float32)  # noqa: E731
    check([("QLinearMatMul", [a, f32(0.02), np.array(3, np.uint8), b, f32(0.01), np.array(-2, np.int8),
                              f32(0.05), np.array(7, np.uint8)], None, {}),
           # (the three scales are one type, TS: float16 beside float32 is an invalid model)
           ("QLinearMatMul", [a, (rand((9,), np.float32) ** 2 / 50).astype(np.float16), rand((9,), np.uint8), b,
                              (rand((35,), np.float32) ** 2 / 50).astype(np.float16), rand((35,), np.int8),
                              np.array(0.1, np.float16), np.array(-1, np.int8)], None, {})])

def ein(eq, *shapes, dtype=np.float32):
    return ("Einsum", [rand(s, dtype) for s in shapes], None, dict(equation=eq))


def test_einsum_matmul_like_equations_use_the_gemm():
    check([ein("ij,jk->ik", (7, 5), (5, 33)),
           ein("ji,jk->ik", (5, 7), (5, 33)),             # transposed A
           ein("bhqd,bhkd->bhqk", (2, 3, 9, 8), (2, 3, 11, 8)),  # attention scores: transposed B
           ein("bqh,bhd->bqd", (2, 9, 6), (2, 6, 17)),
           ein("i,i->", (13,), (13,)),                     # dot: m and n absent
           ein("ij,j->i", (9, 13), (13,)),
           ein("k,kn->n", (13,), (13, 40))])


def test_einsum_general_equations():
    check([ein("ii->i", (5, 5)),                           # diagonal
           ein("ij->", (4, 6)),                            # total sum
           ein("ij->ji", (4, 6)),                          # transpose, no reduction
           ein("i,j->ij", (4,), (6,)),                     # outer product
           ein("...ij,...jk->...ik", (2, 3, 4), (1, 4, 5)),  # broadcast ellipsis
           ein("ijk,jkl,l->i", (3, 4, 5), (4, 5, 6), (6,)),  # three operands, two summed labels
           ein("bij , bjk", (2, 3, 4), (2, 4, 5)),         # implicit output, spaces
           ein("ij,ij->ij", (3, 4), (3, 4), dtype=np.int32),
           ein("ij,jk->ik", (3, 0), (0, 4))])             # empty contraction: zeros
    check([ein("ij,jk->ik", (5, 33), (33, 6), dtype=np.float16)], rtol=1e-2, atol=1e-2)


def test_det_lu_with_pivoting():
    singular = np.array([[1, 2, 3], [2, 4, 6], [1, 0, 1]], np.float32)
    needs_pivot = np.array([[0, 1], [1, 0]], np.float64)
    check([("Det", [rand((4, 4))], None, {}),
           ("Det", [rand((2, 3, 5, 5))], None, {}),
           ("Det", [singular], None, {}),
           ("Det", [needs_pivot], None, {}),
           ("Det", [rand((1, 1), np.float64)], None, {}),
           ("Det", [rand((3, 0, 0))], None, {})])


def test_gemm_builder_tiles_a_fused_epilogue():
    """Gemm.schedule(sch, out) with an elementwise consumer: the GEMM's output is inlined
    into it and the accumulator tile is computed at its loops (one loop nest, no temp)."""
    from kiln.dtypes import DType
    from kiln.loops import Schedule, compute, lower, max_, placeholder
    from kiln.lower.gemm import gemm

    a, b = placeholder((37, 19), DType.float32, "a"), placeholder((45, 19), DType.float32, "b")
    g = gemm(a, b, trans_b=True, target=Target.host())
    y = compute(g.out.shape, lambda i, j: max_(g.out[i, j], 0.0), "relu")
    sch = Schedule(y)
    g.schedule(sch, y)
    func = lower(sch, [a, b, y], "k")
    text = str(func)
    assert "allocate float32 gemm.acc[" in text and "allocate float32 gemm[" not in text
    x, w, out = rand((37, 19)), rand((45, 19)), np.empty((37, 45), np.float32)
    build_c(LoopModule([func]))["k"](x, w, out)
    np.testing.assert_allclose(out, np.maximum(x @ w.T, 0), rtol=1e-4, atol=1e-4)


def test_gemm_builder_knobs_agree():
    """Every schedule variant (orientation, root or panel packing, unpacked, forced
    tiles) computes the same product, on odd sizes with a broadcast batch."""
    from kiln.dtypes import DType
    from kiln.loops import Schedule, lower, placeholder
    from kiln.lower.gemm import gemm

    knobs = [{}, dict(swap=True), dict(swap=False), dict(panel=True), dict(panel=True, swap=True),
             dict(pack=False), dict(pack=False, swap=True), dict(tile=(5, 16)), dict(tile=(3, 7), panel=True)]
    cases = []
    shapes = [((), (), 45, 83, 29, True), ((2, 1), (3,), 19, 37, 50, False)]
    for s, kw in enumerate(knobs):
        for ba, bb, m, n, k, tb in [shapes[s % 2]]:
            a = placeholder((*ba, m, k), DType.float32, "a")
            b = placeholder((*bb, *((n, k) if tb else (k, n))), DType.float32, "b")
            g = gemm(a, b, trans_b=tb, **kw, target=Target.host())
            sch = Schedule(g.out)
            g.schedule(sch)
            cases.append((lower(sch, [a, b, g.out], f"k{len(cases)}"), tb))
    mod = build_c(LoopModule([f for f, _ in cases]))
    for f, tb in cases:
        a, b, out = (np.empty(p.shape, np.float32) for p in f.params)
        a[...], b[...] = rand(a.shape), rand(b.shape)
        mod[f.name](a, b, out)
        np.testing.assert_allclose(out, a @ (np.swapaxes(b, -1, -2) if tb else b), rtol=1e-4, atol=1e-4,
                                   err_msg=f.name)


def _acc_rows(func) -> list:
    """The row extents of every GEMM accumulator a lowered function allocates locally."""
    from kiln.loops import stmt as S
    return [s.buffer.shape[-2] for s in S.walk_stmts(func.body)
            if isinstance(s, S.Allocate) and s.buffer.name.endswith(".acc") and s.buffer.scope == "local"]


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases=st.lists(st.tuples(st.lists(st.sampled_from([1, 1, 2, 3, 4, 7]), min_size=1, max_size=3),
                                st.integers(1, 19), st.integers(1, 70), st.integers(1, 40), st.booleans(),
                                st.booleans(), st.sampled_from([None, (5, 16), (3, 7)]), st.sampled_from([0, 2, 3]),
                                st.booleans()),
                      min_size=3, max_size=3))
def test_gemm_batch_rows_folded_against_a_shared_weight(cases):
    """A batch of A matrices against one B (a Linear's weight) runs as one matrix of all the
    batch's rows (Gemm.flat): odd M, N, K, one to three batch dims (size-1 dims leading and
    inside, primes), B read transposed or not, packed or not, forced tiles, planes of B over a
    leading batch dim that A broadcasts over (merged GEMMs: A's dims fold, B's planes stay
    outside), and a fused epilogue that reads a residual of the output's shape (its indices
    are the batch's, put back from the folded row), indexing size-1 dims with 0 as a
    broadcast does (`zeros`). The accumulator is one micro-tile of rows: a row index left as
    `f % R` (the leading 1 of [1, 8] x 32 folded) made its region every row, computed again
    per tile."""
    from kiln.dtypes import DType
    from kiln.loops import Schedule, compute, lower, placeholder
    from kiln.lower.gemm import gemm

    funcs, want = [], []
    for batch, m, n, k, tb, pack, tile, planes, zeros in cases:
        lead = (planes, *[1] * len(batch)) if planes else ()
        a = placeholder((*batch, m, k), DType.float32, "a")
        b = placeholder((*lead, *((n, k) if tb else (k, n))), DType.float32, "b")
        r = placeholder((*lead[:1], *batch, m, n), DType.float32, "r")
        g = gemm(a, b, trans_b=tb, swap=False, pack=pack, tile=tile, target=Target.host())
        # A's batch dims fold but leading 1s (B's planes, not shared, do not; a single column,
        # a dot per row, has no row tiles to fold)
        ones = next((i for i, d in enumerate(batch) if d != 1), len(batch))
        assert g.flat == (0 if g.dot else len(batch) - ones)
        shape = g.out.shape

        def epi(*ix):
            at = tuple(0 if zeros and d == 1 else v for v, d in zip(ix, shape))
            return g.out[at] * 0.5 + r[ix]
        y = compute(shape, epi, "epilogue")
        sch = Schedule(y)
        g.schedule(sch, y)
        f = lower(sch, [a, b, r, y], f"k{len(funcs)}")
        rows = _acc_rows(f)   # (panel packing: by design, a whole panel's rows)
        assert rows and all(n <= (g.acc.shape[-2] if g.panel else g.mr) for n in rows), (f.name, rows, g.mr)
        funcs.append(f)
        want.append(tb)
    mod = build_c(LoopModule(funcs))
    for f, tb in zip(funcs, want):
        a, b, r, out = (np.empty(p.shape, np.float32) for p in f.params)
        a[...], b[...], r[...] = rand(a.shape), rand(b.shape), rand(r.shape)
        mod[f.name](a, b, r, out)
        np.testing.assert_allclose(out, (a @ (np.swapaxes(b, -1, -2) if tb else b)) * 0.5 + r, rtol=1e-4,
                                   atol=1e-4, err_msg=f.name)
