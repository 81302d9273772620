"""Schedule primitives as before/after loop IR text (TVMScript-style golden tests).

Each test lowers a compute under the default schedule and checks it against the loop
nest written as text, applies one primitive, and checks the new nest. The expected
text is parsed (kiln.loops.parse) and compared structurally (kiln.loops.structural):
variable names and redundant parentheses do not matter, the nest, indices, guards,
loop kinds and buffers do. That the nests compute the right numbers is
test_schedule.py's and test_properties.py's job.
"""

import pytest

from kiln.dtypes import DType
from kiln.loops import Schedule, compute, exp, lower, placeholder, reduce_axis, sum_
from kiln.loops.parse import parse_func
from kiln.loops.structural import assert_structural_equal

F32 = DType.float32


def assert_lowers_to(s: Schedule, params, text: str) -> None:
    assert_structural_equal(lower(s, params, "f"), parse_func(text))


def matmul():
    A = placeholder((4, 6), F32, "A")
    B = placeholder((6, 8), F32, "B")
    k = reduce_axis(6, "k")
    C = compute((4, 8), lambda i, j: sum_(A[i, k] * B[k, j], axis=k), "C")
    return A, B, C, k


def chain():
    A = placeholder((4, 8), F32, "A")
    B = compute((4, 8), lambda i, j: exp(A[i, j]) * 2.0, "B")
    C = compute((4, 8), lambda i, j: B[i, j] + B[i, (j + 1) % 8], "C")
    return A, B, C


MATMUL = """
func f(float32 A[4, 6], float32 B[6, 8], float32 C[4, 8]) {
  for (i = 0; i < 4; ++i) {
    for (j = 0; j < 8; ++j) {
      C[i, j] = 0.0f;
      for (k = 0; k < 6; ++k) {
        C[i, j] = C[i, j] + A[i, k] * B[k, j];
      }
    }
  }
}"""

CHAIN = """
func f(float32 A[4, 8], float32 C[4, 8]) {
  allocate float32 B[4, 8] (heap) {
    for (i = 0; i < 4; ++i) {
      for (j = 0; j < 8; ++j) {
        B[i, j] = exp(A[i, j]) * 2.0f;
      }
    }
    for (i2 = 0; i2 < 4; ++i2) {
      for (j2 = 0; j2 < 8; ++j2) {
        C[i2, j2] = B[i2, j2] + B[i2, (j2 + 1) % 8];
      }
    }
  }
}"""


@pytest.fixture
def mm():
    A, B, C, k = matmul()
    s = Schedule(C)
    assert_lowers_to(s, [A, B, C], MATMUL)
    return s, [A, B, C], C, k


@pytest.fixture
def ch():
    A, B, C = chain()
    s = Schedule(C)
    assert_lowers_to(s, [A, C], CHAIN)
    return s, [A, C], B, C


def test_split_guards_a_factor_that_does_not_divide(mm):
    s, params, C, _ = mm
    s[C].split(C.axis[1], 3)
    assert_lowers_to(s, params, """
func f(float32 A[4, 6], float32 B[6, 8], float32 C[4, 8]) {
  for (i = 0; i < 4; ++i) {
    for (j.o = 0; j.o < 3; ++j.o) {
      for (j.i = 0; j.i < 3; ++j.i) {
        if (j.o * 3 + j.i < 8) {
          C[i, j.o * 3 + j.i] = 0.0f;
        }
        for (k = 0; k < 6; ++k) {
          if (j.o * 3 + j.i < 8) {
            C[i, j.o * 3 + j.i] = C[i, j.o * 3 + j.i] + A[i, k] * B[k, j.o * 3 + j.i];
          }
        }
      }
    }
  }
}""")


