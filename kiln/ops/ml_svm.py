"""Support vector machines of `ai.onnx.ml`: SVMClassifier and SVMRegressor (what
scikit-learn's SVC/SVR become through skl2onnx).

Semantics follow ONNX Runtime, in float32 as it computes:
- kernels: LINEAR x.v, POLY (gamma x.v + coef0)^degree, RBF exp(-gamma |x - v|^2),
  SIGMOID tanh(gamma x.v + coef0); dot products are summed in double, then rounded;
- with support vectors (libsvm mode), the classifier scores each pair of classes i < j
  (one-vs-one) and the class with most votes is the label; with prob_a/prob_b, the pairs'
  sigmoid probabilities are coupled into class probabilities (Wu, Lin and Weng's method,
  libsvm's multiclass_probability); without, the scores are the pairs' decision values (two
  classes: written as [-s, s] under NONE, [1 - s, s] otherwise);
- without support vectors (liblinear mode) each class scores x.coef[c] + rho[0];
- SVMRegressor ignores post_transform, as ONNX Runtime does; one_class maps to +-1.

Their native lowerings live in kiln.lower.ml_svm.
"""

from __future__ import annotations

import numpy as np

from kiln.dtypes import DType
from kiln.graph.types import TensorType
from kiln.ops.ml_common import ML, numeric_input, post_name, post_transform, rows_type
from kiln.ops.registry import OPAQUE, op
from kiln.ops.strings import string_array


_KERNELS = ("LINEAR", "POLY", "RBF", "SIGMOID")
F32 = np.float32


def _s(v):
    return v.decode() if isinstance(v, bytes) else v


def _kernel_parts(ctx):
    kind = _s(ctx.attr("kernel_type", "LINEAR"))
    if kind not in _KERNELS:
        ctx.fail(f"kernel_type must be one of {', '.join(_KERNELS)}, got {kind!r}")
    params = list(ctx.attr("kernel_params", [])) + [0.0, 0.0, 0.0]
    return kind, F32(params[0]), F32(params[1]), F32(params[2])


def _kernel(x: np.ndarray, v: np.ndarray, kind: str, gamma, coef0, degree, c=F32(0)) -> np.ndarray:
    """[N, V] float32 kernel values of rows x [N, F] against vectors v [V, F]; `c` is added
    to a LINEAR kernel (liblinear's rho)."""
    if kind == "RBF":
        acc = np.zeros((len(x), len(v)), F32)
        for f in range(x.shape[1]):
            d = x[:, None, f] - v[None, :, f]
            acc = acc + d * d
        return np.exp(-gamma * acc).astype(F32)
    dot = (x.astype(np.float64) @ v.T.astype(np.float64)).astype(F32)
    if kind == "LINEAR":
        return dot + c
    d = gamma * dot + coef0
    if kind == "SIGMOID":
        return np.tanh(d).astype(F32)
    return (d * d if degree == 2 else d * d * d if degree == 3 else np.power(d, degree)).astype(F32)


# ---- SVMRegressor ----

def _regressor_parts(ctx, width: int):
    kind, gamma, coef0, degree = _kernel_parts(ctx)
    coef = np.asarray(ctx.attr("coefficients"), F32).ravel()
    rho = np.asarray(ctx.attr("rho"), F32).ravel()
    n = int(ctx.attr("n_supports", 0))
    if not len(rho):
        ctx.fail("rho is empty")
    if n > 0:
        sv = np.asarray(ctx.attr("support_vectors"), F32).ravel()
        if sv.size != n * width or coef.size < n:
            ctx.fail(f"{sv.size} support vector values and {coef.size} coefficients for {n} vectors x "
                     f"{width} features")
        return kind, gamma, coef0, degree, sv.reshape(n, width), coef[:n], rho
    if coef.size != width:
        ctx.fail(f"{coef.size} coefficients for {width} features (liblinear mode)")
    return "LINEAR", gamma, coef0, degree, None, coef, rho


def _infer_svm_regressor(ctx):
    return [rows_type(ctx, numeric_input(ctx), 1)]


