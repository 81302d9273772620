"""kiln::MatMulPacked compiled for the cpu target against the NumPy reference: ONNX
MatMul/Gemm models with constant weights, at -O3 (pack_weights rewrites them), with odd
sizes (edge panels and tiles), batches, Gemm's bias/alpha/beta/transB, a fused epilogue
and a fused prologue (attention's head-merge Transpose + Reshape)."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.compiler import run_stages
from tests.helpers import forks as forks_in

rng = np.random.default_rng(0)
F = np.float32


def _model(nodes, x_shape, inits):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _check(m, x, want, rtol=1e-4, atol=1e-4):
    c = kiln.compile(m, target="cpu", opt_level=3, report=True)
    assert any("MatMulPacked" in str(g) for g in c.report.fused_groups), c.report.fused_groups
    got = c.run({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    ref = kiln.compile(m, target="interpreter", opt_level=3).run({"x": x})["y"]
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("x_shape,n", [((1, 7), 1), ((5, 3), 4), ((13, 33), 47), ((2, 9, 20), 70),
                                       ((1, 128, 64), 192), ((3, 17, 1024), 40), ((1, 130), 16)])
def test_matmul(x_shape, n):
    w = rng.standard_normal((x_shape[-1], n)).astype(F)
    x = rng.standard_normal(x_shape).astype(F)
    _check(_model([helper.make_node("MatMul", ["x", "w"], ["y"])], x_shape, {"w": w}), x, x @ w)


@pytest.mark.parametrize("trans_b,c_shape,alpha,beta", [(0, (37,), 1.0, 1.0), (1, (11, 37), 0.5, 2.0),
                                                       (1, (11, 1), 1.0, 1.0), (0, None, 2.0, 1.0)])
def test_gemm(trans_b, c_shape, alpha, beta):
    x = rng.standard_normal((11, 29)).astype(F)
    w = rng.standard_normal((37, 29) if trans_b else (29, 37)).astype(F)
    inits = {"w": w}
    ins = ["x", "w"]
    if c_shape is not None:
        inits["c"] = rng.standard_normal(c_shape).astype(F)
        ins.append("c")
    node = helper.make_node("Gemm", ins, ["y"], transB=trans_b, alpha=alpha, beta=beta)
    want = alpha * (x @ (w.T if trans_b else w)) + (beta * inits["c"] if c_shape is not None else 0)
    _check(_model([node], x.shape, inits), x, want)


def test_tied_embedding_with_epilogue():
    """MatMul(x, Transpose(E)) + bias, GELU-free epilogue: Add + Relu + residual-like Mul."""
    e = rng.standard_normal((90, 48)).astype(F)
    b = rng.standard_normal(90).astype(F)
    x = rng.standard_normal((1, 10, 48)).astype(F)
    nodes = [helper.make_node("Transpose", ["e"], ["et"], perm=[1, 0]),
             helper.make_node("MatMul", ["x", "et"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    _check(_model(nodes, x.shape, {"e": e, "b": b}), x, np.maximum(x @ e.T + b, 0))


def test_head_merge_prologue():
    """[1, heads, seq, d] -> Transpose -> Reshape [1, seq, heads*d] -> MatMul(W): the prologue
    folds into the packed GEMM (its operand is copied row-major once)."""
    h, s, d, n = 4, 24, 16, 72
    x = rng.standard_normal((1, h, s, d)).astype(F)
    w = rng.standard_normal((h * d, n)).astype(F)
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["t", "shape"], ["r"]), helper.make_node("MatMul", ["r", "w"], ["y"])]
    m = _model(nodes, x.shape, {"w": w, "shape": np.array([1, s, h * d], np.int64)})
    c = kiln.compile(m, target="cpu", opt_level=3, report=True)
    assert any("Transpose" in str(g) and "MatMulPacked" in str(g) for g in c.report.fused_groups)
    _check(m, x, x.transpose(0, 2, 1, 3).reshape(1, s, h * d) @ w)


def test_batch_one_linear_forks_where_reading_its_weight_pays():
    """A Linear at batch 1 does one multiply-add per weight read: a 1280 -> 1000 classifier
    (5 MiB) forks by the time it takes to read the weight, a 48 -> 64 one stays serial."""
    for k, n, forks in ((1280, 1000, True), (48, 64, False)):
        w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(F)
        x = rng.standard_normal((1, k)).astype(F)
        m = _model([helper.make_node("Gemm", ["x", "w"], ["y"], transB=1)], x.shape, {"w": w})
        _check(m, x, x @ w.T)
        assert forks_in(run_stages(m, "c").source.text) == forks


@pytest.mark.parametrize("ahead", [0, 1, 7])
@pytest.mark.parametrize("x_shape,n", [((49, 300), 130), ((1, 64, 96), 384), ((3, 200), 17)])
def test_weight_prefetch_keeps_the_result(x_shape, n, ahead):
    """gemm.prefetch: the hints for a packed weight read and write nothing (edge panels, a
    panel of several vectors, one row)."""
    w = rng.standard_normal((x_shape[-1], n)).astype(F)
    x = rng.standard_normal(x_shape).astype(F)
    m = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], x_shape, {"w": w})
    got = kiln.compile(m, target="cpu", opt_level=3, decisions={"gemm.prefetch": ahead}).run({"x": x})["y"]
    np.testing.assert_allclose(got, x @ w, rtol=1e-4, atol=1e-4)


def test_weight_prefetch_rule_and_kernel():
    """A packed weight larger than L1 is prefetched PREFETCH_BYTES ahead in the micro-kernel's
    k loop, one hint per vector of the panel's row (each a cache line); one that fits L1 is not."""
    from kiln.lower.gemm import weight_prefetch
    from kiln.lower.nchwc import PREFETCH_BYTES
    from kiln.targets.target import Target
    t = Target.named("x86-64-v4", l1d_bytes=48 << 10)
    assert weight_prefetch(768, 3072, 64, 4, t) == PREFETCH_BYTES // 256      # 9 MiB: 4 rows of 64 ahead
    assert weight_prefetch(64, 96, 48, 4, t) == 0                             # 24 KiB: in L1
    w = rng.standard_normal((300, 128)).astype(F)                             # 150 KiB
    m = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], (49, 300), {"w": w})
    hints = [ln for ln in run_stages(m, "c", cpu=t).source.text.splitlines() if "__builtin_prefetch" in ln]
    nr = 64     # kiln.lower.gemm.weight_panel_width's four vectors of 16
    ahead = {int(h.rsplit("+ ", 1)[1].split(")")[0]) for h in hints}
    assert len(hints) == nr // 16 and ahead == {PREFETCH_BYTES // 4 + 16 * v for v in range(nr // 16)}, hints
    assert "__builtin_prefetch" not in run_stages(m, "c", cpu=t, decisions={"gemm.prefetch": 0}).source.text
