"""RMSNorm written out as primitives becomes RMSNormalization, in the forms torch.onnx's two
exporters emit; look-alikes stay. Whole models are compared with ONNX Runtime."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.graph import print_graph
from tests.passes.util import assert_equivalent, check, graph, prog, run_pass

ort = pytest.importorskip("onnxruntime")

F, I = np.float32, np.int64
rng = np.random.default_rng(3)
W = rng.uniform(0.5, 1.5, 8).astype(F)
SIG = "(%x: float32[2,3,8]) -> (%y)"
CONSTS = dict(two=F(2), one=F(1), eps=F(1e-6), w=W)


def chain(axes="[-1]", square="Pow(%x, %two)", scale="Div(%x, %rms)", weight="Mul(%w, %n)", red="float32[2,3,1]"):
    """RMSNorm in the text IR: opset 17, ReduceMean's axes an attribute."""
    lines = [f'  %sq: float32[2,3,8] = {square} name "sq"',
             f'  %ms: {red} = ReduceMean(%sq) {{axes = {axes}}} name "ms"',
             f'  %ve: {red} = Add(%ms, %eps) name "add_eps"',
             f'  %rms: {red} = Sqrt(%ve) name "sqrt"']
    if "%r)" in scale:
        lines.append(f'  %r: {red} = Reciprocal(%rms) name "rcp"')
    if "%inv" in scale:
        lines.append(f'  %inv: {red} = Div(%one, %rms) name "inv"')
    lines.append(f'  %{"n" if weight else "y"}: float32[2,3,8] = {scale} name "scale"')
    if weight:
        lines.append(f'  %y: float32[2,3,8] = {weight} name "weight"')
    return prog(SIG, "\n".join(lines))


def test_the_t5_form_is_one_op():
    after = prog(SIG, '  %y: float32[2,3,8] = RMSNormalization(%x, %w) {axis = 2, epsilon = 1e-06} '
                      'name "weight.RMSNormalization"')
    _, stats = check("recognize_rmsnorm", chain(), after, rtol=1e-5, atol=1e-5, **CONSTS)
    assert stats.removed == 6 and stats.added == 1


@pytest.mark.parametrize("square, scale, weight", [
    ("Pow(%x, %two)", "Mul(%x, %r)", "Mul(%n, %w)"),      # dynamo: rsqrt as Reciprocal(Sqrt)
    ("Pow(%x, %two)", "Mul(%x, %inv)", "Mul(%w, %n)"),    # torchscript: 1 / Sqrt
    ("Mul(%x, %x)", "Div(%x, %rms)", "Mul(%w, %n)"),      # after algebraic simplification
    ("Pow(%x, %two)", "Div(%x, %rms)", None),             # no weight: a scale of ones
])
def test_exporter_forms_are_recognized(square, scale, weight):
    g = graph(chain(square=square, scale=scale, weight=weight), **CONSTS)
    out, _ = run_pass("recognize_rmsnorm", g)
    assert [n.op for n in out.nodes] == ["RMSNormalization"]
    assert_equivalent(g, out, 1e-5, 1e-5)


@pytest.mark.parametrize("text, consts", [
    (chain(axes="[1]", red="float32[2,1,8]"), {}),                            # not the trailing axis
    (chain(square="Pow(%x, %three)"), {"three": F(3)}),                       # not a square
    (chain().replace("%ve: float32[2,3,1]", "%ve: float32[2,3,8]")
     .replace("%rms: float32[2,3,1]", "%rms: float32[2,3,8]"), {"eps": np.full(8, 1e-6, F)}),  # eps per feature
    (chain().replace("-> (%y)", "-> (%y, %rms)"), {}),                        # rms read elsewhere
    (chain().replace("Add(%ms, %eps)", "Sub(%ms, %eps)"), {}),                 # not + eps
])
def test_look_alikes_stay(text, consts):
    g = graph(text, **{**CONSTS, **consts})
    out, stats = run_pass("recognize_rmsnorm", g)
    assert print_graph(out) == print_graph(g)


def test_a_weight_per_row_is_not_a_scale():
    """The norm inside is still one op; the weight stays a Mul after it."""
    g = graph(chain(weight="Mul(%n, %wr)"), **CONSTS, wr=rng.uniform(0.5, 1.5, (3, 8)).astype(F))
    out, _ = run_pass("recognize_rmsnorm", g)
    assert [n.op for n in out.nodes] == ["RMSNormalization", "Mul"]
    assert out.nodes[0].inputs[1].const.tolist() == [1.0] * 8
    assert_equivalent(g, out, 1e-5, 1e-5)


def _model(form: str, d: int = 64, eps: float = 1e-6):
    """An RMSNorm node by node as torch.onnx writes it (opset 18: ReduceMean's axes an input)."""
    c = lambda name, v: numpy_helper.from_array(np.asarray(v), name)  # noqa: E731
    inits = [c("two", F(2)), c("eps", F(eps)), c("one", F(1)), c("axes", np.array([-1], I)),
             c("w", rng.uniform(0.5, 1.5, d).astype(F))]
    n = helper.make_node
    if form == "torchscript":     # LlamaRMSNorm: Cast to float, 1 / Sqrt, Cast back, weight * x
        nodes = [n("Cast", ["x"], ["xf"], to=1), n("Pow", ["xf", "two"], ["sq"]),
                 n("ReduceMean", ["sq", "axes"], ["ms"]),
                 n("Add", ["ms", "eps"], ["ve"]), n("Sqrt", ["ve"], ["rms"]), n("Div", ["one", "rms"], ["inv"]),
                 n("Mul", ["xf", "inv"], ["nf"]), n("Cast", ["nf"], ["nc"], to=1), n("Mul", ["w", "nc"], ["y"])]
    else:                         # dynamo (torch.nn.RMSNorm, LlamaRMSNorm): rsqrt as Reciprocal(Sqrt)
        nodes = [n("Pow", ["x", "two"], ["sq"]), n("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1),
                 n("Add", ["ms", "eps"], ["ve"]), n("Sqrt", ["ve"], ["rms"]), n("Reciprocal", ["rms"], ["inv"]),
                 n("Mul", ["x", "inv"], ["nf"]), n("Mul", ["nf", "w"], ["y"])]
    g = helper.make_graph(nodes, "rms", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", d])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=9).SerializeToString()


@pytest.mark.parametrize("form", ["torchscript", "dynamo"])
def test_exported_rmsnorm_runs_as_one_kernel_and_matches_onnxruntime(form):
    data = _model(form)
    m = kiln.compile(data)
    assert [n.op for n in m.program.graph.nodes] == ["RMSNormalization"]
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for shape in ((2, 5, 64), (1, 33, 64)):
        x = rng.standard_normal(shape).astype(F) * 3
        np.testing.assert_allclose(m.run({"x": x})["y"], sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
    assert len(m.profile({"x": x}, runs=1)) == 1
