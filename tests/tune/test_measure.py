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


def test_candidates_are_timed_in_turn_with_the_default():
    """After the default, every candidate's job times the default beside it: the ratio the
    search ranks comes from the same seconds of a noisy machine."""
    (task,) = extract_tasks(matmul(32, 64, 48))
    m = Measurer(timeout=60, repeats=3, min_seconds=0.001, featurize=featurize)
    try:
        other = {**task.defaults, "gemm.s_outer": not task.defaults.get("gemm.s_outer", False)}
        first, = m.measure(task, [m.lower(task, task.defaults)])
        assert first.ratio is None   # the reference itself: nothing to time it against yet
        again, cand = m.measure(task, [m.lower(task, task.defaults), m.lower(task, other)])
        for r in (again, cand):
            assert r.error is None and r.base_seconds > 0 and r.ratio == pytest.approx(r.seconds / r.base_seconds)
        assert 0.2 < again.ratio < 5   # the default against itself
    finally:
        m.close()


def test_the_cpu_clock_times_one_thread_by_its_cpu_time():
    """`--clock cpu`: the worker runs one OpenMP thread and reads the thread's CPU time (a sleep in
    the measuring process would not count); the tuner leaves the thread decisions alone."""
    from kiln.tune.measure import THREAD_DECISIONS  # noqa: PLC0415
    from kiln.tune.tuner import Tuner  # noqa: PLC0415
    w = Worker(timeout=60, threads=1)
    try:
        w._start()
        assert w.threads == 1
    finally:
        w.close()
    with pytest.raises(Exception, match="unknown measurement clock"):
        Measurer(clock="sundial")
    (task,) = extract_tasks(matmul(64, 64, 64))
    m = Measurer(timeout=60, repeats=2, min_seconds=0.001, clock="cpu")
    try:
        (r,) = m.measure(task, [m.lower(task, task.defaults)])
        assert r.error is None and r.seconds > 0
    finally:
        m.close()
    assert THREAD_DECISIONS & set(task.space)
    import tempfile  # noqa: PLC0415
    with tempfile.TemporaryDirectory() as tmp:
        t = Tuner(f"{tmp}/t.db", measurer=Measurer(clock="cpu"))
        try:
            assert t.sig.endswith("-cpu1")
            assert set(t.space(task)) == set(task.space) - THREAD_DECISIONS
        finally:
            t.close()


def test_a_hand_written_kernel_with_decisions_is_a_task_measured_like_any():
    """kiln::FusedAttention (C written by hand) has tile decisions: a task, its candidates built,
    timed and checked against its default in the worker, ranked on its decisions' features."""
    from kiln.lower.specialize import specialize
    from kiln.tune.tasks import tasks_of
    from tests.ops.test_fused_attention import fused_graph
    g = fused_graph(2, 4, 2, 24, 40, 32, 32, scale=0.2, causal=-1)
    graph, known = specialize(g, [tuple(v.type.shape) for v in g.inputs], {})
    (task,) = [t for t in tasks_of(graph, known) if "FusedAttention" in t.description]
    assert {"attention.mr", "attention.q_tiles", "attention.bk"} <= set(task.space)
    m = Measurer(repeats=2, min_seconds=0.001, featurize=featurize, clock="cpu")
    try:
        other = {**task.defaults, "attention.mr": 3, "attention.q_tiles": 2}
        base, cand, bad = (m.lower(task, d) for d in (task.defaults, other, {**task.defaults, "attention.bk": 5}))
        m.measure(task, [base])
        m.measure(task, [cand])
        assert base.seconds and cand.seconds and cand.error is None and cand.ratio is not None
        assert cand.features is not None and cand.features.shape == base.features.shape
        assert bad.error is not None and "attention.bk" in bad.error
    finally:
        m.close()
