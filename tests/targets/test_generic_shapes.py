"""shapes="generic": one native module runs every value of a model's symbolic dims
(issue 15 items 1 and 4), matching the NumPy reference, with no C compiler run after
the compile; models that cannot be generic are specialised per shape and say why."""

import threading

import numpy as np
import onnx
import pytest
from onnx import helper

import kiln
from kiln.codegen import build as c_build

F = onnx.TensorProto.FLOAT


def _models():
    from tests.helpers import ROOT  # noqa: F401  (puts examples/ on the path)
    import build_transformer
    return build_transformer


class _CountingSubprocess:
    """kiln.codegen.build's `subprocess`, counting every process it starts (the C compiler)."""

    def __init__(self, real):
        self.real, self.started = real, []

    def __getattr__(self, name):
        attr = getattr(self.real, name)
        if name in ("run", "Popen", "call", "check_call", "check_output"):
            def counted(*a, **kw):
                self.started.append((threading.get_ident(), a[0] if a else kw.get("args")))
                return attr(*a, **kw)
            return counted
        return attr


@pytest.fixture
def compiler_runs(monkeypatch):
    counter = _CountingSubprocess(c_build.subprocess)
    monkeypatch.setattr(c_build, "subprocess", counter)
    return counter.started


def _check_runs(model, shapes_feeds, compiler_runs, rtol=1e-4, atol=1e-5):
    """Run the generic `model` on every feed; each matches the reference, none compiles."""
    ref = kiln.compile(model.source, target="interpreter", opt_level=0)
    before = len(compiler_runs)
    for feeds in shapes_feeds:
        got = model.run(feeds)
        want = ref.run(feeds)
        for name in want:
            assert got[name].shape == want[name].shape
            np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=atol)
    assert compiler_runs[before:] == []


def _generic(onnx_model, **options):
    m = kiln.compile(onnx_model, target="cpu", shapes="generic", report=True, **options)
    m.source = onnx_model
    assert m.shapes == "generic", m.report
    assert "shapes: generic" in str(m.report)
    return m


def test_mlp_runs_every_batch_from_one_module(compiler_runs):
    m = _generic(_models().build_mlp())
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.standard_normal((b, 64)).astype(np.float32)} for b in (1, 2, 3, 7, 13, 64, 97, 300)]
    _check_runs(m, feeds, compiler_runs)
    assert m.specializations == 1


def test_encoder_runs_every_batch_and_sequence_from_one_module(compiler_runs):
    m = _generic(_models().build_encoder())
    rng = np.random.default_rng(1)
    pairs = [(1, 1), (1, 7), (2, 13), (3, 5), (1, 64), (5, 31), (2, 129), (7, 3)]
    feeds = [{"ids": rng.integers(0, 100, (b, s)).astype(np.int64)} for b, s in pairs]
    _check_runs(m, feeds, compiler_runs, rtol=1e-3, atol=1e-4)


def test_generic_matches_onnx_runtime():
    ort = pytest.importorskip("onnxruntime")
    model = _models().build_encoder(layers=1)
    m = _generic(model)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(2)
    for b, s in ((1, 3), (4, 17)):
        ids = rng.integers(0, 100, (b, s)).astype(np.int64)
        np.testing.assert_allclose(m.run({"ids": ids})[m.outputs[0].name], sess.run(None, {"ids": ids})[0],
                                   rtol=1e-3, atol=1e-4)


def test_specialize_stays_the_default_and_reports_it():
    m = kiln.compile(_models().build_mlp(), target="cpu", report=True)
    assert m.shapes == "specialize" and "shapes: specialize" in str(m.report)
    x = np.random.default_rng(3).standard_normal((3, 64)).astype(np.float32)
    np.testing.assert_allclose(m.run({"x": x})["probs"],
                               _generic(_models().build_mlp()).run({"x": x})["probs"], rtol=1e-5, atol=1e-6)


def _model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "m", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_a_size_from_data_falls_back_to_specialising_and_says_why():
    """Reshape to a shape given as input data: no symbol says the output's size."""
    model = _model([helper.make_node("Reshape", ["x", "to"], ["f"], name="reshape"),
                    helper.make_node("Relu", ["f"], ["y"], name="relu")],
                   [helper.make_tensor_value_info("x", F, ["n", 3]),
                    helper.make_tensor_value_info("to", onnx.TensorProto.INT64, [1])],
                   [helper.make_tensor_value_info("y", F, None)])
    m = kiln.compile(model, target="cpu", shapes="generic", report=True)
    assert m.shapes == "specialize"
    assert "relu" in m.shapes_reason or "reshape" in m.shapes_reason
    assert m.shapes_reason in str(m.report)
    x = np.random.default_rng(4).standard_normal((5, 3)).astype(np.float32)
    np.testing.assert_array_equal(m.run({"x": x, "to": np.array([-1])})["y"], np.maximum(x.reshape(-1), 0))


