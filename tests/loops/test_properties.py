"""Property tests: random computes under random legal schedules give numpy's numbers.

Each example draws a small program (elementwise chain with broadcasts and shifted
reads, a reduction with an epilogue, or a matmul with a bias+relu epilogue) and
a random schedule built stage by stage, consumers first, so compute_at targets a
loop that exists: splits, reorders, fuses, vectorize/parallel/unroll, and for each
producer root / inline / compute_at a random loop of its consumer.
"""

import os

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kiln.dtypes import DType
from kiln.loops import Schedule, compute, exp, max_, placeholder, reduce_axis, rmax, sum_, tanh

F32 = DType.float32
SETTINGS = settings(max_examples=int(os.environ.get("KILN_PROPERTY_EXAMPLES", 25)), deadline=None, suppress_health_check=[HealthCheck.too_slow])
dims = st.integers(1, 9)


def elementwise(draw, rng):
    M, N = draw(dims), draw(dims)
    A = placeholder((M, N), F32, "A")
    b = placeholder((N,), F32, "b")
    a, bv = rng.standard_normal((M, N), np.float32), rng.standard_normal(N).astype(np.float32)
    cur, ref = A, a
    stages = []
    for s in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["exp", "bias", "shift", "relu", "tanh"]))
        P, r = cur, ref
        if kind == "exp":
            cur, ref = compute((M, N), lambda i, j: exp(P[i, j] * 0.5), f"T{s}"), np.exp(r * 0.5)
        elif kind == "bias":
            cur, ref = compute((M, N), lambda i, j: P[i, j] + b[j], f"T{s}"), r + bv
        elif kind == "shift":
            cur = compute((M, N), lambda i, j: P[i, j] - P[(i + 1) % M, (j + N - 1) % N], f"T{s}")
            ref = r - np.roll(np.roll(r, -1, axis=0), 1, axis=1)
        elif kind == "relu":
            cur, ref = compute((M, N), lambda i, j: max_(P[i, j], 0.0), f"T{s}"), np.maximum(r, 0)
        else:
            cur, ref = compute((M, N), lambda i, j: tanh(P[i, j]) + A[i, j], f"T{s}"), np.tanh(r) + a
        stages.append(cur)
    return [A, b], [a, bv], cur, ref


def reduction(draw, rng):
    M, K = draw(dims), draw(dims)
    X = placeholder((M, K), F32, "X")
    x = rng.standard_normal((M, K), np.float32)
    k = reduce_axis(K, "k")
    if draw(st.booleans()):
        R, ref = compute((M,), lambda i: sum_(X[i, k] * X[i, k], axis=k), "R"), (x * x).sum(1)
    else:
        R, ref = compute((M,), lambda i: rmax(X[i, k], axis=k), "R"), x.max(1)
    if draw(st.booleans()):
        R, ref = compute((M,), lambda i: R[i] * 2.0 + 1.0, "E"), ref * 2 + 1
    return [X], [x], R, ref


def matmul(draw, rng):
    M, N, K = draw(dims), draw(dims), draw(dims)
    A, B = placeholder((M, K), F32, "A"), placeholder((K, N), F32, "B")
    bias = placeholder((N,), F32, "bias")
    a, bm = rng.standard_normal((M, K), np.float32), rng.standard_normal((K, N), np.float32)
    bv = rng.standard_normal(N).astype(np.float32)
    k = reduce_axis(K, "k")
    C = compute((M, N), lambda i, j: sum_(A[i, k] * B[k, j], axis=k), "C")
    D = compute((M, N), lambda i, j: max_(C[i, j] + bias[j], 0.0), "D")
    return [A, B, bias], [a, bm, bv], D, np.maximum(a @ bm + bv, 0)


def random_loops(draw, stage):
    """A few random loop-structure primitives on one stage."""
    for _ in range(draw(st.integers(0, 4))):
        leaves = stage.leaves
        what = draw(st.sampled_from(["split", "reorder", "fuse", "vectorize", "parallel", "unroll"]))
        v = draw(st.sampled_from(leaves))
        spatial = [x for x in leaves if not stage.is_reduce(x)]
        if what == "split":
            stage.split(v, draw(st.integers(1, v.arg.dom[1] + 1)))
        elif what == "reorder":
            stage.reorder(*draw(st.permutations(leaves)))
        elif what == "fuse":
            p = leaves.index(v)
            if p + 1 < len(leaves) and stage.is_reduce(v) == stage.is_reduce(leaves[p + 1]):
                stage.fuse(v, leaves[p + 1])
        elif what in ("vectorize", "parallel") and spatial:
            getattr(stage, what)(spatial[-1] if what == "vectorize" else draw(st.sampled_from(spatial)))
        elif what == "unroll" and v.arg.dom[1] <= 16:
            stage.unroll(v)


def random_schedule(draw, out):
    s = Schedule(out)
    for stage in list(s.stages):               # optional caching stages first
        if stage.reduce_axis and draw(st.booleans()):
            s.cache_write(stage.tensor)
        if draw(st.integers(0, 3)) == 0:
            src = draw(st.sampled_from(stage.reads()))
            s.cache_read(src, [stage])
    for stage in list(reversed(s.stages)):     # consumers first
        random_loops(draw, stage)
        if stage.tensor is out:
            continue
        users = s.consumers(stage)
        choices = ["root"] + ([] if stage.reduce_axis else ["inline"]) + (["at"] if len(users) == 1 else [])
        where = draw(st.sampled_from(choices))
        if where == "inline":
            stage.compute_inline()
        elif where == "at":
            stage.compute_at(users[0], draw(st.sampled_from(users[0].leaves)))
    return s


@SETTINGS
@given(st.data(), st.sampled_from([elementwise, reduction, matmul]))
def test_random_schedules_match_numpy(run, data, program):
    rng = np.random.default_rng(0)
    inputs, arrays, out, ref = program(data.draw, rng)
    s = random_schedule(data.draw, out)
    (got,) = run(s, inputs, [out], arrays)
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-5, err_msg=str(s.trace))
