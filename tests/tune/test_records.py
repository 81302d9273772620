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


def _run_processes(target, arg_lists):
    """Run `target` in one spawned process per argument tuple at once; each must exit cleanly."""
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=target, args=args) for args in arg_lists]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0


def test_concurrent_writers_lose_nothing(tmp_path):
    path = str(tmp_path / "t.db")
    Database(path).close()
    _run_processes(_writer, [(path, k, 40) for k in range(4)])
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


def test_only_records_of_this_kernel_code_are_applied(tmp_path):
    """A record measured on other kernel code (kiln.tune.version) is not the best, however
    fast: the code behind its decisions may have changed since; it is still a record (the
    tuner seeds a search with it) and `stale` counts it."""
    from kiln.tune.version import code_version, stale_reason  # noqa: PLC0415
    with Database(tmp_path / "t.db") as db:
        assert db.version == code_version()
        db.add("w", "s", {"x": 0}, 1.0, is_default=True)
        db.add("w", "s", {"x": 1}, 0.1, version="0123456789abcdef")   # stale: much faster, never best
        db.add("w", "s", {"x": 0}, 0.2, is_default=True, version="0123456789abcdef")
        assert db.best("w", "s").decisions == {"x": 0} and db.default_seconds("w", "s") == 1.0
        assert [r.decisions for r, _ in db.ranking("w", "s", 9)] == [{"x": 0}]
        assert db.stale("w", "s") == {"0123456789abcdef": 2} and db.stale("w", "other") == {}
        assert [r.version for r in db.records("w", "s", current=False)] == ["0123456789abcdef"] * 2
        assert len(db.records("w", "s", current=True)) == 1 and len(db.records("w")) == 3
        db.add("w", "s", {"x": 2}, 0.5)                                 # same version: applied
        assert db.best("w", "s").decisions == {"x": 2}
        db.add("p:1", "s", {"a": 1}, 1.0, version="0123456789abcdef")
        assert db.workloads("p:", "s") == [] and db.workloads("p:", "s", current=False) == ["p:1"]
    with Database(tmp_path / "t.db", version="0123456789abcdef") as db:   # that older kiln's view
        assert db.best("w", "s").decisions == {"x": 1}
    assert "0123456789abcdef" in stale_reason("0123456789abcdef") and "before" in stale_reason(None)


def test_a_database_from_before_versions_opens_and_its_records_are_stale(tmp_path):
    import sqlite3  # noqa: PLC0415
    path = tmp_path / "old.db"
    old_schema = """
    CREATE TABLE machines (signature TEXT PRIMARY KEY, info TEXT NOT NULL);
    CREATE TABLE workloads (workload TEXT PRIMARY KEY, description TEXT NOT NULL);
    CREATE TABLE records (id INTEGER PRIMARY KEY AUTOINCREMENT, workload TEXT NOT NULL, signature TEXT NOT NULL,
        decisions TEXT NOT NULL, seconds REAL, error TEXT, is_default INTEGER NOT NULL DEFAULT 0, created REAL NOT NULL);
    CREATE INDEX records_by_task ON records (workload, signature);
    INSERT INTO records (workload, signature, decisions, seconds, is_default, created) VALUES
        ('w', 's', '{"x": 0}', 1.0, 1, 0), ('w', 's', '{"x": 1}', 0.5, 0, 0);
    """
    with sqlite3.connect(path) as c:
        c.executescript(old_schema)
    with Database(path) as db:
        assert db.best("w", "s") is None and db.stale("w", "s") == {None: 2}
        assert [r.version for r in db.records("w")] == [None, None]
        db.add("w", "s", {"x": 0}, 2.0, is_default=True)
        assert db.best("w", "s").seconds == 2.0
    with Database(path) as db:     # opened again: already migrated
        assert len(db.records("w")) == 3


