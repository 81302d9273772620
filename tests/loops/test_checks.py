"""Run-time checks in the loop IR: `check` expressions, their status codes, and hoisting."""

import numpy as np
import pytest

from kiln.codegen import build_c
from kiln.dtypes import DType
from kiln.errors import KilnError
from kiln.loops import INDEX, LoopModule, Schedule, cast, check, compute, lower, placeholder, select, simplify
from kiln.loops.expr import var

I64, F32 = DType.int64, DType.float32


def _gather(n=5, rows=4, width=8, guard=False):
    """out[r, c] = data[checked(idx[r]), c] (guard: only where c < 3, in a select)."""
    data = placeholder((n, width), F32, "data")
    idx = placeholder((rows,), I64, "idx")

    def fn(r, c):
        j = cast(INDEX, idx[r])
        safe = check(select(j < 0, 0, select(j > n - 1, n - 1, j)), (j >= 0) & (j < n), j,
                     "index {value} is out of range")
        v = data[safe, c]
        return select(c < 3, v, 0.0) if guard else v
    out = compute((rows, width), fn, "out")
    return lower(Schedule(out), [data, idx, out], "gather")


def test_a_check_runs_once_per_row_not_per_element():
    text = str(_gather())
    assert text.index("let chk") < text.index("for (c")   # hoisted out of the inner loop
    assert text.count("check(") == 1


def test_a_check_in_a_select_branch_stays_where_it_is():
    text = str(_gather(guard=True))
    assert "let chk" not in text


def test_status_names_the_check_and_the_value():
    f = _gather()
    assert f.errors == ((1, "index {value} is out of range"),)
    lib = build_c(LoopModule([f]))
    data = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
    out = np.empty((4, 8), np.float32)
    lib["gather"](data, np.array([0, 4, 2, 1]), out)
    np.testing.assert_array_equal(out, data[[0, 4, 2, 1]])
    with pytest.raises(KilnError, match=r"status 1\): index -7 is out of range"):
        lib["gather"](data, np.array([0, 4, -7, 9]), out)


def test_the_simplifier_drops_a_check_it_proves():
    i = var("i", dom=(0, 4))
    e = check(i * 2, (i >= 0) & (i < 4), i, "never")
    assert simplify(e) is simplify(i * 2)
    assert simplify(check(i, i > 10, i, "always")).op == "check"
