"""Replaying a task's schedule with random decisions gives another valid kernel: checked
against the NumPy reference on fresh random inputs (hypothesis draws the decisions)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kiln import KilnError
from kiln.codegen import build_c
from kiln.tune.space import lower_with
from kiln.tune.tasks import random_inputs
from kiln.tuning import extract_tasks
from tests.tune.models import matmul, two_layers


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))


def _run(task, decisions, seed):
    kernel = lower_with(task.ctx, decisions)
    arrays = random_inputs(kernel.func, task.inputs, seed)
    build_c(kernel.func)(*arrays)
    return arrays


def _check_matmul(model, ref, decisions_of, seed):
    (task,) = extract_tasks(model)
    assert {"gemm.mr", "gemm.swap", "parallel_min_work"} <= set(task.space)
    d = decisions_of(task.space)
    a, b, y = _run(task, d, seed)
    np.testing.assert_allclose(y, ref(a, b), rtol=1e-4, atol=1e-4, err_msg=str(d))


def _pick(data):
    return lambda space: {k: data.draw(st.sampled_from(v), label=k) for k, v in space.items()}


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data(), seed=st.integers(0, 2**16))
def test_random_decisions_of_a_matmul_match_the_reference(data, seed):
    _check_matmul(matmul(37, 70, 53), lambda a, b: a @ b, _pick(data), seed)


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data(), seed=st.integers(0, 2**16), trans_b=st.booleans(),
       dims=st.tuples(st.integers(1, 70), st.integers(1, 70), st.integers(1, 70)))
def test_random_decisions_of_many_gemms_match_the_reference(data, seed, trans_b, dims):
    m, k, n = dims
    model = matmul(m, k, n, trans_b=trans_b)
    try:
        (task,) = extract_tasks(model)
    except ValueError:
        return   # a product too small to have decisions (no task)
    d = _pick(data)(task.space)
    a, b, y = _run(task, d, seed)
    np.testing.assert_allclose(y, a @ (b.T if trans_b else b), rtol=1e-4, atol=1e-4, err_msg=str(d))


def test_the_default_decisions_replay_to_the_same_kernel():
    (task,) = extract_tasks(matmul())
    assert str(lower_with(task.ctx, task.defaults).func) == str(lower_with(task.ctx, None).func)


def test_an_illegal_decision_is_a_kiln_error_naming_it():
    (task,) = extract_tasks(matmul())
    with pytest.raises(KilnError, match="illegal value 0 for decision 'gemm.mr'"):
        lower_with(task.ctx, {"gemm.mr": 0})


def test_repeated_layers_are_one_weighted_task():
    tasks = extract_tasks(two_layers())
    assert sorted(t.weight for t in tasks) == [1, 2]
    assert len({t.key for t in tasks}) == 2
