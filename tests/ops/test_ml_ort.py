"""ai.onnx.ml nodes built with onnx.helper, compiled by kiln on cpu and compared with ONNX
Runtime (and kiln's interpreter): the encodings and corners skl2onnx does not emit
(TreeEnsemble opset 5, classifier base values, post transforms, liblinear SVMs, ...)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.errors import KilnError

ort = pytest.importorskip("onnxruntime")

ML = "ai.onnx.ml"
RNG = np.random.default_rng(11)


def _model(op, attrs, x, outputs, ml_opset=3):
    node = helper.make_node(op, ["X"], [n for n, _ in outputs], domain=ML, **attrs)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", helper.np_dtype_to_tensor_dtype(x.dtype),
                                                                      [None, x.shape[1]])],
                          [helper.make_tensor_value_info(n, t, None) for n, t in outputs])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 19), helper.make_opsetid(ML, ml_opset)],
                             ir_version=9)


def _compare(model, x, rtol=1e-5, atol=1e-6):
    data = model.SerializeToString()
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"X": x})
    for target in ("cpu", "interpreter"):
        got = list(kiln.compile(data, target=target).run({"X": x}).values())
        for g, w in zip(got, want):
            assert g.shape == w.shape, (target, g.shape, w.shape)
            if w.dtype.kind in "iu":
                np.testing.assert_array_equal(g, w, err_msg=target)
            else:
                np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=target)
    return want


def _legacy_trees(n_trees, depth, n_feat, targets, per_leaf, prefix, modes=("BRANCH_LEQ",), positive=False):
    """Random trees in the (tree id, node id) encoding; each leaf feeds `per_leaf` targets."""
    a = {k: [] for k in ("tree", "node", "feat", "mode", "value", "tid", "fid", "miss", "ct", "cn", "ci", "cw")}
    for tree in range(n_trees):
        count = [0]

        def build(d, tree=tree, count=count):
            k, nid = len(a["tree"]), count[0]
            count[0] += 1
            leaf = d == 0 or (d < depth and RNG.random() < 0.2)
            a["tree"].append(tree)
            a["node"].append(nid)
            a["feat"].append(int(RNG.integers(0, n_feat)))
            a["mode"].append("LEAF" if leaf else str(RNG.choice(modes)))
            a["value"].append(float(np.float32(RNG.standard_normal())))
            a["miss"].append(int(RNG.random() < 0.3))
            a["tid"].append(0)
            a["fid"].append(0)
            if leaf:
                for tg in RNG.choice(targets, per_leaf, replace=False):
                    a["ct"].append(tree)
                    a["cn"].append(nid)
                    a["ci"].append(int(tg))
                    a["cw"].append(float(RNG.uniform(0.05, 1) if positive else RNG.standard_normal()))
            else:
                a["tid"][k], a["fid"][k] = build(d - 1), build(d - 1)
            return nid

        build(depth)
    return dict(nodes_treeids=a["tree"], nodes_nodeids=a["node"], nodes_featureids=a["feat"], nodes_modes=a["mode"],
                nodes_values=a["value"], nodes_truenodeids=a["tid"], nodes_falsenodeids=a["fid"],
                nodes_missing_value_tracks_true=a["miss"], **{f"{prefix}_treeids": a["ct"],
                                                              f"{prefix}_nodeids": a["cn"], f"{prefix}_ids": a["ci"],
                                                              f"{prefix}_weights": a["cw"]})


def _x(n=200, f=4, nan=True):
    x = RNG.standard_normal((n, f)).astype(np.float32)
    if nan:
        x[RNG.random(x.shape) < 0.05] = np.nan
    return x


@pytest.mark.parametrize("classes,class_ids,base,post,positive", [
    (3, [0, 1, 2], [0.1, -0.2, 0.3], "SOFTMAX", False),
    (3, [0, 1, 2], None, "LOGISTIC", False),
    (4, [0, 1, 2, 3], None, "NONE", True),
    (2, [0], [0.4], "LOGISTIC", False),       # gradient boosting, binary
    (2, [0], None, "NONE", True),             # random forest, binary
    (2, [0], None, "NONE", False),
    (2, [0], [0.25, 0.25], "NONE", False),
    (2, [0, 1], [0.5, -0.5], "SOFTMAX", False),
    (2, [0, 1], None, "NONE", True),
    (2, [1], None, "LOGISTIC", False),
    (2, [1], [0.3], "NONE", False),
    (2, [1], [0.25, 0.5], "NONE", False),
    (2, [0], [0.25, 0.5], "LOGISTIC", True),
    (2, [0], [0.3], "SOFTMAX", False),
])
def test_tree_classifier(classes, class_ids, base, post, positive):
    attrs = _legacy_trees(6, 4, 4, class_ids, 1 if len(class_ids) == 1 else 2, "class",
                          modes=("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT"), positive=positive)
    attrs.update(classlabels_int64s=list(range(10, 10 + classes)), post_transform=post)
    if base is not None:
        attrs["base_values"] = base
    _compare(_model("TreeEnsembleClassifier", attrs, _x(), [("Y", TensorProto.INT64), ("Z", TensorProto.FLOAT)]),
             _x())


@pytest.mark.parametrize("agg", ["SUM", "AVERAGE", "MIN", "MAX"])
def test_tree_regressor(agg):
    attrs = _legacy_trees(5, 4, 4, [0, 1, 2], 2, "target", modes=("BRANCH_LEQ", "BRANCH_GT", "BRANCH_EQ"))
    attrs.update(n_targets=3, aggregate_function=agg, base_values=[0.5, 0.0, -1.0])
    _compare(_model("TreeEnsembleRegressor", attrs, _x(), [("Y", TensorProto.FLOAT)]), _x())


def test_tree_regressor_many_trees_few_rows():
    """Few rows and many trees: the trees run in parallel (15 rows), or the lanes take trees
    (1 row); both sum in tree order, so every row equals the row computed alone."""
    attrs = _legacy_trees(200, 8, 6, [0], 1, "target")
    attrs.update(n_targets=1)
    model = _model("TreeEnsembleRegressor", attrs, _x(f=6), [("Y", TensorProto.FLOAT)])
    x = _x(f=6)[:15]
    want = _compare(model, x)[0]
    compiled = kiln.compile(model.SerializeToString())
    for i in (0, 3, 14):
        np.testing.assert_array_equal(compiled.run({"X": x[i:i + 1]})["Y"], compiled.run({"X": x})["Y"][i:i + 1])
    assert np.isfinite(want).all()


def test_tree_ensemble_opset5():
    """TreeEnsemble (ai.onnx.ml opset 5) with every mode, NaN tracks and set membership."""
    nodes = dict(nodes_featureids=[0, 1, 2, 0], nodes_modes=numpy_helper.from_array(np.array([0, 6, 3, 4], np.uint8)),
                 nodes_splits=numpy_helper.from_array(np.array([0.5, 0.0, -0.25, 1.0], np.float32)),
                 nodes_truenodeids=[1, 0, 1, 2], nodes_trueleafs=[0, 1, 1, 1],
                 nodes_falsenodeids=[2, 3, 3, 4], nodes_falseleafs=[0, 0, 1, 1],
                 nodes_missing_value_tracks_true=[1, 0, 0, 1],
                 membership_values=numpy_helper.from_array(np.array([1, 2, np.nan], np.float32)),
                 leaf_targetids=[0, 1, 0, 1, 0], leaf_weights=numpy_helper.from_array(
                     np.array([1.5, -2.0, 0.25, 3.0, -0.5], np.float32)),
                 tree_roots=[0], n_targets=2, aggregate_function=1, post_transform=0)
    x = np.round(RNG.standard_normal((100, 3)) * 2).astype(np.float32) / 2
    x[RNG.random(x.shape) < 0.1] = np.nan
    try:
        ort.InferenceSession(_model("TreeEnsemble", nodes, x, [("Y", TensorProto.FLOAT)], 5).SerializeToString(),
                             providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - an older ONNX Runtime without opset 5
        pytest.skip(f"ONNX Runtime cannot run TreeEnsemble-5: {str(e).splitlines()[0]}")
    want = _compare(_model("TreeEnsemble", nodes, x, [("Y", TensorProto.FLOAT)], 5), x)[0]
    one = kiln.compile(_model("TreeEnsemble", nodes, x, [("Y", TensorProto.FLOAT)], 5).SerializeToString())
    for i in range(0, 100, 7):  # one row: the lanes walk trees, not rows
        np.testing.assert_array_equal(one.run({"X": x[i:i + 1]})["Y"], want[i:i + 1])


@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX"])
def test_linear_classifier_one_column(post):
    x = _x(nan=False)
    attrs = dict(coefficients=list(RNG.standard_normal(4)), intercepts=[0.3], classlabels_ints=[3, 8],
                 post_transform=post)
    _compare(_model("LinearClassifier", attrs, x, [("Y", TensorProto.INT64), ("Z", TensorProto.FLOAT)]), x)


@pytest.mark.parametrize("classes", [2, 3])
def test_svm_classifier_liblinear(classes):
    x = _x(nan=False)
    attrs = dict(coefficients=list(RNG.standard_normal(4 * classes)), rho=[0.2], kernel_type="LINEAR", kernel_params=[0.1, 0.0, 3.0],
                 classlabels_ints=list(range(classes)), post_transform="NONE")
    _compare(_model("SVMClassifier", attrs, x, [("Y", TensorProto.INT64), ("Z", TensorProto.FLOAT)]), x)


def test_svm_regressor_one_class():
    x = _x(nan=False)
    attrs = dict(coefficients=list(RNG.standard_normal(5)), support_vectors=list(RNG.standard_normal(20)),
                 n_supports=5, rho=[0.1], kernel_type="RBF", kernel_params=[0.5, 0.0, 3.0], one_class=1)
    _compare(_model("SVMRegressor", attrs, x, [("Y", TensorProto.FLOAT)]), x)


def test_one_hot_encoder_unknown_with_zeros_0_fails():
    x = np.array([[1, 2], [5, 1]], np.int64)
    node = helper.make_node("OneHotEncoder", ["X"], ["Y"], domain=ML, cats_int64s=[1, 2, 3], zeros=0)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TensorProto.INT64, [2, 2])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19), helper.make_opsetid(ML, 1)])
    for target in ("cpu", "interpreter"):
        compiled = kiln.compile(model.SerializeToString(), target=target)
        with pytest.raises(KilnError, match="categories|zeros"):
            compiled.run({"X": x})
        ok = compiled.run({"X": np.array([[1, 2], [3, 1]], np.int64)})["Y"]
        np.testing.assert_array_equal(ok.argmax(-1), [[0, 1], [2, 0]])


def _small(op, attrs, x, out=TensorProto.FLOAT, ml_opset=1):
    node = helper.make_node(op, ["X"], ["Y"], domain=ML, **attrs)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", helper.np_dtype_to_tensor_dtype(x.dtype),
                                                                      list(x.shape))],
                          [helper.make_tensor_value_info("Y", out, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 19), helper.make_opsetid(ML, ml_opset)],
                             ir_version=9)


@pytest.mark.parametrize("op,attrs,x", [
    # MAX on non-negative rows only: ONNX Runtime divides by the signed max, the ONNX reference
    # and scikit-learn (and kiln) by the greatest magnitude
    ("Normalizer", {"norm": "MAX"}, np.abs(RNG.standard_normal((6, 5))).astype(np.float32)),
    ("Normalizer", {"norm": "L1"}, RNG.standard_normal((6, 5)).astype(np.float32)),
    ("Normalizer", {"norm": "L2"}, RNG.standard_normal((6, 5)).astype(np.float32)),
    ("Scaler", {"offset": [0.5, -1.0, 0.0, 2.0], "scale": [2.0, 0.5, -1.0, 3.0]},
     RNG.standard_normal((5, 4)).astype(np.float32)),
    ("Binarizer", {"threshold": 0.25}, RNG.standard_normal((5, 4)).astype(np.float32)),
    ("Imputer", {"imputed_value_floats": [1.0, 2.0, 3.0], "replaced_value_float": float("nan")},
     np.where(RNG.random((6, 3)) < 0.3, np.nan, RNG.standard_normal((6, 3))).astype(np.float32)),
    ("ArrayFeatureExtractor", None, RNG.standard_normal((4, 6)).astype(np.float32)),
])
def test_small_ops(op, attrs, x):
    if op == "ArrayFeatureExtractor":
        node = helper.make_node(op, ["X", "I"], ["Y"], domain=ML)
        g = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(x.shape))],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.array([5, 0, 2], np.int64), "I")])
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19), helper.make_opsetid(ML, 1)],
                                  ir_version=9)
    else:
        model = _small(op, attrs, x)
    _compare(model, x)


def test_feature_vectorizer():
    a, b = RNG.standard_normal((4, 3)).astype(np.float32), RNG.standard_normal((4, 2)).astype(np.float32)
    node = helper.make_node("FeatureVectorizer", ["A", "B"], ["Y"], domain=ML, inputdimensions=[3, 2])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [4, 3]),
                                        helper.make_tensor_value_info("B", TensorProto.FLOAT, [4, 2])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19), helper.make_opsetid(ML, 1)],
                             ir_version=9).SerializeToString()
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"A": a, "B": b})[0]
    for target in ("cpu", "interpreter"):
        np.testing.assert_allclose(kiln.compile(data, target=target).run({"A": a, "B": b})["Y"], want, rtol=1e-6)