@op("SVMRegressor", infer=_infer_svm_regressor, domain=ML, fusion=OPAQUE)
def svm_regressor(ctx, x):
    x = np.atleast_2d(x).astype(F32)
    kind, gamma, coef0, degree, sv, coef, rho = _regressor_parts(ctx, x.shape[1])
    if sv is None:
        y = _kernel(x, coef[None, :], "LINEAR", gamma, coef0, degree, rho[0])
    else:
        k = _kernel(x, sv, kind, gamma, coef0, degree)
        y = ((k * coef).astype(np.float64).sum(1, keepdims=True)).astype(F32) + rho[0]
    if int(ctx.attr("one_class", 0)):
        y = np.where(y > 0, F32(1), F32(-1))
    return y.astype(F32)


# ---- SVMClassifier ----

def _classifier_parts(ctx, width: int) -> dict:
    ints, strs = ctx.attr("classlabels_ints", None), ctx.attr("classlabels_strings", None)
    if (ints is None) == (strs is None):
        ctx.fail("exactly one of classlabels_ints and classlabels_strings must be given")
    labels = [int(v) for v in ints] if ints is not None else [_s(v) for v in strs]
    nc = len(labels)
    if nc < 2:
        ctx.fail(f"{nc} class label(s): a classifier needs at least two")
    kind, gamma, coef0, degree = _kernel_parts(ctx)
    coef = np.asarray(ctx.attr("coefficients"), F32).ravel()
    rho = np.asarray(ctx.attr("rho"), F32).ravel()
    pa = np.asarray(ctx.attr("prob_a", []), F32).ravel()
    pb = np.asarray(ctx.attr("prob_b", []), F32).ravel()
    per_class = [int(v) for v in ctx.attr("vectors_per_class", [])]
    nv = sum(per_class)
    pairs = nc * (nc - 1) // 2
    if len(pa) != len(pb):
        ctx.fail(f"prob_a has {len(pa)} entries, prob_b {len(pb)}")
    out = dict(labels=labels, strings=strs is not None, kind=kind, gamma=gamma, coef0=coef0, degree=degree,
               rho=rho, pa=pa, pb=pb, per_class=per_class, post=post_name(ctx, ctx.attr("post_transform", "NONE")),
               all_positive=bool((coef >= 0).all()), proba=len(pa) > 0)
    if nv > 0:
        sv = np.asarray(ctx.attr("support_vectors"), F32).ravel()
        if len(per_class) != nc or sv.size != nv * width or coef.size < (nc - 1) * nv or len(rho) < pairs or \
                (len(pa) and len(pa) < pairs) or min(per_class) < 0:
            ctx.fail(f"inconsistent sizes: {nc} classes, vectors_per_class {per_class}, {sv.size} support "
                     f"vector values for {width} features, {coef.size} coefficients, {len(rho)} rho, "
                     f"{len(pa)} prob_a")
        out.update(mode="svc", sv=sv.reshape(nv, width), coef=coef[:(nc - 1) * nv].reshape(nc - 1, nv),
                   columns=nc if len(pa) else (2 if nc == 2 else pairs))
    else:
        if coef.size != nc * width or not len(rho):
            ctx.fail(f"{coef.size} coefficients for {nc} classes x {width} features (liblinear mode), "
                     f"{len(rho)} rho")
        out.update(mode="linear", coef=coef.reshape(nc, width), columns=nc, kind="LINEAR")
    return out


def _infer_svm_classifier(ctx):
    t = numeric_input(ctx)
    width = t.shape[-1] if t.shape else None
    if not isinstance(width, int):
        ctx.fail(f"X needs a known feature count, got {t}")
    p = _classifier_parts(ctx, width)
    z = rows_type(ctx, t, p["columns"])
    return [TensorType(DType.string if p["strings"] else DType.int64, z.shape[:1]), z]


def _logistic(v):
    e = F32(1) / (F32(1) + np.exp(-np.abs(v)).astype(F32))
    return np.where(v < 0, F32(1) - e, e).astype(F32)


