"""Llama-style rotary embedding (x * cos + rotate_half(x) * sin) becomes kiln::RotaryHalf, in
the forms torch.onnx's two exporters emit; look-alikes stay. Whole models are compared with
ONNX Runtime, and the head split in front of the rotation runs in the same kernel."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.graph import print_graph
from tests.passes.util import assert_equivalent, graph, prog, run_pass

ort = pytest.importorskip("onnxruntime")

F, I = np.float32, np.int64
rng = np.random.default_rng(5)
BIG = np.iinfo(np.int64).max
SIG = "(%x: float32[2,4,5,16], %cos: float32[1,1,5,16], %sin: float32[1,1,5,16]) -> (%y)"


def chain(first=(0, 8, -1, 1), second=(8, BIG, -1, 1), cat_axis=-1, swap=False, neg="Neg", sig=SIG):
    """rotate_half with opset-13 Slices (starts, ends, axes, steps as constant inputs); the
    values' types follow the bounds."""
    x = np.empty((2, 4, 5, 16))
    t = lambda a: "float32[" + ",".join(map(str, a.shape)) + "]"  # noqa: E731
    cut = lambda b: x[(slice(None),) * (b[2] % 4) + (slice(b[0], min(b[1], 99), b[3]),)]  # noqa: E731
    x1, x2 = cut(first), cut(second)
    halves = ["%x1", "%neg"] if swap else ["%neg", "%x1"]
    rh = np.concatenate([x1, x2] if swap else [x2, x1], axis=cat_axis)
    lines = ['  %xc: float32[2,4,5,16] = Mul(%x, %cos) name "mul_cos"',
             f'  %x1: {t(x1)} = Slice(%x, %s1, %e1, %a1, %p1) name "first"',
             f'  %x2: {t(x2)} = Slice(%x, %s2, %e2, %a2, %p2) name "second"',
             f'  %neg: {t(x2)} = {neg}(%x2) name "neg"',
             f'  %rh: {t(rh)} = Concat({", ".join(halves)}) {{axis = {cat_axis}}} name "cat"',
             f'  %rs: {t(rh)} = Mul(%rh, %sin) name "mul_sin"',
             '  %y: float32[2,4,5,16] = Add(%xc, %rs) name "add"']
    consts = {f"{k}{i}": np.array([v], I) for i, bounds in ((1, first), (2, second))
              for k, v in zip("seap", bounds)}
    return prog(sig, "\n".join(lines), 13), consts


def test_rotate_half_is_one_op():
    text, consts = chain()
    g = graph(text, **consts)
    out, stats = run_pass("recognize_rotary", g)
    assert [n.qualified_op for n in out.nodes] == ["kiln::RotaryHalf"]
    assert stats.removed == 7 and stats.added == 1
    assert_equivalent(g, out, 0, 0)   # the same float32 products and sum: bit for bit


@pytest.mark.parametrize("text, consts", [
    chain(first=(0, 7, -1, 1), second=(7, BIG, -1, 1)),                     # not halves
    chain(first=(0, 2, 1, 1), second=(2, BIG, 1, 1), cat_axis=1),           # another axis
    chain(first=(0, 16, -1, 2), second=(1, 16, -1, 2)),                      # interleaved pairs (steps 2)
    chain(swap=True),                                                        # halves the other way round
    chain(neg="Relu"),                                                       # no negation
    chain(sig=SIG.replace("%cos: float32[1,1,5,16]", "%cos: float32[3,2,4,5,16]")),  # cos widens x
])
def test_look_alikes_stay(text, consts):
    if "%cos: float32[3" in text:
        text = text.replace("%y: float32[2,4,5,16] = Add", "%y: float32[3,2,4,5,16] = Add").replace(
            "%xc: float32[2,4,5,16]", "%xc: float32[3,2,4,5,16]")
    g = graph(text, **consts)
    out, stats = run_pass("recognize_rotary", g)
    assert print_graph(out) == print_graph(g)


def test_a_value_read_elsewhere_stays():
    text, consts = chain()
    g = graph(text.replace("-> (%y)", "-> (%y, %rh)"), **consts)
    out, _ = run_pass("recognize_rotary", g)
    assert print_graph(out) == print_graph(g)


