"""kiln.compiler's pipeline: each stage a function with a typed result; `--emit STAGE` prints
the pipeline's own intermediate, and the C it prints is the C of the library that runs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import kiln
from kiln import KilnError
from kiln.cli import main
from kiln.compiler import CSource, Optimized, Specialized, Stages, run_stages
from kiln.export import c_source_of, native_module, save
from kiln.lower.kernel import Kernel
from kiln.lower.module import LoweredModule
from kiln.lower.partition import FusionPlan
from kiln.loops.schedule import Trace
from tests.runtime.models import elementwise_model, inputs, reference

F, I64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))


def test_every_stage_has_a_typed_result():
    st = run_stages(elementwise_model(), "c", dims={"batch": 3})
    assert isinstance(st, Stages)
    assert isinstance(st.optimized, Optimized) and st.optimized.level == 3
    assert isinstance(st.specialized, Specialized) and st.specialized.breaks == []
    assert [tuple(v.type.shape) for v in st.specialized.graph.inputs][0][0] == 3
    assert isinstance(st.lowered, LoweredModule) and isinstance(st.lowered.fusion, FusionPlan)
    assert st.lowered.kernels and all(isinstance(k, Kernel) for k in st.lowered.kernels)
    assert all(isinstance(k.trace, Trace) for k in st.lowered.kernels)
    assert isinstance(st.source, CSource) and "kiln_main" in st.source.text
    # stopping early runs no later stage
    early = run_stages(elementwise_model(), "optimized")
    assert early.specialized is None and early.lowered is None and early.source is None


def _emit(capsys, path, stage, tmp_path) -> str:
    out = tmp_path / f"{stage}.txt"
    try:
        main(["compile", str(path), "--emit", stage, "--emit-to", str(out), "--dim", "batch=2"])
    except SystemExit as e:
        assert e.code == 0, capsys.readouterr().err
    return out.read_text()


@pytest.mark.parametrize("stage", ["graph", "optimized", "partition", "loops", "c"])
def test_emit_prints_the_pipelines_own_stage(capsys, tmp_path, stage):
    path = tmp_path / "m.onnx"
    onnx.save(elementwise_model(), path)
    assert _emit(capsys, path, stage, tmp_path) == run_stages(str(path), stage, dims={"batch": 2}).text(stage)


def test_emitted_c_is_the_c_of_the_library_that_runs():
    model = kiln.compile(elementwise_model())
    got = model.run(inputs(batch=2))
    for name, want in reference(**inputs(batch=2)).items():
        np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-6)
    ran = c_source_of(native_module(model, [(2, 4), (2, 4)]))
    assert run_stages(elementwise_model(), "c", dims={"batch": 2}).text("c") == ran


def _nonzero_model():
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("NonZero", ["r"], ["nz"], name="nz"),
             helper.make_node("Shape", ["nz"], ["y"], name="shape")]
    g = helper.make_graph(nodes, "nz", [helper.make_tensor_value_info("x", F, [6])],
                          [helper.make_tensor_value_info("y", I64, [2])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_stage_breaks_are_answered_once_for_compile_export_and_emit(tmp_path):
    x = np.array([1, -1, 2, 0, 3, -4], np.float32)
    model = kiln.compile(_nonzero_model())
    np.testing.assert_array_equal(model.run(x=x)["y"], [1, 3])   # runs in stages
    spec = model.program.pipeline.specialize([(6,)])
    assert [(b.node.name, b.runtime, b.origin) for b in spec.breaks][0] == ("nz", False, True)
    with pytest.raises(KilnError, match="NonZero node 'nz' makes an output whose size depends"):
        save(model, tmp_path / "m.kiln")
    with pytest.raises(KilnError, match="runs in stages: NonZero node 'nz'"):
        run_stages(_nonzero_model(), "loops")


def test_cli_decision_overrides_reach_the_emitted_stage(capsys, tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(elementwise_model(), path)
    out = tmp_path / "k.txt"

    def emit(*more):
        try:
            main(["compile", str(path), "--emit", "loops", "--emit-to", str(out), "--dim", "batch=2", *more])
        except SystemExit as e:
            assert e.code == 0, capsys.readouterr().err
        return out.read_text()
    assert emit("--decision", "parallel_min_work=0") == run_stages(
        str(path), "loops", dims={"batch": 2}, decisions={"parallel_min_work": 0}).text("loops")
    with pytest.raises(SystemExit):
        main(["compile", str(path), "--emit", "loops", "--dim", "batch=2", "--decision", "parallel_min_work=-3"])
    assert "illegal value -3 for decision 'parallel_min_work'" in capsys.readouterr().err