def _couple(nc: int, r: np.ndarray) -> np.ndarray:
    """libsvm's multiclass_probability in float32, as ONNX Runtime runs it: class
    probabilities p [nc] from pairwise ones r [nc, nc]."""
    q = np.zeros((nc, nc), F32)
    p = np.full(nc, F32(1) / F32(nc), F32)
    for i in range(nc):
        for j in range(i):
            q[i, i] = q[i, i] + r[j, i] * r[j, i]
            q[i, j] = q[j, i]
        for j in range(i + 1, nc):
            q[i, i] = q[i, i] + r[j, i] * r[j, i]
            q[i, j] = -r[j, i] * r[i, j]
    eps = F32(0.005) / F32(nc)
    qp = np.zeros(nc, F32)
    for _ in range(100):
        pqp = F32(0)
        for i in range(nc):
            qp[i] = F32(0)
            for j in range(nc):
                qp[i] = qp[i] + q[i, j] * p[j]
            pqp = pqp + p[i] * qp[i]
        if max(abs(qp[i] - pqp) for i in range(nc)) < eps:
            break
        for i in range(nc):
            diff = (-qp[i] + pqp) / q[i, i]
            p[i] = p[i] + diff
            pqp = (pqp + diff * (diff * q[i, i] + F32(2) * qp[i])) / (F32(1) + diff) / (F32(1) + diff)
            for j in range(nc):
                qp[j] = (qp[j] + diff * q[i, j]) / (F32(1) + diff)
                p[j] = p[j] / (F32(1) + diff)
    return p


@op("SVMClassifier", infer=_infer_svm_classifier, domain=ML, fusion=OPAQUE)
def svm_classifier(ctx, x):
    x = np.atleast_2d(x).astype(F32)
    p = _classifier_parts(ctx, x.shape[1])
    labels, nc, n = p["labels"], len(p["labels"]), len(x)
    if p["mode"] == "linear":
        z = _kernel(x, p["coef"], "LINEAR", p["gamma"], p["coef0"], p["degree"], p["rho"][0])
        best = np.argmax(z, 1)
        top = z[np.arange(n), best]
        if nc == 2 and not p["proba"]:
            win = (top >= 0.5) if p["all_positive"] else (top > 0)
            best = np.where(win, 1, best)
        y = [labels[i] for i in best.tolist()]
        z = post_transform(ctx, z.astype(np.float64), p["post"])
    else:
        k = _kernel(x, p["sv"], p["kind"], p["gamma"], p["coef0"], p["degree"])
        start = np.concatenate([[0], np.cumsum(p["per_class"])]).astype(int)
        coef = p["coef"]
        scores, votes = [], np.zeros((n, nc), np.int64)
        idx = 0
        for i in range(nc - 1):
            for j in range(i + 1, nc):
                si, sj = slice(start[i], start[i + 1]), slice(start[j], start[j + 1])
                prods = np.concatenate([coef[j - 1, si] * k[:, si], coef[i, sj] * k[:, sj]], 1).astype(np.float64)
                s = prods.sum(1) + np.float64(p["rho"][idx])
                scores.append(s.astype(F32))
                votes[np.arange(n), np.where(s > 0, i, j)] += 1
                idx += 1
        scores = np.stack(scores, 1)
        y = [labels[i] for i in np.argmax(votes, 1).tolist()]
        if p["proba"]:
            z = np.zeros((n, nc), F32)
            for row in range(n):
                r = np.zeros((nc, nc), F32)
                idx = 0
                for i in range(nc - 1):
                    for j in range(i + 1, nc):
                        v = F32(1) - _logistic(scores[row, idx] * p["pa"][idx] + p["pb"][idx])
                        v = min(max(v, F32(1e-7)), F32(1) - F32(1e-7))
                        r[i, j], r[j, i] = v, F32(1) - v
                        idx += 1
                z[row] = _couple(nc, r)
            z = post_transform(ctx, z.astype(np.float64), p["post"])
        elif nc == 2:
            s = scores[:, 0]
            if p["post"] == "PROBIT":
                z = np.stack([post_transform(ctx, s.astype(np.float64), "PROBIT"), np.zeros(n)], 1)
            else:
                z = np.stack([-s, s] if p["post"] == "NONE" else [F32(1) - s, s], 1)
        else:
            z = post_transform(ctx, scores.astype(np.float64), p["post"])
    y = string_array(y, (n,)) if p["strings"] else np.asarray(y, np.int64)
    return y, np.asarray(z, F32)
