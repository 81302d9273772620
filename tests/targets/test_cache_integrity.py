"""The compile cache trusts nothing on disk: libraries are hash-checked before they are
loaded, damaged entries are rebuilt, manifests cannot name a library, and the cache
directory must be this user's alone."""

import json
import os
import stat
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import kiln
from kiln import KilnError
from kiln.codegen.build import verified_sha256
from kiln.compiler import run_stages
from tests.runtime.models import elementwise_model, inputs, reference

ROOT = __file__.rsplit("/tests/", 1)[0]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("KILN_CACHE_DIR", str(d))
    return d


def _check(model, batch=3, seed=0):
    feeds = inputs(batch=batch, seed=seed)
    got = model.run(feeds)
    for name, want in reference(**feeds).items():
        np.testing.assert_allclose(got[name], want, rtol=1e-6, atol=1e-6)


def _libraries(cache):
    return sorted((cache / "c").glob("*.so"))


def _replace(path, data: bytes):
    """Swap a file's bytes for `data` under a new inode (this process may have mapped the old one)."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def test_garbage_library_is_rebuilt(cache):
    _check(kiln.compile(elementwise_model(3)))
    libs = _libraries(cache)
    assert libs and all(verified_sha256(p) for p in libs)
    for p in libs:
        _replace(p, b"\x7fELF garbage, not a library")
    _check(kiln.compile(elementwise_model(3)))          # the cached entry is found, refused, rebuilt
    assert all(verified_sha256(p) for p in _libraries(cache))


def test_half_a_library_is_rebuilt_never_mapped(cache):
    """A .so cut in half used to be dlopen'ed and crash the process with SIGBUS."""
    script = textwrap.dedent("""
        import numpy as np, onnx, kiln
        from tests.runtime.models import elementwise_model, inputs, reference
        feeds = inputs(batch=3, seed=1)
        got = kiln.compile(elementwise_model(3)).run(feeds)
        for k, want in reference(**feeds).items():
            np.testing.assert_allclose(got[k], want, rtol=1e-6, atol=1e-6)
        print("ok")
    """)
    env = dict(os.environ, KILN_CACHE_DIR=str(cache), PYTHONPATH=ROOT)

    def run():
        return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT,
                              env=env, timeout=600)
    first = run()
    assert first.returncode == 0 and first.stdout.strip() == "ok", first.stderr
    for p in _libraries(cache):
        with open(p, "r+b") as f:       # in place, as a full disk or a killed copy leaves it
            f.truncate(p.stat().st_size // 2)
    second = run()
    assert second.returncode == 0 and second.stdout.strip() == "ok", (second.returncode, second.stderr)
    assert all(verified_sha256(p) for p in _libraries(cache))


def test_a_manifest_cannot_name_the_library_to_load(cache, tmp_path):
    """The module manifest's text never becomes a path: an entry naming another library
    (here one whose constructor leaves a mark) is refused and rebuilt."""
    marker = tmp_path / "evil-ran"
    evil_c = tmp_path / "evil.c"
    evil_c.write_text(f'#include <stdio.h>\n__attribute__((constructor)) static void run(void) '
                      f'{{ FILE* f = fopen("{marker}", "w"); if (f) fclose(f); }}\n'
                      'int kiln_main(void) { return 0; }\n')
    evil = tmp_path / "evil.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(evil), str(evil_c)], check=True)
    _check(kiln.compile(elementwise_model(3)))
    entries = list((cache / "modules").glob("*.json"))
    assert entries
    for tamper in ({"library": str(evil)}, {"library_key": f"../../{evil.stem}"},
                   {"library_key": "0" * 40, "library": str(evil)}):
        for e in entries:
            m = json.loads(e.read_text())
            _module(m).update(tamper)
            e.write_text(json.dumps(m))
        _check(kiln.compile(elementwise_model(3)))
        assert not marker.exists()


def _module(entry: dict) -> dict:
    """The module manifest of a cache entry (a static model's whole entry holds it as "module")."""
    return entry.get("module", entry)


def test_a_damaged_manifest_is_rebuilt(cache):
    _check(kiln.compile(elementwise_model(3)))
    entries = list((cache / "modules").glob("*.json"))
    assert entries and all("module" in json.loads(e.read_text()) for e in entries)   # a static model's
    for damage in (lambda m: None, lambda m: _module(m).pop("entry"), lambda m: _module(m).update(workspace_bytes=-1),
                   lambda m: _module(m).update(outputs="x"), lambda m: _module(m).update(weights=[[99, 0]]),
                   lambda m: _module(m).update(call_args=[["system", []]]), lambda m: m.pop("inputs"),
                   lambda m: m.update(outputs=[["y", "float32", "3x4", "tensor"]]),
                   lambda m: m.update(weights_sum=-1)):
        for e in entries:
            m = json.loads(e.read_text())
            damage(m)
            e.write_text(json.dumps(m) if m else "{not json")
        _check(kiln.compile(elementwise_model(3)))
    for e in entries:
        e.write_bytes(b"\0" * 10)
    _check(kiln.compile(elementwise_model(3)))


@pytest.mark.parametrize("mode, who", [(0o777, "group and others"), (0o770, "group"), (0o703, "others")])
def test_a_cache_directory_others_can_write_is_refused(cache, mode, who):
    cache.mkdir()
    os.chmod(cache, mode)
    with pytest.raises(KilnError, match=rf"writable by {who} \(mode {mode:o}\).*chmod 700 .*KILN_CACHE_DIR"):
        kiln.compile(elementwise_model(3))
    assert not (cache / "c").exists() and not (cache / "modules").exists()   # nothing built or read
    os.chmod(cache, 0o700)
    (cache / "c").mkdir(mode=0o700)
    os.chmod(cache / "c", 0o775)                                             # a subfolder counts too
    with pytest.raises(KilnError, match="writable by group"):
        kiln.compile(elementwise_model(3))


def test_a_cache_directory_of_another_user_is_refused(cache, monkeypatch):
    cache.mkdir(mode=0o700)
    me = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: me + 1)
    with pytest.raises(KilnError, match=rf"owned by user id {me}, not by you .*chown"):
        kiln.compile(elementwise_model(3))


