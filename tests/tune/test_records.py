"""The records database: persistence (resume), machine signatures, concurrent writers, and
kiln.compile(tuning=...) applying only this machine's best record."""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest

import kiln
from kiln import KilnError
from kiln.tune.apply import with_records
from kiln.tune.records import Database
from kiln.tune.signature import machine, signature
from kiln.tuning import extract_tasks, specialized_graph
from tests.tune.models import matmul


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("KILN_TUNING_DB", raising=False)


def test_records_persist_and_the_best_is_per_signature(tmp_path):
    path = tmp_path / "t.db"
    with Database(path) as db:
        db.add("w", "sigA", {"x": 1}, 2.0, is_default=True)
        db.add("w", "sigA", {"x": 2}, 1.0)
        db.add("w", "sigA", {"x": 3}, None, error="crashed")
        db.add("w", "sigB", {"x": 4}, 0.1)
    with Database(path) as db:   # a new process would see the same: resume reads these
        assert db.best("w", "sigA").decisions == {"x": 2}
        assert db.best("w", "sigB").decisions == {"x": 4}
        assert db.best("w", "sigC") is None
        assert db.default_seconds("w", "sigA") == 2.0
        assert [r.ok for r in db.records("w", "sigA")] == [True, True, False]
        assert len(db.records("w")) == 4
        with pytest.raises(KilnError, match="either a time or an error"):
            db.add("w", "sigA", {}, None)


def _writer(path, k, n):
    with Database(path) as db:
        for i in range(n):
            db.add(f"w{k}", "sig", {"i": i}, float(i + 1))


def test_concurrent_writers_lose_nothing(tmp_path):
    path = str(tmp_path / "t.db")
    Database(path).close()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, k, 40)) for k in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    with Database(path) as db:
        assert db.count() == 160
        assert all(db.best(f"w{k}", "sig").seconds == 1.0 for k in range(4))


def test_the_signature_names_this_machine():
    m = machine()
    assert m["cores"] >= 1 and "features=" in m["target"] and m["compiler"]
    assert signature() == signature(m) and signature({**m, "cores": m["cores"] + 1}) != signature()


def test_compile_applies_this_machines_best_record_only(tmp_path, monkeypatch):
    model = matmul(40, 64, 72)
    (task,) = extract_tasks(model)
    other = {**task.defaults, "gemm.mr": 3 if task.defaults["gemm.mr"] != 3 else 2}
    path = str(tmp_path / "t.db")
    with Database(path) as db:
        db.add(task.key, signature(), task.defaults, 1.0, is_default=True)
        db.add(task.key, "another-machine", {**other, "gemm.mr": 1}, 0.001)   # never applied here
    graph, known = specialized_graph(model)
    assert with_records(path, graph, known, {}) == {}      # only the default: nothing to apply
    with Database(path) as db:
        rec = db.add(task.key, signature(), other, 0.5)
    assert with_records(path, graph, known, {}) == {"@" + task.key: {**other, "#record": rec}}

    rng = np.random.default_rng(3)
    feeds = {"a": rng.standard_normal((40, 64)).astype(np.float32),
             "b": rng.standard_normal((64, 72)).astype(np.float32)}
    for tuning in (path, None):
        if tuning is None:
            monkeypatch.setenv("KILN_TUNING_DB", path)
        m = kiln.compile(model, tuning=tuning)
        np.testing.assert_allclose(m.run(feeds)["y"], feeds["a"] @ feeds["b"], rtol=1e-4, atol=1e-4)
        (decisions,) = m.build_info()["decisions"].values()
        assert decisions["#record"] == rec and decisions["gemm.mr"] == other["gemm.mr"]
    from kiln.export import save  # noqa: PLC0415
    from kiln.runtime.artifact import load, read_manifest  # noqa: PLC0415
    save(m, tmp_path / "m.kiln")
    assert list(read_manifest(tmp_path / "m.kiln")["tuning_records"].values()) == [rec]
    np.testing.assert_allclose(load(tmp_path / "m.kiln").run(feeds)["y"], feeds["a"] @ feeds["b"],
                               rtol=1e-4, atol=1e-4)
    untuned = kiln.compile(model, tuning="")
    untuned.run(feeds)
    (decisions,) = untuned.build_info()["decisions"].values()
    assert "#record" not in decisions and decisions["gemm.mr"] == task.defaults["gemm.mr"]


def test_a_missing_database_is_an_error(tmp_path):
    with pytest.raises(KilnError, match="does not exist"):
        kiln.compile(matmul(), tuning=str(tmp_path / "nope.db"))


def test_one_lucky_measurement_is_not_the_best(tmp_path):
    """A candidate scores its slowest measurement, the default its fastest: a time that was
    fast by luck and slow when measured again does not stay the best (Tuner.confirm)."""
    with Database(tmp_path / "t.db") as db:
        db.add("w", "s", {"x": 0}, 2.0, is_default=True)
        db.add("w", "s", {"x": 0}, 3.0, is_default=True)
        db.add("w", "s", {"x": 1}, 1.0)      # lucky
        db.add("w", "s", {"x": 2}, 1.5)
        assert db.best("w", "s").decisions == {"x": 1}
        db.add("w", "s", {"x": 1}, 2.5)      # measured again: slower than the default
        (r1, n1), (r2, n2), (r3, n3) = db.ranking("w", "s", 3)
        assert (r1.decisions, r1.seconds, n1) == ({"x": 2}, 1.5, 1)
        assert (r2.decisions, r2.seconds, n2, r2.is_default) == ({"x": 0}, 2.0, 2, True)
        assert (r3.decisions, r3.seconds, n3) == ({"x": 1}, 2.5, 2)


def test_a_configuration_must_beat_the_default_by_a_margin(tmp_path):
    """Less than MIN_GAIN faster than the default is within what a kernel timed alone mispredicts
    in the model: the default stays the best."""
    from kiln.tune.records import MIN_GAIN  # noqa: PLC0415
    with Database(tmp_path / "t.db") as db:
        db.add("w", "s", {"x": 0}, 1.0, is_default=True)
        db.add("w", "s", {"x": 1}, 1.0 - MIN_GAIN / 2)
        db.add("w", "s", {"x": 1}, 1.0 - MIN_GAIN / 2)
        assert db.best("w", "s").is_default
        assert db.best("w", "s", min_gain=0).decisions == {"x": 1}
        db.add("w", "s", {"x": 2}, 1.0 - 2 * MIN_GAIN)
        assert db.best("w", "s").decisions == {"x": 2}
