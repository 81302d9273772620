"""Schedule decisions as data (kiln.lower.decisions): recorded in each kernel's kept trace,
part of the module cache key, overridable per kernel or for all, checked against their domain."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import kiln
from kiln import KilnError
from kiln.compiler import run_stages
from kiln.lower.decisions import DECISIONS, SERIAL_WORK
from kiln.targets.cache import graph_key
from tests.helpers import forks

F = onnx.TensorProto.FLOAT
rng = np.random.default_rng(7)


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))


def matmul_model(m=64, k=256, n=128):
    g = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")], "mm",
                          [helper.make_tensor_value_info("a", F, [m, k]), helper.make_tensor_value_info("b", F, [k, n])],
                          [helper.make_tensor_value_info("y", F, [m, n])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def feeds():
    return {"a": rng.standard_normal((64, 256)).astype(np.float32),
            "b": rng.standard_normal((256, 128)).astype(np.float32)}


def test_the_serial_threshold_is_one_declared_decision():
    d = DECISIONS["parallel_min_work"]
    assert d.default(None) == SERIAL_WORK == 1 << 15
    assert -1 not in d.domain and 0 in d.domain and 1.5 not in d.domain


def test_decisions_are_recorded_in_the_kept_trace():
    st = run_stages(matmul_model(), "loops")
    (kernel,) = [k for k in st.lowered.kernels if k.func.name.endswith("MatMul")]
    assert kernel.decisions["parallel_min_work"] == SERIAL_WORK
    assert {"gemm.mr", "gemm.nvec", "gemm.swap"} <= set(kernel.decisions)   # the GEMM template's
    assert dict(kernel.trace.decisions) == kernel.decisions
    assert f"decide('parallel_min_work', {SERIAL_WORK})" in str(kernel.trace).splitlines()
    assert kernel.trace.insts   # the schedule's primitives are kept too
    assert st.lowered.decisions[kernel.func.name] == kernel.decisions


def test_another_value_gives_another_valid_schedule_and_its_own_cache_entry(tmp_path):
    x = feeds()
    want = x["a"] @ x["b"]
    default = run_stages(matmul_model(), "c")
    forked = run_stages(matmul_model(), "c", decisions={"parallel_min_work": 0, "fork_gain": 0})   # always fork
    serial = run_stages(matmul_model(), "c", decisions={"parallel_min_work": 1 << 40})
    assert forks(forked.source.text) and not forks(serial.source.text)
    (k,) = [k for k in serial.lowered.kernels if k.func.name.endswith("MatMul")]
    assert k.decisions["parallel_min_work"] == 1 << 40

    spec = default.specialized
    cpu = default.optimized.target
    assert graph_key(spec.graph, spec.known, cpu) != graph_key(spec.graph, spec.known, cpu, {"parallel_min_work": 1 << 40})
    modules = tmp_path / "cache" / "modules"
    for decisions in (None, {"parallel_min_work": 1 << 40}, {k.func.name: {"parallel_min_work": 7}}):
        got = kiln.compile(matmul_model(), decisions=decisions).run(x)["y"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert len(list(modules.glob("*.json"))) == 3
    kiln.compile(matmul_model(), decisions={"parallel_min_work": 1 << 40})   # served from the cache
    assert len(list(modules.glob("*.json"))) == 3


def test_an_illegal_decision_is_a_kiln_error_naming_it():
    with pytest.raises(KilnError, match=r"illegal value -1 for decision 'parallel_min_work' in kernel "
                                        r"'k0_MatMul'.*integer >= 0"):
        kiln.compile(matmul_model(), decisions={"parallel_min_work": -1})
    with pytest.raises(KilnError, match="illegal value 'many'"):
        kiln.compile(matmul_model(), decisions={"k0_MatMul": {"parallel_min_work": "many"}})
    with pytest.raises(KilnError, match="unknown schedule decision 'tile_size'"):
        kiln.compile(matmul_model(), decisions={"tile_size": 4})
    with pytest.raises(KilnError, match="kernel\\(s\\) 'k9_Conv', which this module does not have"):
        kiln.compile(matmul_model(), decisions={"k9_Conv": {"parallel_min_work": 1}})


def conv_model(c=8, oc=16, hw=12):
    w = onnx.numpy_helper.from_array(rng.standard_normal((oc, c, 3, 3)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])], "conv",
                          [helper.make_tensor_value_info("x", F, [1, c, hw, hw])],
                          [helper.make_tensor_value_info("y", F, [1, oc, hw, hw])], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("opt_level, decisions", [
    (0, {"conv.oct": 2}), (0, {"conv.rows": 3, "conv.ocb": 8}), (3, {"conv.qv": 1})])
def test_conv_planner_decisions_replay_to_the_reference_result(opt_level, decisions):
    model = conv_model()
    x = rng.standard_normal((1, 8, 12, 12)).astype(np.float32)
    want = kiln.compile(model, target="interpreter").run(x=x)["y"]
    st = run_stages(model, "c", opt_level=opt_level)
    (k,) = [k for k in st.lowered.kernels if "Conv" in k.func.name]
    assert set(decisions) <= set(k.decisions), k.decisions      # the planner records its choices
    other = run_stages(model, "c", opt_level=opt_level, decisions=decisions)
    (k2,) = [k for k in other.lowered.kernels if "Conv" in k.func.name]
    assert {n: k2.decisions[n] for n in decisions} == decisions and other.source.text != st.source.text
    got = kiln.compile(model, opt_level=opt_level, decisions=decisions).run(x=x)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("opt_level, decisions, why", [
    (0, {"conv.oct": 3}, "must divide the 16 output channels"),
    (0, {"conv.ocb": 12}, "must divide the 16 output channels"),
    (3, {"conv.rows": 13}, "has 12 output rows")])
def test_a_conv_decision_the_kernel_cannot_take_is_named(opt_level, decisions, why):
    (name, value), = decisions.items()
    with pytest.raises(KilnError, match=rf"illegal value {value} for decision '{name}'.*{why}"):
        kiln.compile(conv_model(), opt_level=opt_level, decisions=decisions)


def reduce_model(rows=4, cols=4096):
    g = helper.make_graph([helper.make_node("ReduceSum", ["x"], ["y"], name="sum", keepdims=0, axes=[1])], "sum",
                          [helper.make_tensor_value_info("x", F, [rows, cols])],
                          [helper.make_tensor_value_info("y", F, [rows])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)])   # axes an attribute


def test_the_reduction_tiles_are_declared_decisions_with_target_defaults():
    """reduce.block and reduce.lanes (the reduction/injective templates' tile sizes, also
    Softmax's and Attention's): defaults as formulas of the Target, recorded per kernel,
    overridable, and another value still computes the reference result."""
    from kiln.targets.target import Target
    lanes = DECISIONS["reduce.lanes"]
    for name in ("x86-64-v3", "x86-64-v4"):
        t = Target.named(name)
        assert lanes.default(t) == max(16, t.vector_lanes(4)) == 16
        assert DECISIONS["reduce.block"].default(t) == 64
    x = rng.standard_normal((4, 4096)).astype(np.float32)
    st = run_stages(reduce_model(), "c")
    (k,) = [k for k in st.lowered.kernels if "Reduce" in k.func.name]
    assert k.decisions["reduce.lanes"] == 16
    other = run_stages(reduce_model(), "c", decisions={"reduce.lanes": 8})
    (k2,) = [k for k in other.lowered.kernels if "Reduce" in k.func.name]
    assert k2.decisions["reduce.lanes"] == 8 and other.source.text != st.source.text
    got = kiln.compile(reduce_model(), decisions={"reduce.lanes": 8}).run(x=x)["y"]
    np.testing.assert_allclose(got, x.astype(np.float64).sum(1), rtol=1e-4, atol=1e-3)


def test_serial_rates_are_target_formulas():
    """The vectorized kinds' serial rate follows the vector width (3.75e3 multiply-adds per us
    per float32 lane, 60e3 measured with AVX-512); load-bound kinds do not."""
    from kiln.lower.nnutil import serial_rate
    from kiln.targets.target import Target
    v3, v4 = Target.named("x86-64-v3"), Target.named("x86-64-v4")
    for kind in ("conv", "gemm"):
        assert serial_rate(kind, v4) == 60e3 and serial_rate(kind, v3) == 30e3
    for kind, rate in (("depthwise", 10e3), ("window", 2e3), ("copy", 4e3)):
        assert serial_rate(kind, v3) == serial_rate(kind, v4) == rate