def test_reshape_to_minus_one_over_a_symbol_is_generic(compiler_runs):
    """[n, 3] -> Reshape [-1]: the output has 3*n elements, a size computed from the symbol."""
    shape = onnx.numpy_helper.from_array(np.array([-1], np.int64), "flat")
    model = _model([helper.make_node("Reshape", ["x", "flat"], ["f"], name="flatten"),
                    helper.make_node("Relu", ["f"], ["y"], name="relu")],
                   [helper.make_tensor_value_info("x", F, ["n", 3])],
                   [helper.make_tensor_value_info("y", F, None)], [shape])
    m = _generic(model)
    rng = np.random.default_rng(4)
    _check_runs(m, [{"x": rng.standard_normal((n, 3)).astype(np.float32)} for n in (1, 5, 23)], compiler_runs)


def test_a_symbol_broadcast_against_another_size_is_not_generic():
    """x[n] + y[4]: n may be 1 or 4 at run time; a generic kernel could not tell."""
    model = _model([helper.make_node("Add", ["x", "y"], ["z"], name="add")],
                   [helper.make_tensor_value_info("x", F, ["n"]), helper.make_tensor_value_info("y", F, [4])],
                   [helper.make_tensor_value_info("z", F, [4])])
    m = kiln.compile(model, target="cpu", shapes="generic")
    assert m.shapes == "specialize" and "broadcasts" in m.shapes_reason
    y = np.arange(4, dtype=np.float32)
    for n in (1, 4):
        x = np.full(n, 2, np.float32)
        np.testing.assert_array_equal(m.run({"x": x, "y": y})["z"], x + y)


def test_bad_shapes_are_clear_errors():
    m = _generic(_models().build_mlp())
    with pytest.raises(kiln.KilnError, match="x"):
        m.run({"x": np.zeros((2, 63), np.float32)})
    # an empty batch is no size for the generic kernels: the model specialised to it runs it
    assert m.run({"x": np.zeros((0, 64), np.float32)})["probs"].shape == (0, 10)
    with pytest.raises(kiln.KilnError, match="generic"):
        kiln.save(m, "unused.kiln")


def test_unknown_shapes_option_is_an_error():
    with pytest.raises(kiln.KilnError, match="shapes"):
        kiln.compile(_models().build_mlp(), target="cpu", shapes="dynamic")


def test_more_op_families_run_generic(compiler_runs):
    """Reductions over a symbolic axis, Concat/Slice along static axes, a standalone Transpose,
    Where, Cast, Sigmoid (a formula with a per-element temporary) and a symbolic-by-symbolic
    MatMul, at several (n, m) from one module."""
    I = onnx.numpy_helper.from_array
    inits = [I(np.array([1], np.int64), "ax1"), I(np.array([0], np.int64), "s0"), I(np.array([3], np.int64), "e3"),
             I(np.array([2], np.int64), "ax2"), I(np.float32(0.5).reshape(()), "half")]
    nodes = [
        helper.make_node("ReduceMean", ["x", "ax1"], ["mean"], keepdims=1, name="mean"),      # over m
        helper.make_node("Sub", ["x", "mean"], ["xc"], name="center"),
        helper.make_node("Sigmoid", ["xc"], ["sg"], name="sig"),
        helper.make_node("Concat", ["sg", "x"], ["cat"], axis=2, name="cat"),              # [n, m, 8]
        helper.make_node("Slice", ["cat", "s0", "e3", "ax2"], ["sl"], name="slice"),        # [n, m, 3]
        helper.make_node("Transpose", ["sl"], ["tr"], perm=[0, 2, 1], name="transpose"),   # [n, 3, m]
        helper.make_node("MatMul", ["sl", "tr"], ["gram"], name="gram"),                   # [n, m, m]
        helper.make_node("Greater", ["gram", "half"], ["mask"], name="gt"),
        helper.make_node("Where", ["mask", "gram", "half"], ["w"], name="where"),
        helper.make_node("ReduceMax", ["w", "ax1"], ["rmax"], keepdims=0, name="rmax"),     # [n, m]
        helper.make_node("Cast", ["rmax"], ["y"], to=onnx.TensorProto.DOUBLE, name="cast"),
    ]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, ["n", "m", 4])],
                   [helper.make_tensor_value_info("y", onnx.TensorProto.DOUBLE, ["n", "m"]),
                    helper.make_tensor_value_info("tr", F, ["n", 3, "m"])], inits)
    m = _generic(model)
    rng = np.random.default_rng(5)
    feeds = [{"x": rng.standard_normal((n, k, 4)).astype(np.float32)} for n, k in
             ((1, 1), (1, 2), (3, 17), (2, 64), (5, 33))]
    _check_runs(m, feeds, compiler_runs)


