"""Each schedule primitive: the compiled result equals numpy; illegal requests name stage and axis."""

import numpy as np
import pytest

from kiln.dtypes import DType
from kiln.errors import KilnError
from kiln.loops import Schedule, compute, exp, lower, placeholder, reduce_axis, rmax, sum_
from kiln.codegen.c import emit_c
from kiln.loops import LoopModule
from kiln.loops.parse import parse_func

F32 = DType.float32
rng = np.random.default_rng(0)


def matmul(M, N, K):
    A = placeholder((M, K), F32, "A")
    B = placeholder((K, N), F32, "B")
    k = reduce_axis(K, "k")
    C = compute((M, N), lambda i, j: sum_(A[i, k] * B[k, j], axis=k), "C")
    a, b = rng.random((M, K), np.float32), rng.random((K, N), np.float32)
    return A, B, C, k, a, b


def chain(M=10, N=7):
    A = placeholder((M, N), F32, "A")
    B = compute((M, N), lambda i, j: exp(A[i, j]) * 2.0, "B")
    C = compute((M, N), lambda i, j: B[i, j] + B[i, (j + 1) % N], "C")
    a = rng.random((M, N), np.float32)
    b = np.exp(a) * 2
    return A, B, C, a, b + np.roll(b, -1, axis=1)


def test_printer_shows_a_readable_nest():
    A, B, C, k, _, _ = matmul(8, 8, 8)
    s = Schedule(C)
    io, ii = s[C].split(C.axis[0], 4)
    s[C].parallel(io)
    text = str(lower(s, [A, B, C], "mm"))
    assert text == """func mm(float32 A[8, 8], float32 B[8, 8], float32 C[8, 8]) {
  parallel for (i.o = 0; i.o < 2; ++i.o) {
    for (i.i = 0; i.i < 4; ++i.i) {
      for (j = 0; j < 8; ++j) {
        C[(i.o * 4) + i.i, j] = 0.0f;
        for (k = 0; k < 8; ++k) {
          C[(i.o * 4) + i.i, j] = C[(i.o * 4) + i.i, j] + (A[(i.o * 4) + i.i, k] * B[k, j]);
        }
      }
    }
  }
}"""


def test_split_tile_reorder_vectorize_parallel_unroll(run):
    A, B, C, k, a, b = matmul(19, 21, 11)   # nothing divides: guards everywhere
    s = Schedule(C)
    io, jo, ii, ji = s[C].tile(C.axis[0], C.axis[1], 4, 8)
    ko, ki = s[C].split(k, nparts=3)
    s[C].reorder(io, jo, ko, ii, ki, ji)
    s[C].vectorize(ji)
    s[C].parallel(io)
    s[C].unroll(ki)
    (c,) = run(s, [A, B], [C], [a, b])
    np.testing.assert_allclose(c, a @ b, rtol=1e-5)


def test_fuse_and_reduction_outermost(run):
    A, B, C, k, a, b = matmul(6, 5, 4)
    s = Schedule(C)
    s[C].reorder(k, C.axis[0], C.axis[1])
    s[C].fuse(C.axis[0], C.axis[1])
    (c,) = run(s, [A, B], [C], [a, b])
    np.testing.assert_allclose(c, a @ b, rtol=1e-5)


def test_compute_at_and_inline(run):
    A, B, C, a, ref = chain()
    s = Schedule(C)
    io, ii = s[C].split(C.axis[0], 3)
    s[B].compute_at(s[C], io)
    text = str(lower(s, [A, C]))
    assert "allocate float32 B[3, 7]" in text      # only the region one tile needs
    np.testing.assert_allclose(run(s, [A], [C], [a])[0], ref, rtol=1e-6)
    s = Schedule(C)
    s[B].compute_inline()
    s[C].parallel(s[C].fuse(*C.axis))
    assert "B[" not in str(lower(s, [A, C]))
    np.testing.assert_allclose(run(s, [A], [C], [a])[0], ref, rtol=1e-6)


def test_cache_write_cache_read_packing(run):
    A, B, C, k, a, b = matmul(20, 24, 9)
    s = Schedule(C)
    CL = s.cache_write(C)
    io, jo, ii, ji = s[C].tile(C.axis[0], C.axis[1], 4, 8)
    s[CL].compute_at(s[C], jo)
    i, j = s[CL].axis
    ko, ki = s[CL].split(k, 4)
    s[CL].reorder(ko, i, ki, j)
    s[CL].vectorize(j)
    AL = s.cache_read(A, [CL])
    s[AL].compute_at(s[CL], ko)
    text = str(lower(s, [A, B, C]))
    assert "allocate float32 C.local[4, 8]" in text and "allocate float32 A.local[4, 4]" in text
    np.testing.assert_allclose(run(s, [A, B], [C], [a, b])[0], a @ b, rtol=1e-5)


