"""target="cpu": whole-graph native modules, shape specialisation, data-dependent sizes, errors."""

import numpy as np
import onnx
import pytest
from onnx import helper

import kiln

F, I64, S = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64, onnx.TensorProto.STRING


def _model(nodes, inputs, outputs, opset=17, domains=()):
    g = helper.make_graph(nodes, "m", inputs, outputs)
    ops = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in domains]
    return helper.make_model(g, opset_imports=ops)


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def test_data_dependent_output_size_is_sized_at_run_time():
    m = kiln.compile(_model([helper.make_node("NonZero", ["x"], ["y"])], [_vi("x", F, [3, 5])],
                            [_vi("y", I64, None)]), target="cpu")
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(4):
        x = rng.standard_normal((3, 5)).astype(np.float32) * (rng.random((3, 5)) > 0.5)
        y = m.run({"x": x})["y"]
        np.testing.assert_array_equal(y, np.array(np.nonzero(x)))
        seen.add(y.shape[1])
    assert len(seen) > 1  # several sizes really went through


def test_graph_output_that_is_an_input_is_copied():
    m = kiln.compile(_model([helper.make_node("NonZero", ["x"], ["y"])], [_vi("x", F, [2, 2])],
                            [_vi("y", I64, None), _vi("x", F, [2, 2])]), target="cpu")
    x = np.array([[1.5, 0], [0, -2]], np.float32)
    out = m.run({"x": x})
    np.testing.assert_array_equal(out["x"], x)
    assert out["x"] is not x


def test_ops_without_lowering_are_listed_all_at_once():
    model = _model([helper.make_node("RandomNormalLike", ["s"], ["t"], name="norm"),
                    helper.make_node("RandomNormal", [], ["u"], shape=[2], name="cat")],
                   [_vi("s", F, [2])], [_vi("t", F, [2]), _vi("u", F, [2])], opset=20)
    with pytest.raises(kiln.KilnError, match=r"2 node\(s\) have no native lowering.*'norm'.*'cat'"
                       r"|2 node\(s\) have no native lowering[\s\S]*norm[\s\S]*cat"):
        kiln.compile(model, target="cpu")


def test_interpreter_and_cpu_agree_on_the_example_cnn():
    from tests.helpers import small_cnn_model
    x = np.random.default_rng(3).standard_normal((1, 3, 32, 32)).astype(np.float32)
    native = kiln.compile(small_cnn_model(), target="cpu").run({"x": x})["probs"]
    ref = kiln.compile(small_cnn_model(), target="interpreter").run({"x": x})["probs"]
    np.testing.assert_allclose(native, ref, rtol=1e-4, atol=1e-6)