def test_tiered_serves_generic_then_the_specialised_module(compiler_runs):
    """shapes="tiered": a new shape runs on the generic module at once (no compile on the
    caller's thread), the specialised module is built in the background and then serves it."""
    model = _models().build_mlp()
    m = kiln.compile(model, target="cpu", shapes="tiered", report=True)
    assert m.shapes == "tiered" and "shapes: tiered" in str(m.report)
    ref = kiln.compile(model, target="interpreter")
    rng = np.random.default_rng(6)
    before = len(compiler_runs)
    for b in (1, 5, 31):
        x = rng.standard_normal((b, 64)).astype(np.float32)
        np.testing.assert_allclose(m.run({"x": x})["probs"], ref.run({"x": x})["probs"], rtol=1e-4, atol=1e-6)
    m.wait(600)
    # whatever compiled, compiled in the background
    assert threading.get_ident() not in [t for t, _ in compiler_runs[before:]]
    assert not m.failed and len(m.ready) == 3 and m.specializations == 4
    for b in (1, 5, 31):
        x = rng.standard_normal((b, 64)).astype(np.float32)
        np.testing.assert_allclose(m.run({"x": x})["probs"], ref.run({"x": x})["probs"], rtol=1e-4, atol=1e-6)


def test_reshape_to_minus_one_keeps_the_symbol(compiler_runs):
    """[n, 2, 3] -> Reshape [-1, 6]: the -1 is `n` (not a size from data), so it stays generic."""
    target = onnx.numpy_helper.from_array(np.array([-1, 6], np.int64), "flat")
    model = _model([helper.make_node("Reshape", ["x", "flat"], ["f"], name="flatten"),
                    helper.make_node("Relu", ["f"], ["y"], name="relu")],
                   [helper.make_tensor_value_info("x", F, ["n", 2, 3])],
                   [helper.make_tensor_value_info("y", F, ["n", 6])], [target])
    m = _generic(model)
    rng = np.random.default_rng(8)
    _check_runs(m, [{"x": rng.standard_normal((n, 2, 3)).astype(np.float32)} for n in (1, 4, 11)], compiler_runs)


def _exported_style():
    from tests.targets import exported_style
    return exported_style


# (batch, seq): 1, primes, large; each model runs all of them from the module built at compile time
PAIRS = [(1, 1), (1, 2), (2, 3), (3, 7), (1, 13), (5, 31), (2, 97), (1, 257)]


@pytest.mark.parametrize("kind", ["bert", "gpt2", "llama"])
def test_exported_style_transformers_run_every_shape_from_one_module(kind, compiler_runs):
    """Shapes computed in the graph (Shape/Gather/Concat -> Reshape, Range positions and masks,
    a causal bias Sliced to seq, GQA heads Expanded) stay symbolic: one module, no compile after."""
    es = _exported_style()
    m = _generic(es.build(kind, max_pos=300))
    _check_runs(m, [es.feeds(b, s, seed=b * 1000 + s) for b, s in PAIRS], compiler_runs, rtol=1e-3, atol=1e-4)
    assert m.specializations == 1


@pytest.mark.parametrize("kind", ["bert", "gpt2", "llama"])
def test_exported_style_transformers_match_onnx_runtime(kind):
    ort = pytest.importorskip("onnxruntime")
    es = _exported_style()
    model = es.build(kind, seed=1, layers=1, max_pos=300)
    m = _generic(model)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for b, s in ((1, 5), (3, 19)):
        feeds = es.feeds(b, s, seed=s)
        np.testing.assert_allclose(m.run(feeds)[m.outputs[0].name], sess.run(None, feeds)[0], rtol=1e-3, atol=1e-4)