def test_reorder_moves_the_reduction_outermost_and_splits_the_init(mm):
    s, params, C, k = mm
    s[C].reorder(k, C.axis[0])
    assert_lowers_to(s, params, """
func f(float32 A[4, 6], float32 B[6, 8], float32 C[4, 8]) {
  for (j = 0; j < 8; ++j) {
    for (i = 0; i < 4; ++i) {
      C[i, j] = 0.0f;
    }
  }
  for (k = 0; k < 6; ++k) {
    for (j = 0; j < 8; ++j) {
      for (i = 0; i < 4; ++i) {
        C[i, j] = C[i, j] + A[i, k] * B[k, j];
      }
    }
  }
}""")


def test_tile(mm):
    s, params, C, _ = mm
    s[C].tile(C.axis[0], C.axis[1], 2, 4)
    assert_lowers_to(s, params, """
func f(float32 A[4, 6], float32 B[6, 8], float32 C[4, 8]) {
  for (i.o = 0; i.o < 2; ++i.o) {
    for (j.o = 0; j.o < 2; ++j.o) {
      for (i.i = 0; i.i < 2; ++i.i) {
        for (j.i = 0; j.i < 4; ++j.i) {
          C[i.o * 2 + i.i, j.o * 4 + j.i] = 0.0f;
          for (k = 0; k < 6; ++k) {
            C[i.o * 2 + i.i, j.o * 4 + j.i] = C[i.o * 2 + i.i, j.o * 4 + j.i]
                                              + A[i.o * 2 + i.i, k] * B[k, j.o * 4 + j.i];
          }
        }
      }
    }
  }
}""")


def test_fuse(mm):
    s, params, C, _ = mm
    s[C].fuse(C.axis[0], C.axis[1])
    assert_lowers_to(s, params, """
func f(float32 A[4, 6], float32 B[6, 8], float32 C[4, 8]) {
  for (ij = 0; ij < 32; ++ij) {
    C[ij // 8, ij % 8] = 0.0f;
    for (k = 0; k < 6; ++k) {
      C[ij // 8, ij % 8] = C[ij // 8, ij % 8] + A[ij // 8, k] * B[k, ij % 8];
    }
  }
}""")


@pytest.mark.parametrize("primitive, kind, axis", [("parallel", "parallel", 0), ("vectorize", "vectorized", 1),
                                                   ("unroll", "unrolled", 1)])
def test_loop_kinds(mm, primitive, kind, axis):
    s, params, C, _ = mm
    getattr(s[C], primitive)(C.axis[axis])
    loop = ["  for (i", "    for (j"][axis]
    assert_lowers_to(s, params, MATMUL.replace(loop, loop.replace("for", f"{kind} for")))


def test_unroll_a_reduction_loop(mm):
    s, params, C, k = mm
    s[C].unroll(k)
    assert_lowers_to(s, params, MATMUL.replace("for (k", "unrolled for (k"))


def test_compute_inline(ch):
    s, params, B, C = ch
    s[B].compute_inline()
    assert_lowers_to(s, params, """
func f(float32 A[4, 8], float32 C[4, 8]) {
  for (i = 0; i < 4; ++i) {
    for (j = 0; j < 8; ++j) {
      C[i, j] = exp(A[i, j]) * 2.0f + exp(A[i, (j + 1) % 8]) * 2.0f;
    }
  }
}""")


def test_compute_at_computes_the_rows_one_iteration_needs_then_compute_root_undoes_it(ch):
    s, params, B, C = ch
    s[B].compute_at(s[C], C.axis[0])
    assert_lowers_to(s, params, """
func f(float32 A[4, 8], float32 C[4, 8]) {
  for (i = 0; i < 4; ++i) {
    allocate float32 B[1, 8] local (auto) {
      for (j = 0; j < 8; ++j) {
        B[0, j] = exp(A[i, j]) * 2.0f;
      }
      for (j2 = 0; j2 < 8; ++j2) {
        C[i, j2] = B[0, j2] + B[0, (j2 + 1) % 8];
      }
    }
  }
}""")
    s[B].compute_root()
    assert_lowers_to(s, params, CHAIN)


