"""A SiLU-gated MLP (Llama's: down(silu(gate(x)) * up(x))) as torch.onnx's exporters write it
runs as three kernels: SiLU becomes Swish (simplify_algebra) and joins the gate GEMM's
epilogue, the gating product joins the up GEMM's; or, where gate and up merge into one GEMM
(kiln.passes.merge_gemms: static shapes), that GEMM, SiLU and product as one elementwise
kernel, and the down GEMM. Compared with ONNX Runtime."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln

ort = pytest.importorskip("onnxruntime")

F = np.float32
rng = np.random.default_rng(9)


def _mlp(silu: list, gate_product: list, d=32, h=48, sigmoid_of="g", projections_first=False):
    c = lambda name, v: numpy_helper.from_array(np.asarray(v), name)  # noqa: E731
    inits = [c("wg", rng.standard_normal((d, h)).astype(F) / 6), c("wu", rng.standard_normal((d, h)).astype(F) / 6),
             c("wd", rng.standard_normal((h, d)).astype(F) / 6)]
    n = helper.make_node
    gate, up = n("MatMul", ["x", "wg"], ["g"]), n("MatMul", ["x", "wu"], ["u"])
    act = [n("Sigmoid", [sigmoid_of], ["sg"]), n("Mul", silu, ["act"])]
    # the exporters' order (gate, SiLU, up), or both projections first (as a graph optimizer may leave them)
    nodes = [gate, up, *act] if projections_first or sigmoid_of != "g" else [gate, *act, up]
    nodes += [n("Mul", gate_product, ["p"]), n("MatMul", ["p", "wd"], ["y"])]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", d])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=9).SerializeToString()


@pytest.mark.parametrize("silu, gate_product, projections_first", [
    (["g", "sg"], ["act", "u"], False),     # both exporters: g * sigmoid(g), then * up
    (["sg", "g"], ["u", "act"], False),     # the products the other way round
    (["g", "sg"], ["act", "u"], True),      # both projections before the SiLU
])
def test_silu_gated_mlp_is_three_gemm_kernels(silu, gate_product, projections_first):
    data = _mlp(silu, gate_product, projections_first=projections_first)
    m = kiln.compile(data)
    x = rng.standard_normal((2, 5, 32)).astype(F)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(m.run({"x": x})["y"], want, rtol=1e-5, atol=1e-5)
    kernels = [what for what, _ in m.profile({"x": x}, runs=1)]
    assert len(kernels) == 3, kernels
    if "merged" in kernels[0]:   # gate and up as one GEMM (kiln.passes.merge_gemms): SiLU and product after it
        assert "Swish" in kernels[1] and "Mul" in kernels[1] and "MatMulPacked" not in kernels[1], kernels
    else:
        assert "Swish" in kernels[0] and "Mul" in kernels[1], kernels


def test_a_sigmoid_of_another_value_is_no_silu():
    """g * sigmoid(u) is a gate but not SiLU: it stays a Sigmoid and a product."""
    data = _mlp(["g", "sg"], ["act", "u"], sigmoid_of="u")
    m = kiln.compile(data)
    ops = [n.op for n in m.program.graph.nodes]
    assert "Swish" not in ops and "Sigmoid" in ops, ops
    x = rng.standard_normal((2, 5, 32)).astype(F)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(m.run({"x": x})["y"], want, rtol=1e-5, atol=1e-5)
