"""Measurement: a candidate that crashes or hangs costs its worker process, never kiln;
outputs are checked against the default schedule's."""

from __future__ import annotations

import time

import numpy as np
import pytest

from kiln.tune.features import featurize
from kiln.tune.measure import Measurer, Worker
from kiln.tuning import extract_tasks
from tests.tune.models import matmul


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))


def test_a_crashing_candidate_kills_only_its_worker():
    w = Worker(timeout=60)
    try:
        ans = w.run({"crash": True})
        assert "died" in ans["error"]
        ans = w.run({"path": "/nonexistent.so", "symbol": "f", "arrays": [], "n_in": 0,
                     "min_seconds": 0.001, "repeats": 1})
        assert "OSError" in ans["error"]       # a fresh worker answered
        assert w.restarts == 1
    finally:
        w.close()


def test_a_hanging_candidate_times_out():
    w = Worker(timeout=3)
    try:
        t = time.perf_counter()
        ans = w.run({"hang": True})
        assert "timed out after 3 s" in ans["error"]
        assert time.perf_counter() - t < 30
        assert w.restarts == 1
    finally:
        w.close()


def test_candidates_are_timed_and_checked_against_the_default():
    (task,) = extract_tasks(matmul(32, 64, 48))
    m = Measurer(timeout=60, repeats=2, min_seconds=0.001, featurize=featurize)
    try:
        other = {**task.defaults, "gemm.mr": 2 if task.defaults["gemm.mr"] != 2 else 3, "gemm.s_outer": True}
        res = m.measure(task, [m.lower(task, task.defaults), m.lower(task, other)])
        assert all(r.seconds is not None and r.seconds > 0 for r in res), [r.error for r in res]
        assert res[0].features.shape == res[1].features.shape and np.isfinite(res[0].features).all()
        # a reference that disagrees: the candidate is refused, not timed
        arrays, want = m._ref[task.key]
        m._ref[task.key] = (arrays, [w + 1 for w in want])
        (bad,) = m.measure(task, [m.lower(task, other)])
        assert bad.seconds is None and "wrong output" in bad.error
        (illegal,) = m.measure(task, [m.lower(task, {"gemm.mr": 99})])
        assert "illegal value 99" in illegal.error
    finally:
        m.close()
