"""The fuzzer's comparison and its worker pool: tolerances by dtype, NaN placement, failure
signatures, and crashes/hangs in a worker reported as findings (the pool carries on)."""

import time

import numpy as np
import pytest
from onnx import TensorProto, helper

from kiln.testing.differential import (TOLERANCE, Finding, WorkerPool, check_case, compare,
                                       job_for_model, normalize)


def test_compare_floats_by_dtype():
    w = np.linspace(-3, 3, 50, dtype=np.float32)
    assert compare(w * (1 + 1e-6), w, TOLERANCE) is None
    assert "max abs error" in compare(w + 1e-2, w, TOLERANCE)
    w16 = w.astype(np.float16)
    assert compare((w16 * np.float16(1.005)).astype(np.float16), w16, TOLERANCE) is None
    w64 = w.astype(np.float64)
    assert compare(w64 * (1 + 1e-6), w64, TOLERANCE) is not None


def test_compare_nan_inf_ints_shapes():
    a = np.array([1.0, np.nan, np.inf], np.float32)
    assert compare(a.copy(), a, TOLERANCE) is None
    assert "NaN" in compare(np.array([1.0, 2.0, np.inf], np.float32), a, TOLERANCE)
    assert "infinities" in compare(np.array([1.0, np.nan, -np.inf], np.float32), a, TOLERANCE)
    assert "differ" in compare(np.array([1, 2]), np.array([1, 3]), TOLERANCE)
    assert "shape" in compare(np.zeros((2, 3)), np.zeros((3, 2)), TOLERANCE)
    assert "dtype" in compare(np.zeros(2, np.float64), np.zeros(2, np.float32), TOLERANCE)


def test_signature_blanks_names_and_numbers():
    a = Finding("error", "cpu", 1, "[schedule] stage 'acc', axis 'i0.i1.f': read by ['t', 'y0_1'] at 12", "schedule")
    b = Finding("error", "cpu", 3, "[schedule] stage 'conv', axis 'i2': read by ['t', 't_1', 'y0'] at 7", "schedule")
    assert a.signature == b.signature
    assert normalize("output v13: max abs error 0.25 (scale 3.1)") == "output #: max abs error # (scale #)"
    assert Finding("mismatch", "cpu", 1, "x").signature != Finding("mismatch", "interpreter", 1, "x").signature


def _relu_model():
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "m",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_check_case_passes_a_correct_model():
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    assert check_case(_relu_model().SerializeToString(), {"x": x}, (0, 2)) == []


def test_check_case_reports_a_refused_input():
    found = check_case(_relu_model().SerializeToString(), {"x": np.zeros((2, 2), np.float32)}, (0,))
    assert [f.kind for f in found] == ["error"] and found[0].target == "interpreter"


def test_pool_reports_crash_and_hang_and_goes_on():
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    good = job_for_model(_relu_model(), {"x": x}, (1,), use_ort=False)
    with WorkerPool(workers=2, timeout=600) as pool:
        t = time.monotonic()
        res = pool.run([("crash", dict(good, simulate="crash")), ("ok", good)])
        took = time.monotonic() - t   # a fresh worker's start and the good job, at this moment's load
        assert res["ok"] == []
        (crash,) = res["crash"]
        assert crash.kind == "crash" and crash.level == 1 and "SIGSEGV" in crash.message
        # the hang must time out while the good job, on a fresh worker beside it, finishes: a
        # limit well above what the good job just took, so a busy machine does not time it out too
        pool.timeout = max(3.0, 3 * took)
        t = time.monotonic()
        res = pool.run([("hang", dict(good, simulate="hang")), ("ok2", good)])
        assert res["hang"][0].kind == "timeout" and res["ok2"] == []
        assert f"no result in {pool.timeout:.0f} s (during cpu -O1)" in res["hang"][0].message
        assert time.monotonic() - t >= pool.timeout      # the hang was given its whole limit
        pool.timeout = 600
        assert pool.run([("after", good)])["after"] == []
