"""A module is compiled once however many callers meet it at once, and never again once
cached: counted in C compiler processes (kiln.codegen.build.compiler_runs)."""

import threading
import time

import numpy as np
import pytest

import kiln
from kiln.codegen.build import compiler_runs
from kiln.timing import StageTimes, recording, stage
from tests.runtime.models import elementwise_model, inputs, reference


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("KILN_CACHE_DIR", str(d))
    return d


def _check(got, feeds):
    for name, want in reference(**feeds).items():
        np.testing.assert_allclose(got[name], want, rtol=1e-6, atol=1e-6)


def test_a_cached_model_runs_no_compiler():
    feeds = inputs(batch=3, seed=1)
    _check(kiln.compile(elementwise_model(3)).run(feeds), feeds)
    before = compiler_runs()
    _check(kiln.compile(elementwise_model(3)).run(feeds), feeds)
    assert compiler_runs() == before


@pytest.mark.parametrize("callers", [2, 4])
def test_threads_meeting_a_new_shape_at_once_compile_it_once(callers):
    model = kiln.compile(elementwise_model())        # symbolic batch: built per new batch size
    model.run(inputs(batch=3, seed=0))                # (the first build may also make kiln's pool)
    before = compiler_runs()
    model.run(inputs(batch=5, seed=0))                # what one build of a new batch size costs
    one_build = compiler_runs() - before
    assert one_build > 0

    start, results, errors = threading.Barrier(callers), {}, []

    def call(k):
        feeds = inputs(batch=11, seed=k)
        start.wait()
        try:
            results[k] = (model.run(feeds), feeds)
        except Exception as e:  # noqa: BLE001 (reported below, with the others)
            errors.append(e)

    before = compiler_runs()
    threads = [threading.Thread(target=call, args=(k,)) for k in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors
    assert compiler_runs() - before == one_build
    assert len(results) == callers
    for got, feeds in results.values():
        _check(got, feeds)


def test_stage_times_add_up_and_name_the_pipeline():
    times = StageTimes()
    t = time.perf_counter()
    with recording(times):
        with stage("outer"):
            with stage("inner"):
                sum(range(200_000))
    elapsed = time.perf_counter() - t
    assert set(times.wall) == {"outer", "inner"} and times.runs == {"outer": 1, "inner": 1}
    assert times.total_wall <= elapsed            # the inner stage's time is not counted twice

    model = kiln.compile(elementwise_model(4), report=True)
    got = model.report.stage_times
    for name in ("frontend", "optimize", "specialize", "cache key", "lower", "generate C", "cc", "load"):
        assert got.wall.get(name, 0) > 0, name
    assert "compile time per stage" in str(model.report)
    warm = kiln.compile(elementwise_model(4), report=True).report.stage_times
    assert "cc" not in warm.wall and "lower" not in warm.wall and warm.wall["load"] > 0


def test_the_libmvec_probe_runs_once_per_compiler_and_flags(cache, monkeypatch):
    """Its answer is kept in the cache dir: a new process asks the compiler nothing."""
    import kiln.codegen.toolchain as b
    started = []
    real = b.subprocess.run
    monkeypatch.setattr(b.subprocess, "run", lambda argv, **kw: started.append(argv) or real(argv, **kw))
    cc, flags = tuple(b._cc(None)), ("-O1", "-fopenmp", "-fPIC", "-shared")
    b._has_libmvec.cache_clear()
    first = b._has_libmvec(cc, flags)
    probes = [a for a in started if "-DKILN_MVEC" in a]
    assert len(probes) == 1
    b._has_libmvec.cache_clear()               # as in a new process
    assert b._has_libmvec(cc, flags) == first
    assert [a for a in started if "-DKILN_MVEC" in a] == probes
    for kept in (cache / "c").glob("libmvec-*"):
        kept.write_bytes(b"garbage")              # an unreadable answer is asked again
    b._has_libmvec.cache_clear()
    assert b._has_libmvec(cc, flags) == first
    assert len([a for a in started if "-DKILN_MVEC" in a]) == 2
    b._has_libmvec.cache_clear()