def test_max_reduction_with_offset_range(run):
    X = placeholder((5, 12), F32, "X")
    k = reduce_axis((2, 11), "k")
    R = compute((5,), lambda i: rmax(X[i, k], axis=k), "R")
    s = Schedule(R)
    s[R].split(k, 4)
    x = rng.standard_normal((5, 12)).astype(np.float32)
    np.testing.assert_array_equal(run(s, [X], [R], [x])[0], x[:, 2:11].max(axis=1))


@pytest.mark.parametrize("reducer, identity", [(sum_, 0.0), (rmax, -np.inf)])
def test_a_reduction_over_an_empty_range_is_its_identity(run, reducer, identity):
    """A static empty range (a dim of 0: LayerNorm over it, a Conv with no input channel) is the
    combiner's identity, with no loop over nothing left for a schedule to split."""
    X = placeholder((5, 0), F32, "X")
    k = reduce_axis(0, "k")
    R = compute((5,), lambda i: reducer(X[i, k], axis=k), "R")
    assert not R.reduce_axis
    s = Schedule(R)
    s[R].split(R.axis[0], 2)
    np.testing.assert_array_equal(run(s, [X], [R], [np.zeros((5, 0), np.float32)])[0], np.full(5, identity))
    with pytest.raises(KilnError, match="negative range"):
        reduce_axis((3, 2), "k")


def test_trace_replays_on_a_fresh_compute():
    A, B, C, k, _, _ = matmul(16, 16, 16)
    s = Schedule(C)
    io, jo, ii, ji = s[C].tile(C.axis[0], C.axis[1], 4, 8)
    s[C].vectorize(ji)
    A2, B2, C2, _, _, _ = matmul(16, 16, 16)
    s2 = s.trace.replay(C2)
    assert str(s2.trace) == str(s.trace)
    assert str(lower(s2, [A2, B2, C2], "f")) == str(lower(s, [A, B, C], "f"))
    # a tuner edits a decision inside the trace
    t = s.trace.with_args(0, (s.trace.insts[0].args[0], s.trace.insts[0].args[1], 2, 2))
    assert "i.i < 2" in str(lower(t.replay(C2), [A2, B2, C2]))


@pytest.mark.parametrize("bad, message", [
    (lambda s, C, k: s[C].parallel(k), "stage 'C', axis 'k'.*reduction"),
    (lambda s, C, k: s[C].vectorize(k), "stage 'C', axis 'k'.*reduction"),
    (lambda s, C, k: s[C].split(C.axis[0], 0), "stage 'C', axis 'i'.*positive"),
    (lambda s, C, k: s[C].split(C.axis[0], -3), "stage 'C', axis 'i'.*positive"),
    (lambda s, C, k: s[C].fuse(C.axis[0], k), "stage 'C', axis 'i'.*fuse"),
    (lambda s, C, k: s[C].fuse(C.axis[1], C.axis[0]), "stage 'C', axis 'j'.*consecutive"),
])
def test_illegal_primitives(bad, message):
    A, B, C, k, _, _ = matmul(8, 8, 8)
    with pytest.raises(KilnError, match=message):
        bad(Schedule(C), C, k)


def test_axis_of_another_stage_is_rejected():
    A, B, C, a, _ = chain()
    s = Schedule(C)
    with pytest.raises(KilnError, match="stage 'C'.*'i' is not a loop of this stage"):
        s[C].split(B.axis[0], 2)
    io, ii = s[C].split(C.axis[0], 2)
    with pytest.raises(KilnError, match="stage 'C'.*'i' is not a loop"):
        s[C].split(C.axis[0], 2)           # already split: no longer a loop


def softmax_rows(R=6, N=37):
    X = placeholder((R, N), F32, "X")
    k1, k2 = reduce_axis(N, "k1"), reduce_axis(N, "k2")
    M = compute((R, 1), lambda i, z: rmax(X[i, k1], k1), "M")
    E = compute((R, N), lambda i, j: exp(X[i, j] - M[i, 0]), "E")
    S = compute((R, 1), lambda i, z: sum_(E[i, k2], k2), "S")
    Y = compute((R, N), lambda i, j: E[i, j] / S[i, 0], "Y")
    x = rng.standard_normal((R, N)).astype(np.float32)
    e = np.exp(x - x.max(1, keepdims=True))
    return X, (M, E, S, Y), x, e / e.sum(1, keepdims=True)


