"""scikit-learn models converted by skl2onnx, compiled by kiln on cpu and compared with ONNX
Runtime on fresh random rows (labels exactly, scores to rtol 1e-5), and with kiln's interpreter.

Needs the test extra (scikit-learn, skl2onnx, onnxruntime); skipped cleanly without them.
"""

from __future__ import annotations

import numpy as np
import pytest

sklearn = pytest.importorskip("sklearn")
skl2onnx = pytest.importorskip("skl2onnx")
ort = pytest.importorskip("onnxruntime")

import kiln  # noqa: E402
from kiln.errors import KilnError  # noqa: E402

RNG = np.random.default_rng(20261125)
N_FEATURES = 6


def _data(n=300):
    x = RNG.standard_normal((n, N_FEATURES)).astype(np.float32)
    y3 = (x[:, 0] + x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 0.5)
    yr = 2 * x[:, 0] + x[:, 3] * x[:, 4] + 0.1 * RNG.standard_normal(n)
    return x, y3, yr


def _convert(model, x, zipmap=False, opset=17):
    from sklearn.base import is_classifier
    from skl2onnx import to_onnx
    options = {id(model): {"zipmap": False}} if is_classifier(model) and not zipmap else None
    return to_onnx(model, x[:1], options=options, target_opset={"": opset, "ai.onnx.ml": 3})


def _compare(onx, feeds, rtol=1e-5, atol=1e-6):
    """kiln cpu (and the interpreter) against ONNX Runtime: integer outputs exactly."""
    data = onx.SerializeToString()
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    for target in ("cpu", "interpreter"):
        got = kiln.compile(data, target=target).run(feeds)
        assert set(got) == set(want)
        for name, w in want.items():
            g = got[name]
            assert g.shape == w.shape and g.dtype == w.dtype, (target, name, g.shape, w.shape, g.dtype, w.dtype)
            if w.dtype.kind in "iubO":
                np.testing.assert_array_equal(g, w, err_msg=f"{target} {name}")
            else:
                np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"{target} {name}")
    return want


def _fresh(n=64):
    x = RNG.standard_normal((n, N_FEATURES)).astype(np.float32)
    x[:, 5] = np.round(x[:, 5])  # some values exactly at split-like points
    return x


def _classes(y, k):
    return y if k == 3 else (y > 0).astype(np.int64)


@pytest.mark.parametrize("classes", [2, 3])
@pytest.mark.parametrize("kind", ["gb", "rf"])
def test_tree_classifiers(kind, classes):
    from sklearn.ensemble import GradientBoostingClassifier, RandomForestClassifier
    x, y3, _ = _data()
    m = (GradientBoostingClassifier(n_estimators=12, max_depth=3, random_state=0) if kind == "gb"
         else RandomForestClassifier(n_estimators=10, max_depth=6, random_state=0))
    m.fit(x, _classes(y3, classes))
    want = _compare(_convert(m, x), {"X": _fresh()})
    assert len(set(want["label"].tolist())) > 1  # the rows reach more than one class


@pytest.mark.parametrize("kind", ["gb", "rf"])
def test_tree_regressors(kind):
    from sklearn.ensemble import GradientBoostingRegressor, RandomForestRegressor
    x, _, yr = _data()
    m = (GradientBoostingRegressor(n_estimators=15, max_depth=3, random_state=0) if kind == "gb"
         else RandomForestRegressor(n_estimators=8, max_depth=7, random_state=0))
    m.fit(x, yr)
    _compare(_convert(m, x), {"X": _fresh()})


@pytest.mark.parametrize("classes", [2, 3])
@pytest.mark.parametrize("kernel,proba", [("linear", True), ("rbf", True), ("rbf", False), ("poly", False)])
def test_svc(kernel, proba, classes):
    from sklearn.svm import SVC
    x, y3, _ = _data(150)
    m = SVC(kernel=kernel, probability=proba, random_state=0).fit(x, _classes(y3, classes))
    want = _compare(_convert(m, x), {"X": _fresh()})
    assert len(set(want["label"].tolist())) > 1


