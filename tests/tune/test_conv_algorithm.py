"""The conv algorithm as a tuned decision (kiln.lower.conv_algo per conv, kiln.tune.pass_tasks):
per-conv choices replay against the reference, an illegal one is a KilnError naming it, the
tuner measures the alternatives on the whole model and `kiln.compile(..., tuning=db)` applies
the best; untuned compiles are the rule's."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import kiln
from kiln.compiler import run_stages
from kiln.errors import KilnError
from kiln.lower.conv_algo import CONV_ALGORITHM
from kiln.tune.records import Database
from kiln.tune.signature import signature
from kiln.tuning import tune_pass_decisions
from tests.tune.models import conv_net


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("KILN_TUNING_DB", raising=False)
    monkeypatch.delenv("KILN_CONV_ALGO", raising=False)


def convs_of(model, **kw) -> dict:
    st_ = run_stages(model, "optimized", **kw)
    return {f.node: f for p in st_.optimized.stats for f in p.findings if type(f).__name__ == "ConvChoice"}


def feed(seed=1):
    return np.random.default_rng(seed).standard_normal((1, 32, 12, 12)).astype(np.float32)


MODEL = conv_net()
CONVS = convs_of(MODEL)


def test_each_conv_has_a_workload_key_and_its_options():
    assert len({c.key for c in CONVS.values()}) == 4
    assert all(c.key.startswith("conv:") and c.choice.algorithm in c.options for c in CONVS.values())
    assert CONVS["conv0"].options == ("winograd", "direct-nchwc", "direct-nchw")
    assert "winograd" not in CONVS["conv1"].options      # a 1x1 conv


@settings(max_examples=5, deadline=None)
@given(st.fixed_dictionaries({n: st.sampled_from(c.options + ("direct",)) for n, c in CONVS.items()}))
def test_random_per_conv_algorithms_match_the_reference(algos):
    decisions = {"@" + CONVS[n].key: {"conv.algorithm": a} for n, a in algos.items()}
    got = convs_of(MODEL, decisions=decisions)
    for n, a in algos.items():     # each conv runs what was asked of it ("direct": the rule's direct)
        assert got[n].choice.algorithm == a if a != "direct" else got[n].choice.algorithm.startswith("direct")
    x = feed()
    want = kiln.compile(MODEL, target="interpreter").run(x=x)
    out = kiln.compile(MODEL, decisions=decisions).run(x=x)
    np.testing.assert_allclose(out[next(iter(out))], want[next(iter(want))], rtol=1e-3, atol=1e-4)


def test_an_illegal_per_conv_algorithm_is_an_error_naming_it():
    key = CONVS["conv1"].key        # 1x1: no Winograd
    with pytest.raises(KilnError, match=r"illegal value 'winograd' for decision 'conv.algorithm' in conv 'conv1'.*3x3"):
        kiln.compile(MODEL, decisions={"@" + key: {"conv.algorithm": "winograd"}})
    with pytest.raises(KilnError, match="conv.algorithm"):
        kiln.compile(MODEL, decisions={"@" + key: {"conv.algorithm": "fft"}})


def test_untuned_choices_are_the_rules():
    assert {n: c.choice.algorithm for n, c in convs_of(MODEL).items()} == \
        {"conv0": "winograd", "conv1": "direct-nchwc", "conv2": "direct-nchwc", "conv3": "direct-nchwc"}
    assert CONV_ALGORITHM.default(None) == "direct"


def planted(db: str, key: str, default: str, faster: str, gain: float) -> None:
    with Database(db) as d:
        sig = signature()
        d.add(key, sig, {"conv.algorithm": default}, 1.0, is_default=True)
        d.add(key, sig, {"conv.algorithm": faster}, 1.0 - gain)


def test_records_are_applied_by_compile(tmp_path):
    db = str(tmp_path / "t.db")
    planted(db, CONVS["conv0"].key, "winograd", "direct-nchw", 0.2)       # applied
    planted(db, CONVS["conv1"].key, "direct-nchwc", "direct-nchw", 0.01)  # within MIN_GAIN: not
    m = kiln.compile(MODEL, tuning=db, report=True)
    algos = {c.node: c.choice for c in m.report.convs}
    assert algos["conv0"].algorithm == "direct-nchw" and "tuning record" in algos["conv0"].reason
    assert algos["conv1"].algorithm == "direct-nchwc"
    x = feed()
    np.testing.assert_allclose(m.run(x=x)["y3"], kiln.compile(MODEL).run(x=x)["y3"], rtol=1e-3, atol=1e-4)
    # asked by hand wins over the record
    hand = kiln.compile(MODEL, tuning=db, report=True,
                        decisions={"@" + CONVS["conv0"].key: {"conv.algorithm": "direct-nchwc"}})
    assert {c.node: c.choice.algorithm for c in hand.report.convs}["conv0"] == "direct-nchwc"


def test_a_stale_record_warns_and_builds_the_rule(tmp_path):
    db = str(tmp_path / "t.db")
    planted(db, CONVS["conv1"].key, "direct-nchwc", "winograd", 0.5)      # a 1x1 conv cannot
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        m = kiln.compile(MODEL, tuning=db, report=True)
    assert any("not applied" in str(x.message) and "conv1" in str(x.message) for x in w)
    assert {c.node: c.choice.algorithm for c in m.report.convs}["conv1"] == "direct-nchwc"


def test_the_tuner_measures_every_alternative_and_compile_applies_the_best(tmp_path):
    db = str(tmp_path / "t.db")
    tasks = [t for t in tune_pass_decisions(MODEL, db, 300, clock="cpu") if t.key.startswith("conv:")]
    assert {t.key for t in tasks} == {c.key for c in CONVS.values()}
    sig = signature(clock="cpu")
    with Database(db) as d:
        for t in tasks:
            assert not t.errors and set(t.seconds) == set(t.options)
            recs = d.records(t.key, sig)
            assert {r.decisions["conv.algorithm"] for r in recs} == set(t.options)
            best = d.best(t.key, sig)
            want = t.default if best.is_default else best.decisions["conv.algorithm"]
            got = {c.node: c.choice.algorithm for c in kiln.compile(MODEL, tuning=db, report=True).report.convs}
            assert got[next(n for n, c in CONVS.items() if c.key == t.key)] == want
    # resumed: nothing measured again
    again = [t for t in tune_pass_decisions(MODEL, db, 300, clock="cpu") if t.key.startswith("conv:")]
    assert all(not t.seconds for t in again)
