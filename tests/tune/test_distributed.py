"""Measurement on Ray: a local Ray instance started by the test; a Ray worker that dies
loses only its own job."""

from __future__ import annotations

import pytest

from kiln.tune.features import featurize
from kiln.tuning import extract_tasks
from tests.tune.models import matmul

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_measures_candidates_and_a_dead_worker_loses_only_its_job(local_ray, tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    from kiln.tune.distributed import RayMeasurer
    (task,) = extract_tasks(matmul(32, 64, 48))
    m = RayMeasurer("local", timeout=60, repeats=2, min_seconds=0.001, featurize=featurize)
    try:
        other = {**task.defaults, "gemm.s_outer": not task.defaults["gemm.s_outer"]}
        (default,) = m.measure(task, [m.lower(task, task.defaults)])
        assert default.seconds is not None, default.error
        a, b = m.lower(task, other), m.lower(task, {**other, "gemm.mr": 1})
        jobs = [m.job(task, a), {**m.job(task, a), "kill_ray_worker": True}, m.job(task, b)]
        answers = m.run_jobs([a.func, a.func, b.func], jobs)
        assert "times" in answers[0] and "times" in answers[2]
        assert "Ray worker failed" in answers[1]["error"]
    finally:
        m.close()
