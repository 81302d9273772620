"""A static model compiled before is found by its compile key before any pass runs: a warm
compile loads the library and its weights blob as built, running no pass, no lowering and
no C compiler (counted: kiln.timing's stages, kiln.codegen.build.compiler_runs). Whatever
changes the generated code or its weights is in the key, so it misses."""

import json
import os
import platform
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import kiln
from kiln.codegen.build import compiler_runs
from kiln.timing import recording

F = onnx.TensorProto.FLOAT
# the stages that are the pipeline's work: none may run on a cache hit
WORK = {"optimize", "specialize", "partition", "lower", "plan memory", "emit module", "generate C", "cc", "link"}


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("KILN_CACHE_DIR", str(d))
    return d


def conv_model(seed: int = 0, bump: float = 0.0) -> onnx.ModelProto:
    """Conv 3x3 (16 -> 16 channels: blocked, its weights packed or Winograd-transformed at
    compile time) + Relu + 1x1 Conv; `bump` is added to one weight element."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((16, 16, 3, 3)).astype(np.float32) * 0.2
    w[5, 3, 1, 2] += bump
    w2 = rng.standard_normal((8, 16, 1, 1)).astype(np.float32) * 0.2
    b = rng.standard_normal(16).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"])]
    g = helper.make_graph(nodes, "convs", [helper.make_tensor_value_info("x", F, [1, 16, 12, 12])],
                          [helper.make_tensor_value_info("y", F, [1, 8, 12, 12])],
                          [numpy_helper.from_array(a, n) for a, n in ((w, "w"), (b, "b"), (w2, "w2"))])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


FEEDS = {"x": np.random.default_rng(7).standard_normal((1, 16, 12, 12)).astype(np.float32)}


def check(model, onnx_model):
    want = kiln.compile(onnx_model, "interpreter").run(FEEDS)["y"]
    np.testing.assert_allclose(model.run(FEEDS)["y"], want, rtol=1e-4, atol=1e-4)


def compiled(onnx_model, **kw):
    """(model, the stages its compile ran, C compiler processes it started)."""
    runs = compiler_runs()
    with recording() as times:
        model = kiln.compile(onnx_model, **kw)
    return model, set(times.runs), compiler_runs() - runs


def test_a_warm_compile_runs_no_pass_no_lowering_and_no_compiler():
    cold, ran, cc = compiled(conv_model())
    assert WORK <= ran and cc > 0
    check(cold, conv_model())
    warm, ran, cc = compiled(conv_model())      # a new ModelProto object, the same model
    assert not ran & WORK and cc == 0, ran
    assert {"frontend", "cache key", "cache load", "load"} <= ran
    assert warm.shapes == "static" and warm.inputs == cold.inputs and warm.outputs == cold.outputs
    check(warm, conv_model())


@pytest.mark.parametrize("change", ["weight", "opt_level", "decision", "target", "environment"])
def test_what_changes_the_code_or_weights_misses(change, monkeypatch):
    compiled(conv_model())
    model, kw = conv_model(), {}
    if change == "weight":
        model = conv_model(bump=0.5)
    elif change == "opt_level":
        kw = {"opt_level": 1}
    elif change == "decision":
        kw = {"decisions": {"conv.algorithm": "winograd"}}
    elif change == "target":
        if platform.machine() not in ("x86_64", "AMD64"):
            pytest.skip("the other target named here is an x86-64 one")
        kw = {"cpu": "x86-64"}
    else:
        monkeypatch.setenv("KILN_NCHWC", "0")       # read by a pass (the blocked layout), not a flag
    got, ran, cc = compiled(model, **kw)
    assert {"optimize", "lower", "generate C"} <= ran, ran
    assert cc > 0 or change in ("weight", "decision")   # (the same code: the C build cache has it)
    check(got, model)
    again, ran, cc = compiled(model, **kw)          # and that compile is found in its turn
    assert not ran & WORK and cc == 0
    check(again, model)


@pytest.mark.parametrize("damage", ["truncated", "one byte", "a zeroed page", "gone"])
def test_a_damaged_weights_blob_is_built_again(cache, damage):
    compiled(conv_model())
    (blob,) = (cache / "modules").glob("*.weights")
    data = bytearray(blob.read_bytes())
    if damage == "truncated":
        data = data[:len(data) // 2]
    elif damage == "one byte":
        data[len(data) // 3] ^= 0x10
    elif damage == "a zeroed page":
        data[:4096] = bytes(min(4096, len(data)))
    if damage == "gone":
        blob.unlink()
    else:
        tmp = blob.with_name("new")
        tmp.write_bytes(bytes(data))
        tmp.replace(blob)
    model, ran, _ = compiled(conv_model())
    assert {"optimize", "lower"} <= ran
    check(model, conv_model())


def test_a_warm_model_still_has_its_pipeline(tmp_path):
    """What needs the optimized graph (an artifact, model.graph) runs the passes then."""
    compiled(conv_model())
    warm, ran, _ = compiled(conv_model())
    assert "optimize" not in ran
    assert any(n.op for n in warm.graph.nodes)
    kiln.save(warm, tmp_path / "m.kiln")
    np.testing.assert_allclose(kiln.load(tmp_path / "m.kiln").run(FEEDS)["y"], warm.run(FEEDS)["y"], rtol=1e-6)


def test_a_report_on_a_warm_cache_runs_the_passes_but_not_the_compiler(cache):
    compiled(conv_model())
    model, ran, cc = compiled(conv_model(), report=True)
    assert "optimize" in ran and cc == 0 and model.report.kernels
    check(model, conv_model())


def test_the_entry_keeps_the_models_specs_and_blob(cache):
    compiled(conv_model())
    (entry,) = (cache / "modules").glob("*.json")
    e = json.loads(entry.read_text())
    assert e["inputs"] == [["x", "float32", [1, 16, 12, 12], "tensor"]]
    assert e["outputs"] == [["y", "float32", [1, 8, 12, 12], "tensor"]]
    assert entry.with_suffix(".weights").stat().st_size == e["module"]["weights_bytes"]


def test_the_weights_are_written_once_the_c_is_generated(monkeypatch):
    """A cold compile starts writing the weights blob into the cache only after the C is
    generated (kiln.targets.cache.WeightsFile.start: the writer's thread would take the GIL
    from code generation, on the compile's critical path), and the model it makes is right,
    warm too."""
    import kiln.compiler as compiler
    from kiln.targets.cache import WeightsFile
    events = []
    generate, write = compiler.generate, WeightsFile._write

    def generated(*a, **kw):
        out = generate(*a, **kw)
        events.append("generated")
        return out

    def writing(self, *a):
        events.append("write")
        return write(self, *a)
    monkeypatch.setattr(compiler, "generate", generated)
    monkeypatch.setattr(WeightsFile, "_write", writing)
    model = conv_model(seed=11)
    check(compiled(model)[0], model)
    assert events == ["generated", "write"], events
    check(compiled(model)[0], model)     # (warm: the blob as written)
    assert events == ["generated", "write"], events


def test_the_blob_written_to_the_cache_is_the_one_built_in_memory(cache):
    """WeightsFile.place writes the constants into the cache's file (zeros between and after
    them) and maps it back: once written(), byte for byte what kiln.lower.module.in_memory
    makes, with its checksum; the file is removed unless kept, and kept in place."""
    from kiln.errors import KilnError
    from kiln.lower.module import in_memory
    from kiln.targets.cache import WeightsFile, checksum
    (cache / "modules").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(3)
    pieces = [(0, rng.integers(1, 256, 100, dtype=np.uint8)), (128, rng.integers(1, 256, 7, dtype=np.uint8)),
              (192, np.zeros(0, np.uint8)), (192, rng.integers(1, 256, 3000, dtype=np.uint8))]
    want = in_memory(3264, pieces)
    with WeightsFile("ab" * 32) as f:
        blob = f.place(3264, pieces)
        assert f.written() == checksum(want)
        np.testing.assert_array_equal(blob, want)
        written = Path(f.tmp)
        assert written.stat().st_size == 3264
    assert not written.exists()
    with WeightsFile("cd" * 32) as f:
        f.place(3264, pieces)
        f.written()
        f.keep()
    np.testing.assert_array_equal(np.fromfile(f.path, np.uint8), want)
    assert f.path.name == "cd" * 32 + ".weights"
    with WeightsFile("ef" * 32) as f:
        with pytest.raises(KilnError, match="overlaps"):
            f.place(256, [(0, np.ones(100, np.uint8)), (64, np.ones(8, np.uint8))])
        with pytest.raises(KilnError, match="outside"):
            f.place(64, [(0, np.ones(100, np.uint8))])
        with pytest.raises(KilnError, match="no weights blob"):
            f.written()


def test_a_cold_compile_runs_on_the_blob_it_stored(cache):
    """The module a cold compile returns runs on the blob it wrote to the cache (mapped back,
    copy-on-write), and a warm one on that blob."""
    cold, ran, _ = compiled(conv_model())
    assert "lower" in ran
    assert len(list((cache / "modules").glob("*.weights"))) == 1
    check(cold, conv_model())
    warm, ran, _ = compiled(conv_model())
    assert not ran & WORK
    check(warm, conv_model())


# -- a model given as a path: found by the file's identity, the file not even read -------------

@pytest.fixture
def no_racy_wait(monkeypatch):
    """Remember files however recently written (the racy-clean margin is tested on its own)."""
    from kiln.codegen import cachedir
    monkeypatch.setattr(cachedir, "RACY_NS", 0)


def saved(path, onnx_model, **kw):
    onnx.save(onnx_model, str(path), **kw)
    return str(path)


def test_a_model_file_compiled_before_loads_in_a_new_process_without_onnx(tmp_path, cache, no_racy_wait):
    import subprocess
    import sys
    path = saved(tmp_path / "m.onnx", conv_model())
    cold, ran, _ = compiled(path)
    assert "frontend" in ran and len(list((cache / "files").glob("*.json"))) == 1
    np.save(tmp_path / "x.npy", FEEDS["x"])
    child = (
        "import json, sys\nimport numpy as np\nimport kiln\nfrom kiln.timing import recording\n"
        f"with recording() as t:\n    m = kiln.compile({path!r})\n"
        f"np.save({str(tmp_path / 'y.npy')!r}, m.run({{'x': np.load({str(tmp_path / 'x.npy')!r})}})['y'])\n"
        "import threading\nfor th in threading.enumerate():\n    th.name == 'kiln-probe-cc' and th.join()\n"
        "print(json.dumps({'onnx': [n for n in sys.modules if n == 'onnx' or n.startswith('onnx.')],"
        " 'stages': sorted(t.runs), 'passes': 'kiln.passes' in sys.modules, 'emitter': 'kiln.codegen.c' in"
        " sys.modules}))\n")
    root = str(Path(kiln.__file__).resolve().parents[1])   # this checkout's kiln, whatever is installed
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, cwd=str(tmp_path), env=env)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["onnx"] == [] and not got["passes"] and not got["emitter"], got   # (the probes' answers read)
    assert "frontend" not in got["stages"] and not set(got["stages"]) & WORK, got
    want = kiln.compile(conv_model(), "interpreter").run(FEEDS)["y"]
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), want, rtol=1e-4, atol=1e-4)


def test_a_file_not_in_the_cache_starts_the_toolchain_while_it_is_read(tmp_path, no_racy_wait, monkeypatch):
    """A compile starts the C toolchain's probes before it looks the model up (kiln's source
    hashed: the first C compiler run starts sooner); a model file the cache does not know then
    starts kiln's pool (kiln.compiler._start_builds) before the frontend reads it, once; one it
    knows starts no build."""
    import kiln.codegen.build as build
    import kiln.codegen.toolchain as toolchain
    import kiln.compiler as compiler
    from kiln.targets.cache import ModelFile
    order = []
    probes, pool, frontend, of = toolchain.start_probes, build.prebuild_pool, compiler.frontend, ModelFile.of
    monkeypatch.setattr(toolchain, "start_probes", lambda cpu: order.append("probes") or probes(cpu))
    monkeypatch.setattr(build, "prebuild_pool", lambda cpu: order.append("pool") or pool(cpu))
    monkeypatch.setattr(compiler, "frontend", lambda m: order.append("frontend") or frontend(m))
    monkeypatch.setattr(ModelFile, "of", staticmethod(lambda *a: order.append("lookup") or of(*a)))
    path = saved(tmp_path / "m.onnx", conv_model())
    cold = kiln.compile(path)
    assert order == ["probes", "lookup", "pool", "frontend"]
    order.clear()
    warm = kiln.compile(path)
    assert order == ["probes", "lookup"]
    check(cold, conv_model())
    check(warm, conv_model())


def test_a_touched_file_is_read_again_and_found_by_its_graph(tmp_path, no_racy_wait):
    import os
    path = saved(tmp_path / "m.onnx", conv_model())
    compiled(path)
    _, ran, _ = compiled(path)
    assert "frontend" not in ran
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns - 1_000_000_000))   # `touch`: same bytes (a time
    # not after the read: a file changed after it was read is not remembered, RACY_NS or not)
    model, ran, cc = compiled(path)
    assert "frontend" in ran and not ran & WORK and cc == 0    # read, then found by its compile key
    check(model, conv_model())
    _, ran, _ = compiled(path)
    assert "frontend" not in ran                              # and remembered under its new identity


def test_a_rewritten_file_of_the_same_size_gives_the_new_models_answer(tmp_path, no_racy_wait):
    path = saved(tmp_path / "m.onnx", conv_model())
    check(compiled(path)[0], conv_model())
    size = len(open(path, "rb").read())
    saved(tmp_path / "m.onnx", conv_model(bump=0.5))
    assert len(open(path, "rb").read()) == size
    model, ran, _ = compiled(path)
    assert "frontend" in ran and "optimize" in ran
    check(model, conv_model(bump=0.5))


def test_changed_external_data_is_read_again(tmp_path, no_racy_wait):
    path = saved(tmp_path / "m.onnx", conv_model(), save_as_external_data=True, location="m.data",
                 size_threshold=0)
    check(compiled(path)[0], conv_model())
    _, ran, _ = compiled(path)
    assert "frontend" not in ran
    other = tmp_path / "other"
    other.mkdir()
    saved(other / "m.onnx", conv_model(bump=0.5), save_as_external_data=True, location="m.data",
          size_threshold=0)
    (tmp_path / "m.data").write_bytes((other / "m.data").read_bytes())   # the .onnx file untouched
    model, ran, _ = compiled(path)
    assert "frontend" in ran
    check(model, conv_model(bump=0.5))


@pytest.mark.parametrize("damage", ["garbage", "truncated", "another file's", "module gone"])
def test_a_damaged_file_entry_is_built_again(tmp_path, cache, no_racy_wait, damage):
    path = saved(tmp_path / "m.onnx", conv_model())
    compiled(path)
    (entry,) = (cache / "files").glob("*.json")
    text = entry.read_text()
    if damage == "garbage":
        entry.write_bytes(b"\x00garbage{")
    elif damage == "truncated":
        entry.write_text(text[:len(text) // 2])
    elif damage == "another file's":
        e = json.loads(text)
        e["file"][3] += 1                       # recorded for a file of another size
        entry.write_text(json.dumps(e))
    else:
        for f in (cache / "modules").glob("*.weights"):
            f.unlink()
    model, ran, _ = compiled(path)
    assert "frontend" in ran
    check(model, conv_model())
    json.loads(entry.read_text())               # written again, whole
    _, ran, _ = compiled(path)
    assert "frontend" not in ran


def test_a_file_changed_just_before_it_was_read_is_not_remembered(tmp_path, cache):
    """Within a tick of the file system's clock a second write could keep size and times
    (git's racy-clean problem): a file changed under RACY_NS before it was read is read again."""
    path = saved(tmp_path / "m.onnx", conv_model())
    compiled(path)
    assert not list((cache / "files").glob("*.json"))
    _, ran, _ = compiled(path)
    assert "frontend" in ran and not ran & WORK


def test_a_model_with_symbolic_dims_from_a_file_stays_shape_generic(tmp_path, cache, no_racy_wait):
    from tests.targets.test_generic_shapes import _models
    path = saved(tmp_path / "mlp.onnx", _models().build_mlp())
    ref = kiln.compile(path, "interpreter")
    for _ in range(2):
        m = kiln.compile(path, shapes="generic")
        assert m.shapes == "generic"
        for batch in (1, 7):
            x = {"x": np.random.default_rng(batch).standard_normal((batch, 64)).astype(np.float32)}
            np.testing.assert_allclose(m.run(x)["probs"], ref.run(x)["probs"], rtol=1e-4, atol=1e-5)
    assert not list((cache / "files").glob("*.json"))       # (no whole module: nothing remembered)


def test_a_model_loaded_by_its_file_reads_it_for_its_graph_and_refuses_a_changed_one(tmp_path, no_racy_wait):
    path = saved(tmp_path / "m.onnx", conv_model())
    compiled(path)
    warm, ran, _ = compiled(path)
    assert "frontend" not in ran
    assert warm.graph.nodes                     # the file read and its passes run now
    warm2, _, _ = compiled(path)
    saved(tmp_path / "m.onnx", conv_model(bump=0.5))
    with pytest.raises(kiln.KilnError, match="changed after it was compiled"):
        warm2.graph
    check(warm2, conv_model())                  # its module still runs the model it was compiled from
