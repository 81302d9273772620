"""pack_weights: MatMul/Gemm with a constant weight -> kiln::MatMulPacked reading panels
packed at compile time; the interpreter gives the same numbers before and after."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln

from kiln.dtypes import DType
from kiln.lower.gemm import pack_weight, weight_panel_width
from kiln.ops.packed import unpack_weight
from kiln.targets.target import Target
from tests.passes.util import check, prog

F = np.float32
rng = np.random.default_rng(0)


def _after(sig, body, opset=17):
    return prog(sig, body, opset).replace('opsets {"": 17}', 'opsets {"": 17, "kiln": 1}')


@pytest.mark.parametrize("n,k", [(4, 3), (37, 5), (70, 1024)])
def test_pack_unpack_roundtrip(n, k):
    w = rng.normal(size=(k, n)).astype(F)
    nr = weight_panel_width(n, k, DType.float32, Target.host())
    wp = pack_weight(w, nr)
    assert wp.shape == (-(-n // nr), k, nr) and wp.flags.c_contiguous
    np.testing.assert_array_equal(unpack_weight(wp, n), w)
    assert not wp.transpose(1, 0, 2).reshape(k, -1)[:, n:].any()


def test_matmul_constant_weight():
    sig = "(%x: float32[2,5,3]) -> (%y)"
    w = rng.normal(size=(3, 40)).astype(F)
    nr = weight_panel_width(40, 3, DType.float32, Target.host())
    before = '  %y: float32[2,5,40] = MatMul(%x, %w) name "mm"'
    after = f'  %y: float32[2,5,40] = "kiln"::MatMulPacked(%x, %w.panels{nr}) {{n = 40}} name "mm"'
    _, stats = check("pack_weights", prog(sig, before), _after(sig, after),
                     w=w, **{f"w.panels{nr}": pack_weight(w, nr)})
    assert stats.fired == {"MatMulPacked": 1}


def test_matmul_transposed_constant():
    """A tied embedding: MatMul(x, Transpose(E)); the Transpose is left for DCE."""
    sig = "(%x: float32[5,3]) -> (%y)"
    e = rng.normal(size=(4, 3)).astype(F)
    before = ('  %et: float32[3,4] = Transpose(%e) {perm = [1, 0]} name "t"\n'
              '  %y: float32[5,4] = MatMul(%x, %et) name "mm"')
    after = ('  %et: float32[3,4] = Transpose(%e) {perm = [1, 0]} name "t"\n'
             '  %y: float32[5,4] = "kiln"::MatMulPacked(%x, %et.panels4) {n = 4} name "mm"')
    check("pack_weights", prog(sig, before), _after(sig, after), e=e, **{"et.panels4": pack_weight(e.T, 4)})


@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm(trans_b):
    sig = "(%x: float32[5,3]) -> (%y)"
    w = rng.normal(size=(4, 3) if trans_b else (3, 4)).astype(F)
    c = rng.normal(size=4).astype(F)
    before = f'  %y: float32[5,4] = Gemm(%x, %w, %c) {{alpha = 0.5, beta = 2.0, transB = {trans_b}}} name "g"'
    after = ('  %y: float32[5,4] = "kiln"::MatMulPacked(%x, %w.panels4, %c) {n = 4, alpha = 0.5, beta = 2.0} '
             'name "g"')
    check("pack_weights", prog(sig, before), _after(sig, after), w=w, c=c,
          **{"w.panels4": pack_weight(w.T if trans_b else w, 4)})


@pytest.mark.parametrize("case", ["variable", "trans_a", "float64", "vector"])
def test_left_alone(case):
    if case == "variable":
        sig, body, consts = "(%x: float32[5,3], %w: float32[3,4]) -> (%y)", \
            '  %y: float32[5,4] = MatMul(%x, %w) name "mm"', {}
    elif case == "trans_a":
        sig, body, consts = "(%x: float32[3,5]) -> (%y)", \
            '  %y: float32[5,4] = Gemm(%x, %w) {transA = 1} name "g"', {"w": rng.normal(size=(3, 4)).astype(F)}
    elif case == "float64":
        sig, body, consts = "(%x: float64[5,3]) -> (%y)", \
            '  %y: float64[5,4] = MatMul(%x, %w) name "mm"', {"w": rng.normal(size=(3, 4))}
    else:
        sig, body, consts = "(%x: float32[3]) -> (%y)", \
            '  %y: float32[4] = MatMul(%x, %w) name "mm"', {"w": rng.normal(size=(3, 4)).astype(F)}
    _, stats = check("pack_weights", prog(sig, body), None, **consts)
    assert not stats.fired


@pytest.mark.parametrize("n", [40, 80, 96, 97, 160])
def test_panel_width_fits_the_columns_and_matches_the_reference(n):
    """A weight whose columns four-vector panels would pad (96 = 6 x 16) takes panels that pad
    no more columns than four vectors would; the packed GEMM matches numpy at odd sizes, a
    symbolic batch, for any width the rule picks."""
    t = Target.host()
    lanes = t.vector_lanes(4)
    nr = weight_panel_width(n, 24, DType.float32, t)
    assert nr % lanes == 0 or nr < lanes
    if nr >= lanes:
        assert -(-n // nr) * nr <= -(-n // (4 * lanes)) * 4 * lanes
    rng = np.random.default_rng(n)
    w = rng.standard_normal((24, n)).astype(np.float32)
    model = helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 13, 24])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 13, n])],
        [numpy_helper.from_array(w, "w")]), opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    m = kiln.compile(model)
    assert f"panels{nr}" in str(m.graph)
    for b in (1, 3):
        x = rng.standard_normal((b, 13, 24)).astype(np.float32)
        np.testing.assert_allclose(m.run(x=x)["y"], x @ w, rtol=1e-4, atol=1e-5)


def test_shared_weights_pack_once_and_merge_once():
    """Layers sharing their weights (ALBERT): each weight is packed into one constant, and the
    merged Q/K-style GEMMs of both layers read one stack of planes; numbers as NumPy's."""
    from kiln.frontends.onnx import load_onnx
    from kiln.passes import run_passes

    k, n = 24, 16
    wq, wk = (rng.normal(size=(k, n)).astype(F) for _ in range(2))
    wo = rng.normal(size=(n, k)).astype(F)
    nodes = []
    for layer, x in enumerate(["x", "h1"]):
        nodes += [helper.make_node("MatMul", [x, "wq"], [f"q{layer}"]),
                  helper.make_node("MatMul", [x, "wk"], [f"k{layer}"]),
                  helper.make_node("Mul", [f"q{layer}", f"k{layer}"], [f"p{layer}"]),
                  helper.make_node("MatMul", [f"p{layer}", "wo"], [f"h{layer + 1}"])]
    g = helper.make_graph(nodes, "shared", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, k])],
                          [helper.make_tensor_value_info("h2", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, name) for name, v in (("wq", wq), ("wk", wk), ("wo", wo))])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    opt, _ = run_passes(load_onnx(model.SerializeToString()), 3)
    gemms = [nd for nd in opt.nodes if nd.op == "MatMulPacked"]
    assert len(gemms) == 4 and len({nd.inputs[1].id for nd in gemms}) == 2, [str(nd) for nd in gemms]
    x = rng.normal(size=(2, 5, k)).astype(F)
    h = x
    for _ in range(2):
        h = ((h @ wq) * (h @ wk)) @ wo
    got = kiln.compile(model.SerializeToString()).run({"x": x})["h2"]
    np.testing.assert_allclose(got, h, rtol=1e-4, atol=1e-4 * float(np.abs(h).max()))
