"""`kiln tune` end to end on a small model: records written, resumed after an interrupt,
applied by kiln.compile; the CLI's table."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest

import kiln
from kiln.cli import main
from kiln.tune.records import Database
from kiln.tune.signature import signature
from kiln.tuning import tune_model as tune
from tests.tune.models import two_layers

try:
    from kiln.tune.costmodel import backend
    backend()
except Exception:  # noqa: BLE001
    pytest.skip("no gradient-boosting library (pip install 'kiln[tune]')", allow_module_level=True)


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("KILN_TUNING_DB", raising=False)


def test_tune_interrupt_resume_and_apply(tmp_path):
    model, db = two_layers(), str(tmp_path / "t.db")
    calls = []

    def interrupt_after_two_rounds(rep, elapsed):
        calls.append(len(rep.taus))
        if len(rep.taus) >= 2:
            raise KeyboardInterrupt

    rep = tune(model, db, 600, trials_per_round=3, on_progress=interrupt_after_two_rounds)
    assert rep.interrupted and len(rep.tasks) == 2
    with Database(db) as d:
        first = d.count(signature())
    assert first >= 2 + 2 * 3 - 3   # two defaults, two rounds (a candidate may fail)
    # resumed: defaults are not measured again, the records are known to the search
    rep2 = tune(model, db, 8, trials_per_round=3, end_to_end=True)
    assert not rep2.interrupted
    with Database(db) as d:
        assert d.count(signature()) > first
        # the defaults: measured when a task starts without records (twice), then once per round
        # (the baseline, again) and per recheck of the leaders, and not at the start of the resumed run
        defaults = sum(r.is_default for t in rep2.tasks for r in d.records(t.task.key, signature()))
        assert defaults == 2 + len(rep.taus) + len(rep2.taus) + sum(s.rechecks for s in rep2.tasks)
        # the best that kiln.compile applies was measured twice, or is the default (Tuner.confirm)
        for s in rep2.tasks:
            lead, n = d.ranking(s.task.key, signature())[0]
            assert s.confirmed and (lead.is_default or n >= 2)
            best = d.best(s.task.key, signature())   # the lead, unless it beats the default by < MIN_GAIN
            assert (s.best, s.best_s) == ((None, s.default_s) if best.is_default else (best.decisions, best.seconds))
    assert all(len(s.search.measured) >= 1 for s in rep2.tasks)
    e = rep2.end_to_end
    assert e["outputs_match"] and e["untuned"] > 0 and e["tuned"] > 0
    x = np.random.default_rng(0).standard_normal((32, 64)).astype(np.float32)
    want = kiln.compile(model, target="interpreter").run({"x": x})
    got = kiln.compile(model, tuning=db).run({"x": x})
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-4)


def test_cli_tune_prints_the_table(tmp_path, capsys):
    from kiln.tune.pass_tasks import pass_tasks  # noqa: PLC0415
    from kiln.tuning import extract_tasks, specialized_graph  # noqa: PLC0415
    path = tmp_path / "m.onnx"
    onnx.save(two_layers(), str(path))
    found: list = []
    specialized_graph(two_layers(), None, findings=found)
    with Database(tmp_path / "t.db") as d:   # records of an older kiln: skipped, and the table says so
        # (the pass tasks' too: they run first, and the panel width they pick changes the kernels' keys)
        for t in pass_tasks(found):
            d.add(t.key, signature(), {t.decision: t.default}, 1e-6, is_default=True, version="0123456789abcdef")
        for t in extract_tasks(two_layers()):
            d.add(t.key, signature(), t.defaults, 1e-6, is_default=True, version="0123456789abcdef")
    with pytest.raises(SystemExit) as e, pytest.warns(UserWarning, match="graph pass decisions .* not applied"):
        main(["tune", str(path), "--budget", "5s", "--db", str(tmp_path / "t.db"), "--trials-per-round", "2",
              "--no-end-to-end"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    # (2 tasks; under load the 5 s can run out after starting the first: tune stops starting tasks)
    assert re.search(r"kiln tune: [12] tasks", out) and "Kendall tau" in out and "MatMul" in out
    assert re.search(r"[1-4] records skipped as stale", out) and "measured on other kernel code" in out


def test_cli_rejects_a_bad_budget(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["tune", "x.onnx", "--budget", "soon"])
    assert e.value.code == 2


def test_tune_on_one_thread_by_cpu_time(tmp_path):
    """--clock cpu: records under the "-cpu1" signature, the thread decisions untouched, the end-to-end
    check on one thread in a child process; kiln.compile applies them where no wall record exists."""
    from kiln.tune.measure import THREAD_DECISIONS  # noqa: PLC0415
    model, db = two_layers(), str(tmp_path / "t.db")
    rep = tune(model, db, 6, trials_per_round=2, clock="cpu", end_to_end=True)
    e = rep.end_to_end
    assert e["clock"] == "cpu" and e["outputs_match"] and e["untuned"] > 0
    with Database(db) as d:
        assert d.count(signature()) == 0 and d.count(signature(clock="cpu")) > 0
        for s in rep.tasks:
            for r in d.records(s.task.key, signature(clock="cpu")):
                assert all(r.decisions[k] == s.task.defaults[k] for k in THREAD_DECISIONS & set(r.decisions))
    x = np.random.default_rng(1).standard_normal((32, 64)).astype(np.float32)
    want = kiln.compile(model, target="interpreter").run({"x": x})
    got = kiln.compile(model, tuning=db).run({"x": x})
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-4)