def test_a_size_outside_a_guard_runs_specialised():
    """GPT-2's causal bias Sliced up to seq is seq only while seq fits the bias: beyond it the
    generic module does not run the shape (the specialised model reports the mismatch)."""
    es = _exported_style()
    model = es.build("gpt2", layers=1, max_pos=12)
    m = _generic(model)
    ref = kiln.compile(model, target="interpreter")
    ok = es.feeds(2, 12, seed=3)
    np.testing.assert_allclose(m.run(ok)[m.outputs[0].name], ref.run(ok)[m.outputs[0].name], rtol=1e-3, atol=1e-4)
    with pytest.raises(kiln.KilnError):
        m.run(es.feeds(1, 13, seed=4))    # the bias has 12 rows: the reference fails too


def test_reserve_makes_room_for_every_smaller_shape():
    es = _exported_style()
    m = _generic(es.build("bert", layers=1, max_pos=300))
    ws = m.reserve(batch=4, seq=64)
    assert ws > 0 and m.module.workspace.size >= ws
    before = m.module.workspace
    ref = kiln.compile(m.source, target="interpreter")
    for b, s in ((4, 64), (3, 17), (1, 64)):
        feeds = es.feeds(b, s, seed=b + s)
        np.testing.assert_allclose(m.run(feeds)[m.outputs[0].name], ref.run(feeds)[m.outputs[0].name],
                                   rtol=1e-3, atol=1e-4)
    assert m.module.workspace is before       # nothing grew
    with pytest.raises(kiln.KilnError, match="seq"):
        m.reserve(batch=4)


def test_a_growing_arena_grows_in_place_for_a_somewhat_larger_shape():
    """The workspace grows to ARENA_GROWTH times the plan asked for: a larger shape within that
    runs on the same memory (its pages touched before stay mapped), results unchanged."""
    from kiln.runtime.native import ARENA_GROWTH
    es = _exported_style()
    m = _generic(es.build("bert", layers=1, max_pos=300))
    ref = kiln.compile(m.source, target="interpreter")

    def check(b, s):
        feeds = es.feeds(b, s, seed=b + s)
        np.testing.assert_allclose(m.run(feeds)[m.outputs[0].name], ref.run(feeds)[m.outputs[0].name],
                                   rtol=1e-3, atol=1e-4)
        return m.module.shape_plan((b, s))[2]
    ws = check(2, 40)
    grown = m.module.workspace
    assert grown.size >= ARENA_GROWTH * ws
    ws2 = check(2, 56)
    assert ws < ws2 <= grown.size - 64 and m.module.workspace is grown     # in place
    check(4, 200)
    assert m.module.workspace is not grown                                  # past it: a new one


def test_a_hand_written_kernel_takes_the_symbols(compiler_runs):
    """CumSum is hand-written C: in a generic module its sizes are C expressions of the
    symbols, read from the kernel's extra parameter."""
    axis = onnx.numpy_helper.from_array(np.array(1, np.int64), "axis")
    model = _model([helper.make_node("CumSum", ["x", "axis"], ["c"], name="cumsum"),
                    helper.make_node("Relu", ["c"], ["y"], name="relu")],
                   [helper.make_tensor_value_info("x", F, ["n", "m"])],
                   [helper.make_tensor_value_info("y", F, ["n", "m"])], [axis])
    m = _generic(model)
    rng = np.random.default_rng(9)
    _check_runs(m, [{"x": rng.standard_normal((n, k)).astype(np.float32)} for n, k in ((1, 1), (3, 7), (2, 131))],
                compiler_runs)


def test_the_per_shape_plan_is_the_arena_planners():
    """A generic module's plan per new shape (kiln.lower.generic._place, overlaps known once)
    places every buffer where kiln.lower.memory.plan_arena does."""
    from kiln.lower.generic import ALIGN, _place
    from kiln.lower.memory import Lifetime, plan_arena
    rng = np.random.default_rng(11)
    for _ in range(30):
        n = int(rng.integers(1, 40))
        firsts = rng.integers(0, 30, n)
        lasts = firsts + rng.integers(0, 8, n)
        sizes = [int(x) for x in rng.choice([0, 1, 64, 100, 4096, 5000, 1 << 16], n)]
        overlaps = [[j for j in range(n) if firsts[j] <= lasts[k] and firsts[k] <= lasts[j]] for k in range(n)]
        total, offsets = _place(sizes, list(firsts), overlaps)
        plan = plan_arena([Lifetime(k, sizes[k], int(firsts[k]), int(lasts[k])) for k in range(n)], ALIGN)
        assert total == plan.total and list(offsets) == [plan.offsets[k] for k in range(n)]
