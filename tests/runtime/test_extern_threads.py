"""Hand-written kernels whose loops used to fork OpenMP's own team (TopK, DFT, Resize) run them with
kiln_par_for on the module's threads: in a pool module nothing is parked around them (the
emitter parks the pool around a kernel that forks OpenMP's team: kiln.codegen.c.forks_openmp), and the results are the reference's with the loops split."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.compiler import run_stages

F = TensorProto.FLOAT


def _model(node, inputs, outputs, inits=(), opset=20):
    g = helper.make_graph([node], "m", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    return m


def topk_model(rows, n, k, largest):
    return _model(helper.make_node("TopK", ["x", "k"], ["v", "i"], largest=largest),
                  [helper.make_tensor_value_info("x", F, [rows, n])],
                  [helper.make_tensor_value_info("v", F, None), helper.make_tensor_value_info("i", TensorProto.INT64, None)],
                  [helper.make_tensor("k", TensorProto.INT64, [1], [k])])


def dft_model(rows, n):
    return _model(helper.make_node("DFT", ["x", "", "axis"], ["y"]),
                  [helper.make_tensor_value_info("x", F, [rows, n, 1])],
                  [helper.make_tensor_value_info("y", F, None)],
                  [helper.make_tensor("axis", TensorProto.INT64, [], [1])])


@pytest.mark.parametrize("impl", ["pool", "omp"])
@pytest.mark.parametrize("k", [5, 100])   # insertion and merge sort
@pytest.mark.parametrize("largest", [1, 0])
def test_topk_lines_run_on_the_modules_threads(monkeypatch, impl, k, largest):
    monkeypatch.setenv("KILN_THREADS_IMPL", impl)
    model = topk_model(64, 1000, k, largest)     # 64000 elements: above the parallel threshold
    src = run_stages(model, "c").source.text
    assert "kiln_par_for(" in src and "kiln_pool_park();" not in src
    x = np.random.default_rng(k).standard_normal((64, 1000)).astype(np.float32)
    x[3, 10:20] = x[3, 0]                         # ties: the lower position first
    v, i = kiln.compile(model)(x)
    order = np.argsort(-x if largest else x, axis=1, kind="stable")[:, :k]
    np.testing.assert_array_equal(i, order)
    np.testing.assert_array_equal(v, np.take_along_axis(x, order, axis=1))


@pytest.mark.parametrize("impl", ["pool", "omp"])
def test_dft_lines_run_on_the_modules_threads(monkeypatch, impl):
    monkeypatch.setenv("KILN_THREADS_IMPL", impl)
    model = dft_model(300, 64)                   # 300 lines of 64 points: parallel
    src = run_stages(model, "c").source.text
    assert "kiln_par_for(" in src and "kiln_pool_park();" not in src
    x = np.random.default_rng(1).standard_normal((300, 64, 1)).astype(np.float32)
    y = kiln.compile(model)(x)
    want = np.fft.fft(x[..., 0], axis=1)
    np.testing.assert_allclose(y[..., 0], want.real, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(y[..., 1], want.imag, rtol=1e-4, atol=1e-4)


def resize_model(mode, shape, scales):
    return _model(helper.make_node("Resize", ["x", "", "scales"], ["y"], mode=mode),
                  [helper.make_tensor_value_info("x", F, shape)], [helper.make_tensor_value_info("y", F, None)],
                  [helper.make_tensor("scales", F, [len(scales)], scales)], opset=19)


@pytest.mark.parametrize("impl", ["pool", "omp"])
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_rows_run_on_the_modules_threads(monkeypatch, impl, mode):
    monkeypatch.setenv("KILN_THREADS_IMPL", impl)
    model = resize_model(mode, [2, 8, 40, 40], [1.0, 1.0, 2.0, 1.5])   # 2x8x80x60 outputs: parallel
    src = run_stages(model, "c").source.text
    assert "kiln_par_for(" in src and "kiln_pool_park();" not in src
    x = np.random.default_rng(2).standard_normal((2, 8, 40, 40)).astype(np.float32)
    want = kiln.compile(model, target="interpreter")(x)
    np.testing.assert_allclose(kiln.compile(model)(x), want, rtol=1e-5, atol=1e-5)