def test_cache_write(mm):
    s, params, C, _ = mm
    s.cache_write(C)
    assert_lowers_to(s, params, """
func f(float32 A[4, 6], float32 B[6, 8], float32 C[4, 8]) {
  allocate float32 C.local[4, 8] local (heap) {
    for (i = 0; i < 4; ++i) {
      for (j = 0; j < 8; ++j) {
        C.local[i, j] = 0.0f;
        for (k = 0; k < 6; ++k) {
          C.local[i, j] = C.local[i, j] + A[i, k] * B[k, j];
        }
      }
    }
    for (i2 = 0; i2 < 4; ++i2) {
      for (j2 = 0; j2 < 8; ++j2) {
        C[i2, j2] = C.local[i2, j2];
      }
    }
  }
}""")


def test_cache_read(mm):
    s, params, C, _ = mm
    s.cache_read(params[0], [s[C]])
    assert_lowers_to(s, params, """
func f(float32 A[4, 6], float32 B[6, 8], float32 C[4, 8]) {
  allocate float32 A.local[4, 6] local (heap) {
    for (ax0 = 0; ax0 < 4; ++ax0) {
      for (ax1 = 0; ax1 < 6; ++ax1) {
        A.local[ax0, ax1] = A[ax0, ax1];
      }
    }
    for (i = 0; i < 4; ++i) {
      for (j = 0; j < 8; ++j) {
        C[i, j] = 0.0f;
        for (k = 0; k < 6; ++k) {
          C[i, j] = C[i, j] + A.local[i, k] * B[k, j];
        }
      }
    }
  }
}""")


def test_rfactor_makes_partial_sums_a_parallel_loop():
    X = placeholder((3, 8), F32, "X")
    k = reduce_axis(8, "k")
    R = compute((3,), lambda i: sum_(X[i, k], axis=k), "R")
    s = Schedule(R)
    assert_lowers_to(s, [X, R], """
func f(float32 X[3, 8], float32 R[3]) {
  for (i = 0; i < 3; ++i) {
    R[i] = 0.0f;
    for (k = 0; k < 8; ++k) {
      R[i] = R[i] + X[i, k];
    }
  }
}""")
    ko, _ = s[R].split(k, nparts=2)
    RF = s.rfactor(R, ko)
    s[RF].parallel(s[RF].axis[0])
    assert_lowers_to(s, [X, R], """
func f(float32 X[3, 8], float32 R[3]) {
  allocate float32 R.rf[2, 3] (heap) {
    parallel for (rf = 0; rf < 2; ++rf) {
      for (i = 0; i < 3; ++i) {
        R.rf[rf, i] = 0.0f;
        for (ki = 0; ki < 4; ++ki) {
          R.rf[rf, i] = R.rf[rf, i] + X[i, rf * 4 + ki];
        }
      }
    }
    for (i2 = 0; i2 < 3; ++i2) {
      R[i2] = 0.0f;
      for (ko = 0; ko < 2; ++ko) {
        R[i2] = R[i2] + R.rf[ko, i2];
      }
    }
  }
}""")


def test_a_wrong_expectation_is_reported_where_it_differs(mm):
    s, params, C, _ = mm
    s[C].split(C.axis[1], 4)
    with pytest.raises(AssertionError, match="loop kind"):
        assert_lowers_to(s, params, """
func f(float32 A[4, 6], float32 B[6, 8], float32 C[4, 8]) {
  for (i = 0; i < 4; ++i) {
    for (j.o = 0; j.o < 2; ++j.o) {
      vectorized for (j.i = 0; j.i < 4; ++j.i) {
        C[i, j.o * 4 + j.i] = 0.0f;
        for (k = 0; k < 6; ++k) {
          C[i, j.o * 4 + j.i] = C[i, j.o * 4 + j.i] + A[i, k] * B[k, j.o * 4 + j.i];
        }
      }
    }
  }
}""")