def test_compile_skips_stale_records_with_a_warning(tmp_path):
    model = matmul(40, 64, 72)
    (task,) = extract_tasks(model)
    other = {**task.defaults, "gemm.mr": 3 if task.defaults["gemm.mr"] != 3 else 2}
    path = str(tmp_path / "t.db")
    with Database(path) as db:
        db.add(task.key, signature(), task.defaults, 1.0, is_default=True, version="0123456789abcdef")
        db.add(task.key, signature(), other, 0.5, version="0123456789abcdef")
    graph, known = specialized_graph(model)
    with pytest.warns(UserWarning, match="2 tuning records .* not applied: 2 measured on other kernel code"):
        assert with_records(path, graph, known, {}) == {}


def _migrate_and_write(path, k):
    with Database(path) as db:
        db.add("w", "sig", {"k": k}, float(k + 1))


def test_concurrent_openers_migrate_an_old_database_once(tmp_path):
    import sqlite3  # noqa: PLC0415
    path = str(tmp_path / "old.db")
    with sqlite3.connect(path) as c:
        c.execute("CREATE TABLE records (id INTEGER PRIMARY KEY AUTOINCREMENT, workload TEXT NOT NULL, "
                  "signature TEXT NOT NULL, decisions TEXT NOT NULL, seconds REAL, error TEXT, "
                  "is_default INTEGER NOT NULL DEFAULT 0, created REAL NOT NULL)")
    _run_processes(_migrate_and_write, [(path, k) for k in range(4)])
    with Database(path) as db:
        assert db.count() == 4 and db.best("w", "sig").decisions == {"k": 0}


def test_the_code_version_follows_code_making_sources_only(tmp_path):
    from kiln.tune.version import code_version, source_version  # noqa: PLC0415
    root = tmp_path / "kiln"
    for rel in ("lower/gemm.py", "codegen/c_src/kiln_pool.h", "frontends/onnx.py", "tune/search.py", "errors.py"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"# {rel}\n")
    v = source_version(root)
    assert len(v) == 16 and v == source_version(root) and code_version() == code_version()
    (root / "frontends/onnx.py").write_text("# changed\n")          # before the workload key
    (root / "tune/search.py").write_text("# changed\n")
    (root / "lower/__pycache__").mkdir()
    (root / "lower/__pycache__/gemm.cpython-312.pyc").write_bytes(b"\0")
    assert source_version(root) == v
    for rel in ("codegen/c_src/kiln_pool.h", "lower/gemm.py", "errors.py"):
        before = source_version(root)
        (root / rel).write_text("# changed\n")
        assert source_version(root) != before, rel
    before = source_version(root)
    (root / "lower/new.py").write_text("")
    assert source_version(root) != before


class _FixedClock:
    """A measurer that times every candidate at 1 s without building it (the tuner's bookkeeping only)."""
    clock = "cpu"

    def lower(self, task, decisions):
        from kiln.tune.measure import Result  # noqa: PLC0415
        return Result(dict(decisions))

    def measure(self, task, results):
        for r in results:
            r.seconds = 1.0
        return results

    def close(self):
        pass


def test_the_tuner_seeds_with_stale_records_and_counts_them(tmp_path):
    """A stale record of this machine is neither the task's baseline nor a measured point of
    its search (the default is measured again on this code); it seeds the search and the report
    counts it as skipped."""
    from kiln.tune.tuner import Tuner, TuneReport  # noqa: PLC0415
    (task,) = extract_tasks(matmul(40, 64, 72))
    tuner = Tuner(str(tmp_path / "t.db"), measurer=_FixedClock())
    try:
        space = tuner.space(task)
        name = next(k for k, v in space.items() if len(v) > 1)
        other = {**task.defaults, name: space[name][1]}
        tuner.db.add(task.key, tuner.sig, task.defaults, 0.001, is_default=True, version="0123456789abcdef")
        tuner.db.add(task.key, tuner.sig, other, 0.0005, version="0123456789abcdef")
        st = tuner.start(task)
        assert st.default_s == 1.0 and st.best_s == 1.0
        assert st.stale_records == {"0123456789abcdef": 2}
        assert {k: v for k, v in other.items() if k in space} in st.search.seeds
        rep = TuneReport([st], tuner.sig, 0.0)
        assert rep.stale_records == {"0123456789abcdef": 2}
    finally:
        tuner.close()
