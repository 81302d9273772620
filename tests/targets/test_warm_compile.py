"""A static model compiled before is found by its compile key before any pass runs: a warm
compile loads the library and its weights blob as built, running no pass, no lowering and
no C compiler (counted: kiln.timing's stages, kiln.codegen.build.compiler_runs). Whatever
changes the generated code or its weights is in the key, so it misses."""

import json
import platform

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