def _model(form: str, b=2, s=7, heads=4, d=16):
    """q (b, s, heads*d) split into heads, rotated with cos/sin computed from positions, as
    torch.onnx writes HF's apply_rotary_pos_emb (opset 18)."""
    c = lambda name, v: numpy_helper.from_array(np.asarray(v), name)  # noqa: E731
    inv = (1.0 / 10000 ** (np.arange(0, d, 2) / d)).astype(F)
    inits = [c("shape", np.array([0, 0, heads, d], I)), c("freq", np.concatenate([inv, inv])[None, :]),
             c("zero", np.array([0], I)), c("big", np.array([BIG], I)), c("last", np.array([-1], I)),
             c("one", np.array([1], I)), c("ax01", np.array([0, 1], I)), c("two", np.array(2, I)),
             c("three", np.array(3, I)), c("start", np.array(0, I)), c("step", np.array(1, I))]
    n = helper.make_node
    nodes = [n("Reshape", ["q", "shape"], ["qh"]), n("Transpose", ["qh"], ["x"], perm=[0, 2, 1, 3]),
             n("Shape", ["q"], ["qs"]), n("Gather", ["qs", "one"], ["sl"], axis=0), n("Squeeze", ["sl"], ["sn"]),
             n("Range", ["start", "sn", "step"], ["pos"]), n("Cast", ["pos"], ["posf"], to=1),
             n("Unsqueeze", ["posf", "last"], ["pcol"]), n("Mul", ["pcol", "freq"], ["ang"]),
             n("Cos", ["ang"], ["c2"]), n("Sin", ["ang"], ["s2"]),
             n("Unsqueeze", ["c2", "ax01"], ["cos"]), n("Unsqueeze", ["s2", "ax01"], ["sin"]),
             n("Mul", ["x", "cos"], ["xc"])]
    if form == "torchscript":   # the halves' bound from Shape: d // 2
        nodes += [n("Shape", ["x"], ["xs"]), n("Gather", ["xs", "three"], ["dd"], axis=0),
                  n("Div", ["dd", "two"], ["hd"]), n("Unsqueeze", ["hd", "zero"], ["h"]),
                  n("Slice", ["x", "zero", "h", "last", "one"], ["x1"]),
                  n("Slice", ["x", "h", "big", "last", "one"], ["x2"])]
    else:
        inits.append(c("h", np.array([d // 2], I)))
        nodes += [n("Slice", ["x", "zero", "h", "last"], ["x1"]), n("Slice", ["x", "h", "big", "last"], ["x2"])]
    nodes += [n("Neg", ["x2"], ["nx2"]), n("Concat", ["nx2", "x1"], ["rh"], axis=-1),
              n("Mul", ["rh", "sin"], ["rs"]), n("Add", ["xc", "rs"], ["y"])]
    g = helper.make_graph(nodes, "rope", [helper.make_tensor_value_info("q", TensorProto.FLOAT, [b, s, heads * d])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=9).SerializeToString()


@pytest.mark.parametrize("form", ["torchscript", "dynamo"])
def test_exported_rotary_runs_as_one_kernel_and_matches_onnxruntime(form):
    data = _model(form)
    m = kiln.compile(data)
    assert "RotaryHalf" in [n.op for n in m.program.graph.nodes]
    q = rng.standard_normal((2, 7, 64)).astype(F)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"q": q})[0]
    np.testing.assert_allclose(m.run({"q": q})["y"], want, rtol=1e-6, atol=1e-6)
    assert len(m.profile({"q": q}, runs=1)) == 1   # the head split, the rotation: one kernel


def test_symbolic_sizes_broadcast_unless_they_could_widen_x():
    """Shape-generic modules infer RotaryHalf with symbolic sizes (test_generic_shapes' llama)."""
    from kiln.ops.rotary import _fits
    assert _fits(8, 8) and _fits(1, 8) and not _fits(4, 8)
    assert _fits(8, "_u1") and _fits("seq", "seq") and _fits("seq", "_u2") and _fits("seq", 8)
    assert not _fits("seq", 1)