@pytest.mark.parametrize("kernel", ["linear", "rbf"])
def test_svr(kernel):
    from sklearn.svm import SVR
    x, _, yr = _data(150)
    _compare(_convert(SVR(kernel=kernel).fit(x, yr), x), {"X": _fresh()}, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("classes", [2, 3])
def test_logistic_regression(classes):
    from sklearn.linear_model import LogisticRegression
    x, y3, _ = _data()
    want = _compare(_convert(LogisticRegression().fit(x, _classes(y3, classes)), x), {"X": _fresh()})
    assert len(set(want["label"].tolist())) > 1


def test_linear_regression():
    from sklearn.linear_model import LinearRegression
    x, _, yr = _data()
    _compare(_convert(LinearRegression().fit(x, yr), x), {"X": _fresh()}, atol=1e-5)


@pytest.mark.parametrize("clf", ["logistic", "gb"])
def test_pipeline_scaler_one_hot(clf):
    """StandardScaler on numeric columns and OneHotEncoder on categorical ones (ColumnTransformer),
    then a classifier; fresh rows include categories unseen in training (handle_unknown)."""
    from sklearn.compose import ColumnTransformer
    from sklearn.ensemble import GradientBoostingClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler
    n = 300
    x = np.hstack([RNG.standard_normal((n, 3)), RNG.integers(0, 4, (n, 2))]).astype(np.float32)
    y = ((x[:, 0] > 0) ^ (x[:, 3] == 2)).astype(np.int64) + (x[:, 4] == 1)
    pre = ColumnTransformer([("num", StandardScaler(), [0, 1, 2]),
                             ("cat", OneHotEncoder(handle_unknown="ignore"), [3, 4])])
    model = LogisticRegression(max_iter=500) if clf == "logistic" else GradientBoostingClassifier(
        n_estimators=10, max_depth=3, random_state=0)
    pipe = Pipeline([("pre", pre), ("clf", model)]).fit(x, y)
    from skl2onnx import to_onnx
    onx = to_onnx(pipe, x[:1], options={id(model): {"zipmap": False}}, target_opset={"": 17, "ai.onnx.ml": 3})
    fresh = np.hstack([RNG.standard_normal((64, 3)), RNG.integers(0, 6, (64, 2))]).astype(np.float32)
    want = _compare(onx, {"X": fresh})
    assert len(set(want["label"].tolist())) > 1


def test_tree_one_row_and_batches():
    """One compiled model serves several batch sizes (1 row, many rows) with equal results."""
    from sklearn.ensemble import RandomForestClassifier
    x, y3, _ = _data()
    m = RandomForestClassifier(n_estimators=20, max_depth=8, random_state=1).fit(x, y3)
    onx = _convert(m, x)
    compiled = kiln.compile(onx.SerializeToString())
    rows = _fresh(300)
    many = compiled.run({"X": rows})
    for i in (0, 7, 299):
        one = compiled.run({"X": rows[i:i + 1]})
        np.testing.assert_array_equal(one["label"], many["label"][i:i + 1])
        np.testing.assert_array_equal(one["probabilities"], many["probabilities"][i:i + 1])
    _compare(onx, {"X": rows})


@pytest.mark.parametrize("kind", ["rf", "gb2", "logistic", "svc"])
def test_string_class_labels(kind):
    """Classes named by strings (classlabels_strings): labels come back as str, as from ORT."""
    from sklearn.ensemble import GradientBoostingClassifier, RandomForestClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.svm import SVC
    x, y3, _ = _data(200)
    names = np.array(["setosa", "virginica", "été"], dtype=object)
    y = names[_classes(y3, 2 if kind == "gb2" else 3)]
    m = {"rf": RandomForestClassifier(n_estimators=6, max_depth=5, random_state=0),
         "gb2": GradientBoostingClassifier(n_estimators=8, max_depth=2, random_state=0),
         "logistic": LogisticRegression(), "svc": SVC(probability=True, random_state=0)}[kind].fit(x, y)
    want = _compare(_convert(m, x), {"X": _fresh()})
    assert len(set(want["label"].tolist())) > 1


def test_zipmap_refused_clearly():
    """ZipMap outputs a sequence of maps, which kiln has no type for: a clear error naming it."""
    from sklearn.linear_model import LogisticRegression
    x, y3, _ = _data()
    onx = _convert(LogisticRegression().fit(x, y3), x, zipmap=True)
    with pytest.raises(KilnError, match="ZipMap"):
        kiln.compile(onx.SerializeToString())
