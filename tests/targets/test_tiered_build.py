"""Tiered builds (kiln.codegen.tiers, kiln.targets.tiered): a module returned at its quick tier
(-Og), its -O3 build made in the background, swapped in between runs, and the only one cached.
The suite's compiles are "full" (tests/conftest.py); these ask for tier="auto" and lower the
size a module needs to be tiered, so a small model is."""

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import kiln
from kiln.codegen import build as c_build
from kiln.codegen import tiers
from kiln.errors import KilnError
from kiln.targets import tiered
from tests.runtime.models import elementwise_model, inputs, reference

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("KILN_CACHE_DIR", str(d))
    monkeypatch.delenv("KILN_TIER", raising=False)
    monkeypatch.setattr(tiers, "MIN_SECONDS", 0.0)   # every module pays for a quick tier
    return d


@pytest.fixture
def gate(monkeypatch):
    """The background builds wait until the test opens the gate (set it)."""
    opened, started = threading.Event(), []
    build = tiered.TieredModule._build

    def held(self, finish, stack):
        started.append(self)
        opened.wait(60)
        build(self, finish, stack)
    monkeypatch.setattr(tiered.TieredModule, "_build", held)
    yield opened
    opened.set()
    for m in started:
        m._thread.join(60)


@pytest.fixture
def argvs(monkeypatch):
    """The compiler processes started: (argv, whether a background build started it)."""
    seen = []

    class Recording:
        def __getattr__(self, name):
            return getattr(subprocess, name)

        def Popen(self, argv, *a, **k):  # noqa: N802
            seen.append((list(argv), tiers.in_background()))
            return subprocess.Popen(argv, *a, **k)
    monkeypatch.setattr(c_build, "subprocess", Recording())
    return seen


def _check(got, feeds):
    for name, want in reference(**feeds).items():
        np.testing.assert_allclose(got[name], want, rtol=1e-6, atol=1e-6)


def test_quick_tier_serves_then_the_optimised_build_takes_over(gate, argvs):
    feeds = inputs(batch=3, seed=1)
    kiln.compile(elementwise_model(7), tier="full")   # kiln's pool, always -O3 (kept per machine)
    argvs.clear()
    m = kiln.compile(elementwise_model(3), tier="auto")
    assert m.tier == "quick"
    _check(m.run(feeds), feeds)
    quick = [a for a, bg in argvs if not bg and "-c" in a]
    assert quick and all("-Og" in a and "-O3" not in a for a in quick)
    assert not any(bg for _, bg in argvs)          # nothing at -O3 until the gate opens
    gate.set()
    assert m.wait_optimized(timeout=120) is m
    assert m.tier == "final"
    _check(m.run(feeds), feeds)
    final = [a for a, bg in argvs if bg and "-c" in a]
    assert final and all("-O3" in a and "-Og" not in a for a in final)
    if os.path.exists("/usr/bin/nice") or os.path.exists("/bin/nice"):
        assert all(a[0].endswith("nice") for a, bg in argvs if bg)


def test_the_optimised_build_starts_once_the_first_run_is_over(argvs, monkeypatch):
    """Its compilers leave the cores to the first run (the quick tier's): they start when a run
    returns, or when asked to wait, or START_AFTER seconds after the compile with no run."""
    monkeypatch.setattr(tiered, "START_AFTER", 60.0)
    feeds = inputs(batch=3, seed=6)
    m = kiln.compile(elementwise_model(3), tier="auto")
    threading.Event().wait(0.5)
    assert m.tier == "quick" and not any(bg for _, bg in argvs)
    _check(m.run(feeds), feeds)
    assert m.wait_optimized(timeout=120).tier == "final"
    assert any(bg for _, bg in argvs)
    monkeypatch.setattr(tiered, "START_AFTER", 0.2)       # no run: it starts by itself
    m = kiln.compile(elementwise_model(5), tier="auto")
    module = m.program.modules()[0]
    assert module._done.wait(120) and m.tier == "final"


def test_only_the_optimised_module_is_cached(gate):
    feeds = inputs(batch=3, seed=2)
    m = kiln.compile(elementwise_model(3), tier="auto")
    quick_path = m.program.modules()[0].current.library_path
    gate.set()
    m.wait_optimized(timeout=120)
    final_path = m.program.modules()[0].current.library_path
    assert final_path != quick_path
    before = c_build.compiler_runs()
    again = kiln.compile(elementwise_model(3), tier="auto")    # from the cache: the -O3 library
    assert c_build.compiler_runs() == before and again.tier == "final"
    assert again.program.modules()[0].library_path == final_path
    _check(again.run(feeds), feeds)


def test_a_compile_meeting_the_build_under_way_shares_it(gate):
    feeds = inputs(batch=3, seed=3)
    first = kiln.compile(elementwise_model(3), tier="auto")
    before = c_build.compiler_runs()
    second = kiln.compile(elementwise_model(3), tier="auto")
    assert c_build.compiler_runs() == before                   # no second build
    assert second.program.modules()[0] is first.program.modules()[0]
    assert second.tier == "quick"
    _check(second.run(feeds), feeds)
    gate.set()
    second.wait_optimized(timeout=120)
    assert first.tier == "final"


