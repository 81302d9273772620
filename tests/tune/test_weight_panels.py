"""A constant GEMM weight's panel width as a tuned decision (gemm.weight_nr, made by the
pack_weights pass per GEMM, kiln.tune.pass_tasks): random widths replay against the reference,
an illegal one is a KilnError naming it, planted records are applied, the tuner measures each."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import kiln
from kiln.compiler import run_stages
from kiln.errors import KilnError
from kiln.tune.records import Database
from kiln.tune.signature import signature
from kiln.tuning import tune_pass_decisions
from tests.tune.models import two_layers


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("KILN_TUNING_DB", raising=False)


MODEL = two_layers(m=8, k=40)      # two 40x40 GEMMs (one workload) and a 40x16 one


def panels(model, **kw) -> list:
    st_ = run_stages(model, "optimized", **kw)
    return [f for p in st_.optimized.stats for f in p.findings if type(f).__name__ == "PanelChoice"]


def packed_widths(model, **kw) -> list[int]:
    g = run_stages(model, "optimized", **kw).optimized.graph
    return [n.inputs[1].const.shape[2] for n in g.nodes if n.op == "MatMulPacked"]


FOUND = panels(MODEL)
KEYS = sorted({p.key for p in FOUND})


def feed():
    return np.random.default_rng(3).standard_normal((8, 40)).astype(np.float32)


def test_each_gemm_has_a_workload_key_and_the_rules_width():
    assert len(FOUND) == 3 and len(KEYS) == 2 and all(k.startswith("gemm:") for k in KEYS)
    assert all(p.value == p.options[0] and len(p.options) >= 4 and "rule" in p.reason for p in FOUND)
    assert sorted(packed_widths(MODEL)) == sorted(p.value for p in FOUND)


@settings(max_examples=5, deadline=None)
@given(st.tuples(st.sampled_from(FOUND[0].options), st.sampled_from(FOUND[2].options)))
def test_random_panel_widths_match_the_reference(widths):
    asked = {FOUND[0].key: widths[0], FOUND[2].key: widths[1]}
    decisions = {"@" + k: {"gemm.weight_nr": v} for k, v in asked.items()}
    got = {p.key: p.value for p in panels(MODEL, decisions=decisions)}
    assert got == asked
    assert sorted(packed_widths(MODEL, decisions=decisions)) == sorted(got[p.key] for p in FOUND)
    x = feed()
    want = kiln.compile(MODEL, target="interpreter").run(x=x)
    out = kiln.compile(MODEL, decisions=decisions).run(x=x)
    k = next(iter(want))
    np.testing.assert_allclose(out[k], want[k], rtol=1e-4, atol=1e-4)


def test_an_illegal_width_is_an_error_naming_it():
    bad = next(v for v in range(1, 300) if v not in FOUND[2].options)      # not whole vectors
    with pytest.raises(KilnError, match=rf"illegal value {bad} for decision 'gemm.weight_nr'.*GEMM"):
        kiln.compile(MODEL, decisions={"@" + FOUND[2].key: {"gemm.weight_nr": bad}})
    with pytest.raises(KilnError, match="gemm.weight_nr"):
        kiln.compile(MODEL, decisions={"gemm.weight_nr": 0})


def test_records_are_applied_and_the_tuner_measures_each_width(tmp_path):
    db = str(tmp_path / "t.db")
    key, rule, other = FOUND[0].key, FOUND[0].value, FOUND[0].options[1]     # the GEMM repeated twice
    with Database(db) as d:
        d.add(key, signature(), {"gemm.weight_nr": rule}, 1.0, is_default=True)
        d.add(key, signature(), {"gemm.weight_nr": other}, 0.5)
    m = kiln.compile(MODEL, tuning=db)
    x = feed()
    np.testing.assert_allclose(m.run(x=x)[next(iter(m.run(x=x)))], kiln.compile(MODEL).run(x=x)[next(iter(m.run(x=x)))],
                               rtol=1e-4, atol=1e-4)
    from kiln.targets.target import Target
    from kiln.tune.apply import with_pass_records
    applied = with_pass_records(db, {}, Target.host())
    assert applied["@" + key]["gemm.weight_nr"] == other
    assert sorted(packed_widths(MODEL, decisions=applied)).count(other) >= 2
    db2 = str(tmp_path / "t2.db")
    tasks = [t for t in tune_pass_decisions(MODEL, db2, 300, clock="cpu") if t.key.startswith("gemm:")]
    assert {t.key for t in tasks} == set(KEYS)
    assert all(not t.errors and set(t.seconds) == set(t.options) for t in tasks)
