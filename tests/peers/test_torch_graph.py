"""The torch peer: kiln's imported graph run by eager torch, checked against ONNX Runtime.

Skipped without torch (CI installs none; `pip install -e ".[torch]"` brings it).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

from benchmarks.models import MODELS, inputs_for  # noqa: E402
from kiln import KilnError  # noqa: E402
from kiln.bench import compare, ort_session, peer  # noqa: E402
from kiln.peers.torch_graph import TorchGraph  # noqa: E402


def ort_outputs(model: onnx.ModelProto, feeds: dict) -> dict:
    sess = ort_session(model, 1)
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


@pytest.mark.parametrize("name", list(MODELS))
def test_benchmark_models_match_onnxruntime(name):
    model = MODELS[name]()
    feeds = inputs_for(name, model, seed=3)
    got = TorchGraph(model, threads=1)(feeds)
    want = ort_outputs(model, feeds)
    assert set(got) == set(want)
    for k, w in want.items():
        assert np.abs(w).max() > 0
        assert got[k].dtype == w.dtype and got[k].shape == w.shape
        np.testing.assert_allclose(got[k], w, rtol=1e-4, atol=2e-5)


def single(op: str, inputs: dict, consts: dict | None = None, n_out: int = 1, opset: int = 17, **attrs):
    """(a one-node model, its feeds): `inputs` become graph inputs, `consts` initializers
    (a None const: the optional input left out)."""
    consts = consts or {}
    names = ["" if consts.get(k, 0) is None else k for k in list(inputs) + list(consts)]
    while names and not names[-1]:
        names.pop()
    outs = [f"y{k}" for k in range(n_out)]
    node = helper.make_node(op, names, outs, name=f"the_{op.lower()}", **attrs)
    graph = helper.make_graph(
        [node], op, [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                     for k, v in inputs.items()],
        [helper.make_empty_tensor_value_info(o) for o in outs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items() if v is not None])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model, inputs


rng = np.random.default_rng(0)
X4 = rng.standard_normal((2, 3, 7, 6)).astype(np.float32)
X3 = rng.standard_normal((2, 5, 6)).astype(np.float32)
I64 = lambda *v: np.array(v, np.int64)  # noqa: E731

CASES = {
    "conv same_upper stride 2": single("Conv", {"x": X4}, {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32)},
                                       auto_pad="SAME_UPPER", strides=[2, 2]),
    "conv asymmetric pads, groups": single("Conv", {"x": X4[:, :2].repeat(2, 1)},
                                           {"w": rng.standard_normal((4, 2, 3, 2)).astype(np.float32),
                                            "b": rng.standard_normal(4).astype(np.float32)},
                                           pads=[1, 0, 0, 1], group=2),
    "maxpool asymmetric pads": single("MaxPool", {"x": X4}, kernel_shape=[3, 3], pads=[0, 1, 1, 0], strides=[2, 2]),
    "maxpool ceil": single("MaxPool", {"x": X4}, kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
    "averagepool pads excluded": single("AveragePool", {"x": X4}, kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
    "averagepool pads included": single("AveragePool", {"x": X4}, kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                                        count_include_pad=1),
    "globalmaxpool": single("GlobalMaxPool", {"x": X4}),
    "gemm transA alpha beta": single("Gemm", {"a": X3[0].T.copy()}, {"b": X3[1].T.copy(), "c": np.float32([0.5])},
                                     transA=1, alpha=0.5, beta=2.0),
    "softmax opset 11 coerces to 2-D": single("Softmax", {"x": X4}, opset=11, axis=1),
    "softmax opset 13": single("Softmax", {"x": X4}, axis=2),
    "flatten negative axis": single("Flatten", {"x": X4}, axis=-2),
    "reshape with 0 and -1": single("Reshape", {"x": X4}, {"s": I64(0, -1, 6)}),
    "transpose default perm": single("Transpose", {"x": X3}),
    "squeeze axes input": single("Squeeze", {"x": X4[:, :1]}, {"a": I64(1)}),
    "unsqueeze opset 11 attr": single("Unsqueeze", {"x": X3}, opset=11, axes=[0, -1]),
    "concat": single("Concat", {"x": X3, "y": X3[:, :2]}, axis=1),
    "split sizes": single("Split", {"x": X3}, {"s": I64(2, 4)}, n_out=2, axis=2),
    "split equal opset 11": single("Split", {"x": X3}, n_out=3, opset=11, axis=2),
    "slice negative step": single("Slice", {"x": X3}, {"s": I64(-1, 4), "e": I64(-100, 0), "a": I64(2, 1),
                                                      "k": I64(-2, -1)}),
    "slice clamps": single("Slice", {"x": X3}, {"s": I64(1), "e": I64(1000), "a": I64(-1)}),
    "gather negative indices": single("Gather", {"x": X3}, {"i": np.array([[-1, 0], [2, -3]], np.int64)}, axis=1),
    "shape start": single("Shape", {"x": X4}, start=1),
    "expand bidirectional": single("Expand", {"x": X3[:, :1, :]}, {"s": I64(3, 1, 1, 1)}),
    "where": single("Where", {"c": X3 > 0, "x": X3, "y": -X3}),
    "cast to int32": single("Cast", {"x": X3 * 10}, to=T.INT32),
    "integer div truncates": single("Div", {"a": I64(7, -7, 9)}, {"b": I64(2, 2, -4)}),
    "pow": single("Pow", {"x": np.abs(X3)}, {"p": np.float32(1.5)}),
    "clip inputs": single("Clip", {"x": X3}, {"lo": np.float32(-0.5), "hi": np.float32(0.7)}),
    "clip only max": single("Clip", {"x": X3}, {"lo": None, "hi": np.float32(0.7)}),
    "reducemean opset 18 axes input": single("ReduceMean", {"x": X3}, {"a": I64(-1, 0)}, opset=18, keepdims=0),
    "reducesum no axes": single("ReduceSum", {"x": X3}),
    "scalar in, scalar out": single("Neg", {"x": np.array(2.5, np.float32)}),
    "layernorm axis 1": single("LayerNormalization", {"x": X3}, {"s": np.float32(rng.standard_normal((5, 6))),
                                                                 "b": np.float32(rng.standard_normal((5, 6)))},
                               axis=1),
    "batchnorm": single("BatchNormalization", {"x": X4}, {k: np.float32(rng.uniform(0.5, 1.5, 3))
                                                          for k in ("s", "b", "m", "v")}),
    "pad reflect": single("Pad", {"x": X4}, {"p": I64(0, 0, 1, 2, 0, 0, 2, 1)}, mode="reflect"),
    "constantofshape": single("ConstantOfShape", {"s": I64(2, 3)}, value=numpy_helper.from_array(np.float32([1.5]))),
    "range": single("Range", {"a": np.array(1, np.float32)}, {"b": np.float32(9), "d": np.float32(1.5)}),
    "erf": single("Erf", {"x": X3}),
    "leakyrelu": single("LeakyRelu", {"x": X3}, alpha=0.2),
    "hardsigmoid": single("HardSigmoid", {"x": X3}),
    "argmax keepdims 0": single("ArgMax", {"x": X3}, axis=1, keepdims=0),
    "matmul broadcast": single("MatMul", {"a": X3}, {"b": X3[0].T.copy()}),
    "einsum": single("Einsum", {"a": X3, "b": X3}, equation="bij,bkj->bik"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_op_matches_onnxruntime(case):
    model, feeds = CASES[case]
    want = ort_outputs(model, feeds)
    got = TorchGraph(model, threads=1)(feeds)
    assert set(got) == set(want)
    for k, w in want.items():
        assert got[k].dtype == w.dtype and got[k].shape == w.shape, (got[k].dtype, got[k].shape, w.shape)
        np.testing.assert_allclose(got[k], w, rtol=1e-5, atol=1e-6)


def test_unsupported_ops_are_listed_before_running():
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="fine"),
             helper.make_node("Frobnicate", ["a"], ["b"], name="frob_1", domain="com.example"),
             helper.make_node("NonMaxSuppression", ["b", "b"], ["c"], name="nms_2"),
             helper.make_node("Cast", ["b"], ["y"], name="to_f8", to=T.FLOAT8E4M3FN)]
    graph = helper.make_graph(nodes, "bad", [helper.make_tensor_value_info("x", T.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", T.FLOAT8E4M3FN, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.example", 1)])
    with pytest.raises(KilnError, match="cannot run 3 node") as e:
        TorchGraph(model)
    for word in ("com.example::Frobnicate", "'frob_1'", "NonMaxSuppression", "'nms_2'", "float8e4m3fn",
                 "'to_f8'"):
        assert word in str(e.value)
    assert "'fine'" not in str(e.value)


def test_bench_peer_runs_a_file(tmp_path):
    model = MODELS["mlp"](batch=4)
    onnx.save(model, tmp_path / "mlp.onnx")
    feeds = inputs_for("mlp", model, seed=5)
    got = peer("torch", str(tmp_path / "mlp.onnx"), 1)(feeds)
    assert compare(got, ort_outputs(model, feeds), 1e-4, 1e-5)["ok"]