def test_full_tier_waits_for_a_build_under_way(gate):
    kiln.compile(elementwise_model(3), tier="auto")
    threading.Timer(0.2, gate.set).start()
    m = kiln.compile(elementwise_model(3), tier="full")
    assert m.tier == "final"


def test_full_tier_builds_at_o3_only(argvs):
    feeds = inputs(batch=3, seed=4)
    m = kiln.compile(elementwise_model(3), tier="full")
    assert m.tier == "final"
    _check(m.run(feeds), feeds)
    assert argvs and not any("-Og" in a for a, _ in argvs) and not any(bg for _, bg in argvs)


def test_kiln_tier_env_and_user_flags_turn_tiering_off(monkeypatch, argvs):
    monkeypatch.setenv("KILN_TIER", "full")
    assert kiln.compile(elementwise_model(3)).tier == "final"
    monkeypatch.delenv("KILN_TIER")
    monkeypatch.setenv("KILN_CFLAGS", "-O1 -fopenmp")
    assert kiln.compile(elementwise_model(5)).tier == "final"
    assert not any("-Og" in a for a, _ in argvs)


def test_unknown_tier_is_refused():
    with pytest.raises(KilnError, match="tier='fast'"):
        kiln.compile(elementwise_model(3), tier="fast")


def test_runs_on_other_threads_stay_correct_across_the_swap(gate):
    m = kiln.compile(elementwise_model(3), tier="auto")
    stop, errors, counts = threading.Event(), [], [0, 0]

    def loop(k):
        rng = np.random.default_rng(k)
        while not stop.is_set():
            feeds = {n: rng.standard_normal((3, 4)).astype(np.float32) for n in ("x", "s")}
            try:
                _check(m.run(feeds), feeds)
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(e)
                return
            counts[m.tier == "final"] += 1
    threads = [threading.Thread(target=loop, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    gate.set()
    m.wait_optimized(timeout=120)
    while counts[1] < 20 and not errors:   # some runs on the -O3 module too
        threading.Event().wait(0.01)
    stop.set()
    for t in threads:
        t.join(60)
    assert not errors, errors[0]
    assert counts[0] > 0 and counts[1] >= 20


def test_a_failed_optimised_build_leaves_the_quick_tier_serving(gate, monkeypatch):
    feeds = inputs(batch=3, seed=5)
    m = kiln.compile(elementwise_model(3), tier="auto")
    real = c_build._run_all

    def fail(argv_list, shown):
        if tiers.in_background():
            raise KilnError("C compiler failed (exit 1): made up for the test", stage="codegen")
        return real(argv_list, shown)
    monkeypatch.setattr(c_build, "_run_all", fail)
    gate.set()
    with pytest.raises(KilnError, match="optimised .-O3. build failed.*made up for the test"):
        m.wait_optimized(timeout=120)
    assert m.tier == "quick"
    _check(m.run(feeds), feeds)
    monkeypatch.setattr(c_build, "_run_all", real)
    again = kiln.compile(elementwise_model(3), tier="full")    # nothing was cached: built again
    assert again.tier == "final"
    _check(again.run(feeds), feeds)


def test_a_process_ending_during_the_build_caches_the_optimised_module(cache, tmp_path):
    path = tmp_path / "m.onnx"
    import onnx
    onnx.save(elementwise_model(3), path)
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {ROOT!r})
        import numpy as np
        import kiln
        from kiln.codegen import build, tiers
        from kiln.targets import tiered
        tiers.MIN_SECONDS = 0.0
        slow = tiered.TieredModule._build   # (the -O3 build outlasts the rest of the script)
        tiered.TieredModule._build = lambda self, *a: (time.sleep(0.5), slow(self, *a))
        m = kiln.compile({str(path)!r}, tier="auto")
        x = np.ones((3, 4), np.float32)
        m.run({{"x": x, "s": x}})
        print(m.tier, build.compiler_runs(), flush=True)
    """)
    env = dict(os.environ, KILN_CACHE_DIR=str(cache))
    first = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert first.returncode == 0, first.stderr
    assert first.stdout.split()[0] == "quick"       # it exited while the -O3 build ran
    second = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert second.returncode == 0, second.stderr
    assert second.stdout.split() == ["final", "0"]  # the -O3 module, from the cache


def test_a_process_ending_before_any_run_starts_the_optimised_build_at_exit(cache, tmp_path):
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {ROOT!r})
        import kiln
        from kiln.codegen import build, tiers
        from kiln.targets import tiered
        from tests.runtime.models import elementwise_model
        tiers.MIN_SECONDS = 0.0
        tiered.START_AFTER = 3600.0     # (only the exit may start it)
        m = kiln.compile(elementwise_model(3), tier="auto")
        print(m.tier, build.compiler_runs(), flush=True)
    """)
    env = dict(os.environ, KILN_CACHE_DIR=str(cache))
    first = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300,
                           cwd=ROOT)
    assert first.returncode == 0, first.stderr
    assert first.stdout.split()[0] == "quick"
    second = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300,
                            cwd=ROOT)
    assert second.stdout.split() == ["final", "0"], second.stderr   # its -O3 module was cached at exit


def test_the_tuner_measures_the_optimised_build(argvs):
    from kiln.tuning import module_job
    job = module_job(elementwise_model(3), None, {})
    assert job["path"].endswith(".so")
    assert argvs and not any("-Og" in a for a, _ in argvs)
