"""Native lowerings of SVMClassifier and SVMRegressor (kiln.ops.ml_svm): the kernels of
kiln/codegen/c_src/svm.c (and svm_couple.c for probabilities), computing in float32 as ONNX
Runtime does (see kiln.ops.ml_svm for the semantics), called from a row loop written per node
with the support vectors and coefficients baked in as tables.
"""

from __future__ import annotations

import numpy as np

from kiln.codegen.csource import c_source
from kiln.dtypes import DType
from kiln.lower.ml_common import c_labels, c_post_transform, c_table, c_type, label_extern, rows_width
from kiln.ops.ml_common import ML
from kiln.ops.ml_svm import _classifier_parts, _regressor_parts
from kiln.lower.context import lowering


_KINDS = {"LINEAR": 0, "POLY": 1, "RBF": 2, "SIGMOID": 3}


def _kernel_args(kind: str, gamma, coef0, degree) -> tuple[str, str]:
    """C: kiln_svm_kernel's `kind, ... gamma, coef0, power, degree` arguments as literals (power
    2 or 3: products; 0: powf)."""
    power = 2 if degree == 2 else 3 if degree == 3 else 0
    return f"{_KINDS[kind]}", f"{_f(gamma)}, {_f(coef0)}, {power}, {_f(degree)}"


def _f(v) -> str:
    return f"{float(v)!r}f" if np.isfinite(v) else ("INFINITY" if v > 0 else "-INFINITY" if v < 0 else "NAN")


_C_SVM = c_source("svm.c")


@lowering("SVMRegressor", domain=ML)
def _svm_regressor_lower(ctx, x):
    xt = ctx.input_types[0]
    c_type(ctx, xt.dtype)
    rows, width = rows_width(ctx, xt)
    kind, gamma, coef0, degree, sv, coef, rho = _regressor_parts(ctx, width)
    one_class = int(ctx.attr("one_class", 0))
    body = [c_table(ctx, "coef", "float", coef, DType.float32), c_table(ctx, "rho", "float", rho, DType.float32)]
    if sv is None:
        score = f"float y = kiln_svm_kernel({_KINDS['LINEAR']}, xr, coef, nf, 0.0f, 0.0f, 0, 0.0f, rho[0]);"
    else:
        body.append(c_table(ctx, "sv", "float", sv, DType.float32))
        k, consts = _kernel_args(kind, gamma, coef0, degree)
        score = f"float y = kiln_svm_regress({k}, xr, sv, {len(sv)}, nf, coef, rho[0], {consts});"
    body.append(f"""  const int64_t nf = {width};
  #pragma omp parallel for schedule(static) if ({rows} * {1 if sv is None else len(sv)} >= 4096)
  for (int64_t row = 0; row < {rows}; ++row) {{
    float xr[{max(width, 1)}];
    for (int64_t f = 0; f < nf; ++f) xr[f] = (float)in0[row * nf + f];
    {score}
    {"y = y > 0 ? 1.0f : -1.0f;" if one_class else ""}
    out0[row] = y;
  }}
  return 0;""")
    return ctx.extern("".join(body), [x], [(ctx.out_shape(), DType.float32)], preamble=_C_SVM)


_C_COUPLE = c_source("svm_couple.c")


@lowering("SVMClassifier", domain=ML)
def _svm_classifier_lower(ctx, x):
    xt = ctx.input_types[0]
    c_type(ctx, xt.dtype)
    rows, width = rows_width(ctx, xt)
    p = _classifier_parts(ctx, width)
    labels, nc = p["labels"], len(p["labels"])
    tab = lambda name, v, dt=DType.float32, ct="float": c_table(ctx, name, ct, v, dt)  # noqa: E731
    body = [tab("coef", p["coef"]), tab("rho", p["rho"]), c_labels(ctx, labels, p["strings"])]
    if p["mode"] == "linear":
        if nc == 2 and not p["proba"]:
            choose = ("if (top >= 0.5f) best = 1;" if p["all_positive"] else "if (top > 0) best = 1;")
        else:
            choose = ""
        row = f"""    double a[{nc}];
    int64_t best = kiln_svm_linear_scores(xr, coef, {nc}, nf, rho[0], a);
    const float top = (float)a[best];
    {choose}
    out0[row] = labels[best];
{c_post_transform(ctx, p["post"], nc)}    for (int64_t c = 0; c < {nc}; ++c) out1[row * {nc} + c] = (float)a[c];"""
        pre = _C_SVM
    else:
        nv = len(p["sv"])
        start = np.concatenate([[0], np.cumsum(p["per_class"])]).astype(np.int64)
        body += [tab("sv", p["sv"]), tab("vstart", start, DType.int64, "int64_t"), tab("pa", p["pa"] if p["proba"] else [0]),
                 tab("pb", p["pb"] if p["proba"] else [0])]
        pairs = nc * (nc - 1) // 2
        if p["proba"]:
            final = f"""    float r[{nc * nc}], q[{nc * nc}], qp[{nc}], pr[{nc}];
    kiln_svm_pairwise({nc}, sc, pa, pb, r);
    kiln_svm_couple({nc}, r, q, qp, pr);
    double a[{nc}];
    for (int64_t c = 0; c < {nc}; ++c) a[c] = (double)pr[c];
{c_post_transform(ctx, p["post"], nc)}    for (int64_t c = 0; c < {nc}; ++c) out1[row * {nc} + c] = (float)a[c];"""
        elif nc == 2:
            if p["post"] == "PROBIT":
                final = ("    double a[1] = {(double)sc[0]};\n" + c_post_transform(ctx, "PROBIT", 1) +
                         "    out1[row * 2] = (float)a[0]; out1[row * 2 + 1] = 0.0f;")
            elif p["post"] == "NONE":
                final = "    out1[row * 2] = -sc[0]; out1[row * 2 + 1] = sc[0];"
            else:
                final = "    out1[row * 2] = 1.0f - sc[0]; out1[row * 2 + 1] = sc[0];"
        else:
            final = f"""    double a[{pairs}];
    for (int64_t c = 0; c < {pairs}; ++c) a[c] = (double)sc[c];
{c_post_transform(ctx, p["post"], pairs)}    for (int64_t c = 0; c < {pairs}; ++c) out1[row * {pairs} + c] = (float)a[c];"""
        k, consts = _kernel_args(p["kind"], p["gamma"], p["coef0"], p["degree"])
        row = f"""    float kv[{nv}], sc[{pairs}];
    int64_t votes[{nc}];
    kiln_svm_kernels({k}, xr, sv, {nv}, nf, {consts}, kv);
    const int64_t best = kiln_svm_vote({nc}, {nv}, kv, coef, rho, vstart, sc, votes);
    out0[row] = labels[best];
{final}"""
        pre = _C_SVM + (_C_COUPLE if p["proba"] else "")
    work = rows * (len(p["sv"]) if p["mode"] == "svc" else nc)
    body.append(f"""  const int64_t nf = {width};
  #pragma omp parallel for schedule(static) if ({work} >= 4096)
  for (int64_t row = 0; row < {rows}; ++row) {{
    float xr[{max(width, 1)}];
    for (int64_t f = 0; f < nf; ++f) xr[f] = (float)in0[row * nf + f];
{row}
  }}
  return 0;""")
    return label_extern(ctx, "".join(body), [x], [(ctx.out_shape(0), DType.string if p["strings"] else DType.int64),
                                                  (ctx.out_shape(1), DType.float32)], p["strings"], preamble=pre)
