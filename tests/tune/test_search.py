"""The evolutionary search finds a planted best configuration of a synthetic space, far
sooner than trying the space; the cost model and Kendall's tau behave."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from kiln.tune.costmodel import CostModel, backend, kendall_tau
from kiln.tune.search import Search

try:
    backend()
    HAVE_MODEL = True
except Exception:  # noqa: BLE001
    HAVE_MODEL = False
needs_model = pytest.mark.skipif(not HAVE_MODEL, reason="no gradient-boosting library (pip install 'kiln[tune]')")

SPACE = {f"k{i}": list(range(8)) for i in range(4)}    # 4096 configurations


def planted(seed):
    """A time per configuration: smooth penalties around a hidden optimum, plus noise."""
    r = random.Random(seed)
    best = {k: r.randrange(8) for k in SPACE}
    w = {k: r.uniform(0.5, 2.0) for k in SPACE}

    def seconds(d):
        return 1.0 + sum(w[k] * abs(d[k] - best[k]) ** 1.5 for k in SPACE) * (1 + 0.02 * r.random())
    return best, seconds


def onehot(d):
    return np.array([float(d[k] == v) for k in SPACE for v in SPACE[k]] + [float(d[k]) for k in SPACE])


@needs_model
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_search_finds_a_planted_best_configuration(seed):
    best, seconds = planted(seed)
    model = CostModel(seed=seed)
    s = Search(SPACE, onehot, model, seed=seed)
    X, y = [], []
    for _ in range(24):                       # at most 192 of 4096 measured
        for d in s.propose(8, n_random=2):
            t = seconds(d)
            s.tell(d, t)
            X.append(onehot(d))
            y.append(-np.log(t))
        model.fit(np.stack(X), np.array(y))
        if s.best()[0] == best:
            break
    assert s.best()[0] == best, (s.best(), best)
    assert len(s.measured) <= 192


@needs_model
def test_the_model_ranks_held_out_configurations():
    best, seconds = planted(5)
    rng = random.Random(5)
    configs = [dict(zip(SPACE, c)) for c in itertools.product(*SPACE.values())]
    rng.shuffle(configs)
    train, test = configs[:300], configs[300:400]
    m = CostModel(seed=0)
    m.fit(np.stack([onehot(d) for d in train]), np.array([-np.log(seconds(d)) for d in train]))
    tau = kendall_tau(m.predict(np.stack([onehot(d) for d in test])), [-seconds(d) for d in test])
    assert tau > 0.6


def test_kendall_tau():
    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    scipy = pytest.importorskip("scipy.stats")
    a, b = np.random.default_rng(0).random((2, 30))
    assert kendall_tau(a, b) == pytest.approx(scipy.kendalltau(a, b)[0])


def test_propose_never_repeats_a_measured_configuration_and_exhausts_small_spaces():
    s = Search({"a": [0, 1], "b": [0, 1, 2]}, onehot, None, seed=0)
    seen = set()
    while not s.exhausted():
        batch = s.propose(4, n_random=4)
        assert batch
        for d in batch:
            k = tuple(sorted(d.items()))
            assert k not in seen
            seen.add(k)
            s.tell(d, 1.0)
    assert len(seen) == 6
    assert s.propose(4) == []


def test_seeds_from_other_machines_start_the_search():
    s = Search(SPACE, onehot, None, seed=0, seeds=[{"k0": 7, "k1": 7, "k2": 7, "k3": 7}])
    batch = s.propose(20, n_random=0)
    close = [d for d in batch if sum(v == 7 for v in d.values()) >= 2]
    assert close   # children of the seed


def test_a_value_the_kernel_refuses_leaves_the_space():
    """Lowering's "illegal value V for decision 'D'" removes V from the task's space (never the
    default, which was measured), so no more trials go to it."""
    from kiln.tune.tuner import TaskState, Tuner  # noqa: PLC0415
    st = TaskState(task=None, search=Search({"nchwc.oc_v": [4, 1, 2, 3], "d": [True, False]}, lambda d: None, None))
    Tuner._prune(st, "lowering: [schedule] illegal value 3 for decision 'nchwc.oc_v' in kernel 'k3_Relu': it "
                     "must divide the 4 channel blocks")
    Tuner._prune(st, "lowering: [schedule] illegal value 4 for decision 'nchwc.oc_v' in kernel 'k3': ...")
    Tuner._prune(st, "illegal value False for decision 'd': ...")
    Tuner._prune(st, "build: something else")
    assert st.search.space == {"nchwc.oc_v": [4, 1, 2], "d": [True]}
    assert all(c["nchwc.oc_v"] != 3 for c in st.search.propose(6, 6))