def test_loop_body_runs_as_native_program():
    body = helper.make_graph(
        [helper.make_node("Add", ["acc_in", "x"], ["acc_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [_vi("i", I64, []), _vi("cond_in", onnx.TensorProto.BOOL, []), _vi("acc_in", F, [3])],
        [_vi("cond_out", onnx.TensorProto.BOOL, []), _vi("acc_out", F, [3])])
    m = _model([helper.make_node("Loop", ["M", "", "a0"], ["acc"], body=body)],
               [_vi("M", I64, []), _vi("a0", F, [3]), _vi("x", F, [3])], [_vi("acc", F, [3])])
    cm = kiln.compile(m, target="cpu")
    x = np.array([0.5, -1.0, 2.0], np.float32)
    out = cm.run({"M": np.array(4, np.int64), "a0": np.ones(3, np.float32), "x": x})["acc"]
    np.testing.assert_allclose(out, 1 + 4 * x)
    assert cm.specializations >= 1  # the body was compiled, not interpreted


def test_if_takes_the_branch_chosen_at_run_time():
    def branch(op, name):
        return helper.make_graph([helper.make_node(op, ["x"], [name])], name, [], [_vi(name, F, [2])])
    m = _model([helper.make_node("If", ["c"], ["y"], then_branch=branch("Neg", "t"),
                                 else_branch=branch("Abs", "e"))],
               [_vi("c", onnx.TensorProto.BOOL, []), _vi("x", F, [2])], [_vi("y", F, [2])])
    cm = kiln.compile(m, target="cpu")
    x = np.array([1.5, -2.5], np.float32)
    np.testing.assert_array_equal(cm.run({"c": np.array(True), "x": x})["y"], -x)
    np.testing.assert_array_equal(cm.run({"c": np.array(False), "x": x})["y"], np.abs(x))


def test_profile_replays_every_kernel_call():
    """Calling the kernels one by one, as the profiler does, computes what the entry does."""
    from tests.helpers import small_cnn_model
    m = kiln.compile(small_cnn_model(), target="cpu", opt_level=3)
    x = np.random.default_rng(5).standard_normal((1, 3, 32, 32)).astype(np.float32)
    prof = m.profile({"x": x}, runs=3)
    info = m.build_info()
    assert [what for what, _ in prof] == info["calls"]
    assert all(t > 0 for _, t in prof)
    runner = m.program.runner_for([x])
    outs, times = runner.profile([x], info["call_args"], runs=2)
    assert len(times) == len(info["calls"]) and all(len(t) == 2 for t in times)
    np.testing.assert_array_equal(outs[0], m.run({"x": x})["probs"])


def test_warm_profile_calls_each_kernel_runs_times_in_a_row():
    """profile(warm=True): kernel by kernel, each called `runs` times before the next (its weights
    then in cache), where the default replays the entry's order `runs` times."""
    from kiln.runtime.native import profile_order
    from tests.helpers import small_cnn_model
    assert profile_order(3, 2, warm=False) == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]
    assert profile_order(3, 2, warm=True) == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    m = kiln.compile(small_cnn_model(), target="cpu", opt_level=3)
    x = np.random.default_rng(5).standard_normal((1, 3, 32, 32)).astype(np.float32)
    warm = m.profile({"x": x}, runs=3, warm=True)
    assert [what for what, _ in warm] == m.build_info()["calls"]
    assert all(t > 0 for _, t in warm)


def test_profile_of_a_staged_model_is_a_clear_error():
    m = kiln.compile(_model([helper.make_node("NonZero", ["x"], ["y"])], [_vi("x", F, [3, 5])],
                            [_vi("y", I64, None)]), target="cpu")
    with pytest.raises(kiln.KilnError, match="runs in stages"):
        m.profile({"x": np.ones((3, 5), np.float32)})


def test_symbolic_batch_gets_the_code_of_the_fixed_batch():
    """The shape-dependent -O3 rewrites run again once the first run fixes the batch, so a
    symbolic batch builds the kernels the same model with the batch fixed builds, and each new
    batch size its own (the NCHWc layout, per image, fires on the symbolic batch already)."""
    from tests.helpers import small_cnn_model
    sym = kiln.compile(small_cnn_model("N"), target="cpu", report=True)
    assert any("NCHWc" in n.op for n in sym.graph.nodes)       # the layout is per image
    assert "run again" in str(sym.report)
    assert "run again" not in str(kiln.compile(small_cnn_model(2), target="cpu", report=True).report)
    ref = kiln.compile(small_cnn_model("N"), target="interpreter", opt_level=0)
    rng = np.random.default_rng(11)
    for batch in (2, 3):
        x = rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)
        fixed = kiln.compile(small_cnn_model(batch), target="cpu")
        got = sym.run({"x": x})["probs"]
        calls = sym.program.runner_for([x]).info["calls"]
        assert calls == fixed.build_info()["calls"]
        assert any("NCHWc" in str(c) for c in calls)
        np.testing.assert_array_equal(got, fixed.run({"x": x})["probs"])
        np.testing.assert_allclose(got, ref.run({"x": x})["probs"], rtol=1e-4, atol=1e-5)
    assert sym.specializations == 2