def test_new_cache_directories_are_private(cache):
    old = os.umask(0o002)               # even under a permissive umask
    try:
        _check(kiln.compile(elementwise_model(3)))
    finally:
        os.umask(old)
    for d in (cache, cache / "c", cache / "modules"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d


def test_processes_filling_the_same_entry_stay_safe(cache):
    """Several processes compile the same new model into one cache at once: each gets the
    right numbers, each unit is compiled and the library linked once, by whichever process met
    it first (the others wait for its file lock, then load what it built: the module's units by
    one process, kiln's pool, a per-machine object, maybe by another), and the cache ends with
    one verified library per key and no temp files."""
    script = textwrap.dedent("""
        import sys, numpy as np, kiln
        from kiln.codegen.build import compiler_runs
        from tests.runtime.models import elementwise_model, inputs, reference
        feeds = inputs(batch=5, seed=int(sys.argv[1]))
        got = kiln.compile(elementwise_model(5)).run(feeds)
        for k, want in reference(**feeds).items():
            np.testing.assert_allclose(got[k], want, rtol=1e-6, atol=1e-6)
        print("ok", compiler_runs())
    """)
    env = dict(os.environ, KILN_CACHE_DIR=str(cache), PYTHONPATH=ROOT)
    procs = [subprocess.Popen([sys.executable, "-c", script, str(k)], cwd=ROOT, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for k in range(3)]
    runs = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0 and out.split()[0] == "ok", err
        runs.append(int(out.split()[1]))
    units = run_stages(elementwise_model(5), "c").source.units
    assert sum(runs) == len(units) + (len(units) > 1) and 0 in runs, runs   # (+ the link)
    libs = _libraries(cache)
    assert libs and all(verified_sha256(p) for p in libs)
    leftovers = [p.name for d in (cache / "c", cache / "modules") for p in d.iterdir() if p.name.startswith(".")]
    assert not leftovers
    _check(kiln.compile(elementwise_model(5)), batch=5)