def test_compute_at_beside_a_sibling_consumer(run):
    """exp is read by the row sum and by the divide: with the sum computed at the row
    loop first, exp (and the max it reads) can be computed there too: one row at a time,
    in local buffers, one parallel loop and no heap temporaries."""
    X, (M, E, S, Y), x, want = softmax_rows()
    s = Schedule(Y)
    i, j = s[Y].axis
    s[Y].parallel(i)
    s[S].compute_at(s[Y], i)                 # consumers first
    s[E].compute_at(s[Y], i)                 # read by S (attached here) and Y
    s[M].compute_at(s[Y], i)                 # read by E (attached here)
    s[E].vectorize(s[E].axis[1])
    (got,) = run(s, [X], [Y], [x])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    text = str(lower(s, [X, Y], "softmax"))
    assert text.count("parallel") == 1 and "heap" not in text, text


def test_compute_at_needs_its_sibling_consumers_attached_first():
    X, (M, E, S, Y), x, want = softmax_rows()
    s = Schedule(Y)
    with pytest.raises(KilnError, match="stage 'E'.*does not enclose every use.*computed at that loop first"):
        s[E].compute_at(s[Y], s[Y].axis[0])  # S still at the root
    s[S].compute_at(s[Y], s[Y].axis[0])
    s[E].compute_at(s[Y], s[Y].axis[0])
    s[S].compute_root()                      # moved away afterwards: lowering refuses
    with pytest.raises(KilnError, match="stage 'E' is computed at Y.i, which does not enclose every use"):
        lower(s, [X, Y], "softmax")


def test_compute_at_must_enclose_every_use():
    A = placeholder((8,), F32, "A")
    B = compute((8,), lambda i: A[i] + 1.0, "B")
    C = compute((8,), lambda i: B[i] * 2.0, "C")
    D = compute((8,), lambda i: B[i] + C[i], "D")
    s = Schedule(D)
    with pytest.raises(KilnError, match="stage 'B', axis 'i'.*does not enclose every use"):
        s[B].compute_at(s[C], C.axis[0])
    with pytest.raises(KilnError, match="stage 'D'.*output"):
        s[D].compute_inline()


def test_rfactor_parallelizes_a_reduction(run):
    X = placeholder((3, 1001), F32, "X")
    k = reduce_axis(1001, "k")
    R = compute((3,), lambda i: sum_(X[i, k], axis=k), "R")
    s = Schedule(R)
    with pytest.raises(KilnError, match="stage 'R', axis 'i'.*reduction loop"):
        s.rfactor(R, R.axis[0])
    ko, ki = s[R].split(k, nparts=8)          # 1001 = 8 * 126 - 7: the partials are masked
    RF = s.rfactor(R, ko)
    s[RF].parallel(s[RF].axis[0])
    assert RF.shape == (8, 3)
    x = rng.random((3, 1001), np.float32)
    np.testing.assert_allclose(run(s, [X], [R], [x])[0], x.sum(1), rtol=1e-5)
    assert str(lower(s.trace.replay(R), [X, R])) == str(lower(s, [X, R]))


@pytest.mark.parametrize("outer, inner", [(3, 2), (5, 3), (4, 3), (3, 3)])
def test_a_reduction_split_twice_sums_each_element_once(run, outer, inner):
    """k split by `outer`, then its inner part by `inner`: where `inner` does not divide it, the
    inner part runs past its extent (k.i = 3 of 3) while k itself stays in range, and each such k
    must still be summed once (found by test_properties: 10.29 for 9.00)."""
    X = placeholder((2, 7), F32, "X")
    k = reduce_axis(7, "k")
    R = compute((2,), lambda i: sum_(X[i, k] * X[i, k], axis=k), "R")
    s = Schedule(R)
    ko, ki = s[R].split(k, outer)
    s[R].split(ki, inner)
    x = rng.standard_normal((2, 7)).astype(np.float32)
    np.testing.assert_allclose(run(s, [X], [R], [x])[0], (x * x).sum(1), rtol=1e-5)


