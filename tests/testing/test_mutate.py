"""The mutation fuzzer (kiln.testing.mutate) and its sandbox: a fixed-seed budget in the fast suite.

The budget is small (150 mutated models, two sandboxes, one worker process per 50 cases);
`kiln fuzz-mutate --hours N --corpus all` is the long mode.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from kiln.errors import KilnError
from kiln.testing import mutate, mutate_inputs, mutate_seeds
from kiln.testing.sandbox import Sandbox


def probe(case):
    """A sandbox worker that does what the case says (for the sandbox's own tests)."""
    what = case["do"]
    if what == "ok":
        return
    if what == "kiln":
        raise KilnError("refused cleanly")
    if what == "value":
        raise ValueError("a bug")
    if what == "abort":
        os.abort()
    if what == "sleep":
        time.sleep(60)
    if what == "alloc":  # 8 GiB under a 1 GiB RLIMIT_AS: MemoryError, an exception kiln should wrap
        np.ones(1 << 31, np.float32)


def test_sandbox_classifies_every_outcome():
    cases = [{"do": d} for d in ("ok", "kiln", "value", "abort", "ok", "sleep", "alloc", "kiln")]
    box = Sandbox("tests.testing.test_mutate:probe", timeout_s=2, memory_bytes=1 << 30, jobs=1, batch=8)
    out = box.run(cases)
    assert [o.index for o in out] == list(range(len(cases)))
    assert [o.kind for o in out] == ["ok", "kiln_error", "exception", "crash", "ok", "hang", "exception",
                                     "kiln_error"]
    assert "SIGABRT" in out[3].detail and "ValueError: a bug" in out[2].detail
    assert "MemoryError" in out[6].detail
    assert [o.failed for o in out] == [False, False, True, True, False, True, True, False]


def test_mutations_are_deterministic_and_change_the_model():
    seeds = mutate_seeds.builtin_seeds()
    a = mutate.model_cases(30, seed=5)
    b = mutate.model_cases(30, seed=5)
    assert [c["model"] for c in a] == [c["model"] for c in b]
    originals = {s.model.SerializeToString() for s in seeds}
    changed = sum(c["model"] not in originals for c in a)
    assert changed >= 20  # (feed-only mutations keep the model)
    assert all(c["mutations"] for c in a)


def test_fixed_budget_of_mutated_models(tmp_path):
    rep = mutate.run_campaign(models=150, seed=0, jobs=2, timeout_s=120, out=tmp_path)
    assert rep.total("model") == 150
    assert rep.counts[("model", "ok")] > 10 and rep.counts[("model", "kiln_error")] > 10
    assert not rep.failures, str(rep)


def test_generated_corpus_mutates_the_differential_fuzzers_graphs():
    seeds = mutate_seeds.generated_seeds(3)
    assert len(seeds) == 3 and all(s.model.graph.node and s.feeds for s in seeds)
    data, feeds, done = mutate_inputs.mutate_model(seeds[0], np.random.default_rng(0))
    assert data and done


def test_fixed_budget_of_mutated_artifacts(tmp_path):
    rep = mutate.run_campaign(models=0, artifacts=40, seed=0, jobs=2, timeout_s=120, out=tmp_path,
                              artifact_bases=("relu_add", "gather"))
    assert rep.total("artifact") == 40
    assert not rep.failures, str(rep)


def test_artifact_mutations_change_the_file(tmp_path):
    cases = mutate.artifact_cases(20, 1, tmp_path, bases=("relu_add",))
    base = (tmp_path / "seed_relu_add.kiln").read_bytes()
    assert all(open(c["path"], "rb").read() != base for c in cases)