def test_prefetch_hints_each_element_read_offset_iterations_ahead(run):
    A, B, C, k, a, b = matmul(8, 32, 24)
    s = Schedule(C)
    io, ii = s[C].split(C.axis[0], 2)
    jo, ji = s[C].split(C.axis[1], 16)
    s[C].reorder(io, jo, k, ii, ji)
    s[C].unroll(ii)
    s[C].vectorize(ji)
    s[C].prefetch(A, k, 4)      # one hint per unrolled row (ii), the vector loop at its first lane
    s[C].prefetch(B, k, 8)      # B's element is the same for both rows: one hint
    text = str(lower(s, [A, B, C], "mm"))
    assert """      for (k = 0; k < 24; ++k) {
        prefetch(A[i.o * 2, k + 4]);
        prefetch(A[(i.o * 2) + 1, k + 4]);
        prefetch(B[k + 8, j.o * 16]);
        unrolled for (i.i = 0; i.i < 2; ++i.i) {""" in text
    assert "prefetch" not in text.split("for (k = 0")[0]      # not in the init nest
    np.testing.assert_allclose(run(s, [A, B], [C], [a, b])[0], a @ b, rtol=1e-5)
    # the trace replays it, and the text parses back (kiln.loops.parse)
    A2, B2, C2, _, _, _ = matmul(8, 32, 24)
    assert str(lower(s.trace.replay(C2), [A2, B2, C2], "mm")) == text
    assert str(parse_func(text)) == text
    # the C backend asks for the element's address (read, kept in L1)
    src = emit_c(LoopModule([lower(s, [A, B, C], "mm")]))
    hints = [line.strip() for line in src.splitlines() if "prefetch" in line]
    assert hints == ["(void)__builtin_prefetch(&b0_A[((v7_k + (v3_i_o * 48)) + 4)], 0, 3);",
                     "(void)__builtin_prefetch(&b0_A[((v7_k + (v3_i_o * 48)) + 28)], 0, 3);",
                     "(void)__builtin_prefetch(&b1_B[(((v7_k * 32) + (v4_j_o * 16)) + 256)], 0, 3);"]


def test_prefetch_next_hints_the_next_block_one_unrolled_part_per_index(run):
    """Stage.prefetch_next: at each k, B's element one block of columns further (32), the
    unrolled part jm at row i modulo its 2 parts (the others at their first iteration), into L2."""
    A, B, C, k, a, b = matmul(4, 64, 24)
    s = Schedule(C)
    jo, jr = s[C].split(C.axis[1], 32)
    jm, ji = s[C].split(jr, 16)
    s[C].reorder(C.axis[0], jo, k, jm, ji)
    s[C].unroll(jm)
    s[C].vectorize(ji)
    s[C].prefetch_next(B, k, 1, 32, jm, C.axis[0])
    text = str(lower(s, [A, B, C], "mm"))
    hints = [ln.strip() for ln in text.splitlines() if "prefetch" in ln]
    assert hints == ["prefetch_l2(B[k, ((j.o * 32) + ((i % 2) * 16)) + 32]);"]
    np.testing.assert_allclose(run(s, [A, B], [C], [a, b])[0], a @ b, rtol=1e-5)
    A2, B2, C2, _, _, _ = matmul(4, 64, 24)
    assert str(lower(s.trace.replay(C2), [A2, B2, C2], "mm")) == text
    assert str(parse_func(text)) == text
    src = emit_c(LoopModule([lower(s, [A, B, C], "mm")]))
    assert [ln.strip()[-8:] for ln in src.splitlines() if "prefetch" in ln] == [", 0, 2);"]   # L2 only
    # the spread loop must be an unrolled loop inside the hint's; `by` an axis of the stage
    with pytest.raises(KilnError, match="spread loop must be an unrolled loop inside"):
        s[C].prefetch_next(B, jm, 1, 32, k, C.axis[0])
    with pytest.raises(KilnError, match="is not an axis of this stage"):
        s[C].prefetch_next(B, k, 1, 32, jm, k)
    with pytest.raises(KilnError, match="step 0"):
        s[C].prefetch_next(B, k, 1, 0, jm, C.axis[0])


@pytest.mark.parametrize("bad, message", [
    (lambda s, A, C, k: s[C].prefetch(A, k, 0), "stage 'C', axis 'k'.*positive integer offset"),
    (lambda s, A, C, k: s[C].prefetch(C, k, 2), "stage 'C', axis 'k'.*does not read 'C'"),
])
def test_illegal_prefetch(bad, message):
    A, _, C, k, _, _ = matmul(8, 8, 8)
    with pytest.raises(KilnError, match=message):
        bad(Schedule(C), A, C, k)


def test_prefetch_at_a_vectorized_loop_is_an_error():
    A, B, C, _, _, _ = matmul(8, 16, 8)
    s = Schedule(C)
    s[C].vectorize(C.axis[1])
    s[C].prefetch(B, C.axis[1], 16)
    with pytest.raises(KilnError, match="stage 'C': prefetch at loop 'j', which is vectorized"):
        lower(s, [A, B, C])
