"""Native lowerings of the tree ensembles (kiln.ops.ml_trees): the forest packed into
per-tree node records, walked by kiln/codegen/c_src/ml_trees.c (a branch-light walk, rows in
parallel, or trees for few rows), each row then finished by kiln/codegen/c_src/ml_tree_scores.c
(base values, averaging, the winning class); the post transform and the outputs are written
per node.
"""

from __future__ import annotations

import numpy as np

from kiln.codegen.csource import c_instance, c_source
from kiln.dtypes import DType
from kiln.lower.ml_common import c_blob, c_labels, c_post_transform, c_table, c_type, label_extern, rows_width
from kiln.ops.ml_common import ML
from kiln.ops.ml_trees import (Forest, _attr_str, _check, _classifier_forest, _ensemble_forest,
    _regressor_forest, acc_dtype)
from kiln.lower.context import lowering


# ---- the native kernel ----

def _suffix(ct: str) -> str:
    """The engine's name suffix for accumulator C type `ct`."""
    return "f64" if ct == "double" else "f32"


def _engine(ct: str) -> str:
    """The engine (kiln/codegen/c_src/ml_trees.c) and the per-row finish (ml_tree_scores.c,
    instantiated for the accumulator type `ct`: kiln_tree_<scores|classes|binary>_<f32|f64>)."""
    s = _suffix(ct)
    macros = {"KILN_TREE_T": ct, "KILN_TREE(name)": f"kiln_tree_##name##_{s}"}
    return c_source("ml_trees.c") + c_instance("ml_tree_scores.c", macros, f"KILN_TREE_SCORES_{s.upper()}")


def pack(ctx, f: Forest, a: np.dtype) -> dict:
    """The forest as the engine's records: each tree's reachable nodes and leaves, depth first
    from its root (a leaf's two children are itself), with per-tree root and depth (the most
    steps to a leaf). Fails on a tree with a cycle."""
    keys: list = []                  # record -> (is_leaf, id)
    kids_of: dict = {}               # internal record -> (true record, false record)
    roots, depths = [], []

    def kids(key):
        i = key[1]
        return (bool(f.true_leaf[i]), int(f.true_id[i])), (bool(f.false_leaf[i]), int(f.false_id[i]))

    for rid, rleaf in f.roots:
        root = (bool(rleaf), int(rid))
        memo: dict = {}              # per tree: a node shared by two trees gets a record in each

        def rec(key):
            if key not in memo:
                memo[key] = len(keys)
                keys.append(key)
            return memo[key]

        roots.append(rec(root))
        depth: dict = {}
        gray: set = set()
        stack = [(root, False)]
        while stack:
            key, done = stack.pop()
            if done:
                gray.discard(key)
                depth[key] = 1 + max(depth[k] for k in kids(key))
                continue
            if key in depth:
                continue
            if key in gray:
                ctx.fail(f"the tree rooted at node {root[1]} has a cycle")
            if key[0]:
                depth[key] = 0
                continue
            gray.add(key)
            stack.append((key, True))
            kids_of[memo[key]] = tuple(rec(k) for k in kids(key))
            stack.extend((k, False) for k in kids(key) if k not in depth)
        depths.append(depth[root])
    n = len(keys)
    is_leaf = np.array([k[0] for k in keys], bool).reshape(n)
    ids = np.array([k[1] for k in keys], np.int64).reshape(n)
    node = np.where(is_leaf, 0, ids)
    internal = ~is_leaf
    rec_ = np.zeros(n, np.dtype([("t", a), ("f", np.int32), ("ch", np.int32, 2)], align=True))
    rec_["ch"] = np.arange(n)[:, None]
    for r, ch in kids_of.items():
        rec_["ch"][r] = ch
    pick = lambda arr: np.where(internal, arr[node], 0) if len(arr) else np.zeros(n)  # noqa: E731
    rec_["t"] = pick(f.split).astype(a)
    rec_["f"] = pick(f.feat)
    mode = pick(f.mode).astype(np.int64) | 8 * pick(f.nan_true).astype(np.int64)
    mstart, mval = [0], []
    for r in np.flatnonzero(internal & (pick(f.mode) == 6)).tolist():
        mstart += [len(mval)] * (r + 1 - len(mstart))
        mval += sorted(f.sets.get(int(ids[r]), ()))
    mstart += [len(mval)] * (n + 1 - len(mstart))
    order = np.argsort(f.leaf_of, kind="stable")
    starts = np.searchsorted(f.leaf_of[order], np.arange(f.n_leaves + 1))
    lid = np.where(is_leaf, ids, 0)
    counts = np.where(is_leaf, starts[lid + 1] - starts[lid], 0)
    lstart = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    entries = order[np.repeat(starts[lid] - lstart[:-1], counts) + np.arange(lstart[-1])]
    return dict(nodes=rec_, root=np.asarray(roots, np.int32), depth=np.asarray(depths, np.int32),
                mode=mode.astype(np.uint8) if mode.any() else None,
                mstart=np.asarray(mstart, np.int32), mval=np.asarray(mval, a),
                lstart=lstart.astype(np.int32), ltgt=f.target_of[entries].astype(np.int32),
                lw=f.weight_of[entries].astype(a))


def _kernel(ctx, x, f: Forest, finish: str, outputs: list, strings: bool = False) -> object:
    """The engine over X, then `finish` (C run per row with `s`/`h`: the row's scores, 0
    where no leaf fed them, and fed flags) writing the outputs.

    `finish` must not pick scores with `h[t] ? s[t] : 0`: GCC 12 (-O2 -march=native)
    vectorizes that loop into wrong code here; the engine's zeros make it needless."""
    xt = ctx.input_types[0]
    c_type(ctx, xt.dtype)
    rows, width = rows_width(ctx, xt)
    _check(ctx, f, width)
    a = acc_dtype(xt.dtype.np)
    s, ct = ("f64", "double") if a == np.float64 else ("f32", "float")
    p = pack(ctx, f, a)
    blob = lambda name, arr: c_blob(name, np.ascontiguousarray(arr).tobytes())  # noqa: E731
    nt = f.n_targets
    body = [blob("nodes", p["nodes"]), blob("roots", p["root"]), blob("depths", p["depth"]),
            blob("mstart", p["mstart"]), blob("mval", p["mval"]), blob("lstart", p["lstart"]),
            blob("ltgt", p["ltgt"]), blob("lw", p["lw"])]
    if p["mode"] is not None:
        body.append(blob("modes", p["mode"]))
    work = int(p["depth"].astype(np.int64).sum())
    same = xt.dtype.np == a
    body.append(f"""  const kiln_forest_{s} F = {{(const kiln_tn_{s}*)nodes, (const kiln_a_i32*)roots, (const kiln_a_i32*)depths,
    {len(f.roots)}, {work}, {"modes" if p["mode"] is not None else "NULL"}, (const kiln_a_i32*)mstart,
    (const kiln_a_{s}*)mval, (const kiln_a_i32*)lstart, (const kiln_a_i32*)ltgt, (const kiln_a_{s}*)lw, {nt}, {f.agg}}};
  const int64_t rows = {rows}, width = {width};
  {ct}* acc = ({ct}*)malloc(sizeof({ct}) * (size_t)(rows * {nt} + 1));
  uint8_t* has = (uint8_t*)malloc((size_t)(rows * {nt} + 1));
  {ct}* xc = {"NULL" if same else f"({ct}*)malloc(sizeof({ct}) * (size_t)(rows * width + 1))"};
  if (!acc || !has || {"0" if same else "!xc"}) {{ free(acc); free(has); free(xc); return -1; }}
  {"" if same else f"for (int64_t i = 0; i < rows * width; ++i) xc[i] = ({ct})in0[i];"}
  const int rc = kiln_forest_eval_{s}(&F, {"in0" if same else "xc"}, rows, width, acc, has);
  if (!rc)
    for (int64_t row = 0; row < rows; ++row) {{
      {ct}* s = acc + row * {nt};
      uint8_t* h = has + row * {nt};
{finish}
    }}
  free(acc); free(has); free(xc);
  return rc;""")
    return label_extern(ctx, "".join(body), [x], outputs, strings, preamble=_engine(ct))


def _c_finish_scores(ctx, f: Forest, ct: str, base, post, out_c: str) -> str:
    """Per row: kiln_tree_scores (unfed targets 0, AVERAGE divided, base added), the post
    transform in double, the outputs."""
    nt, nb = f.n_targets, len(base)
    tables = c_table(ctx, "base", ct, base if nb else [0.0], DType.float64 if ct == "double" else DType.float32)
    return tables.replace("  static", "      static") + f"""      double a[{max(nt, 1)}];
      kiln_tree_scores_{_suffix(ct)}(s, h, {nt}, {int(f.agg == 0)}, {len(f.roots)}, base, {nb}, a);
{c_post_transform(ctx, post, nt)}      for (int64_t t = 0; t < {nt}; ++t) out0[row * {nt} + t] = ({out_c})a[t];"""


@lowering("TreeEnsemble", domain=ML)
def _tree_ensemble_lower(ctx, x):
    f = _ensemble_forest(ctx)
    dt = ctx.input_types[0].dtype
    ct = "double" if acc_dtype(dt.np) == np.float64 else "float"
    finish = _c_finish_scores(ctx, f, ct, [], int(ctx.attr("post_transform", 0)), dt.c or "float")
    return _kernel(ctx, x, f, finish, [(ctx.out_shape(), dt)])


@lowering("TreeEnsembleRegressor", domain=ML)
def _tree_regressor_lower(ctx, x):
    f, base = _regressor_forest(ctx)
    ct = "double" if acc_dtype(ctx.input_types[0].dtype.np) == np.float64 else "float"
    finish = _c_finish_scores(ctx, f, ct, base, _attr_str(ctx, "post_transform", "NONE"), "float")
    return _kernel(ctx, x, f, finish, [(ctx.out_shape(), DType.float32)])


@lowering("TreeEnsembleClassifier", domain=ML)
def _tree_classifier_lower(ctx, x):
    f, c = _classifier_forest(ctx)
    a = acc_dtype(ctx.input_types[0].dtype.np)
    ct = "double" if a == np.float64 else "float"
    adt = DType.float64 if a == np.float64 else DType.float32
    nc, nb = len(c.labels), len(c.base)
    lt = DType.string if c.strings else DType.int64
    tables = (c_labels(ctx, c.labels, c.strings) +
              c_table(ctx, "base", ct, c.base if nb else [0.0], adt)).replace("  static", "      static")
    if nc > 2:
        finish = tables + f"""      double a[{nc}];
      out0[row] = labels[kiln_tree_classes_{_suffix(ct)}(s, h, {nc}, base, {nb}, a)];
{c_post_transform(ctx, c.post, nc)}      for (int64_t k = 0; k < {nc}; ++k) out1[row * {nc} + k] = (float)a[k];"""
        return _kernel(ctx, x, f, finish, [(ctx.out_shape(0), lt), (ctx.out_shape(1), DType.float32)], c.strings)
    finish = tables + f"""      double a[2];
      int64_t cls;
      const int post = kiln_tree_binary_{_suffix(ct)}(s, h, base, {nb}, {int(c.binary)}, {int(c.all_positive)},
        {int(c.post == "LOGISTIC")}, &cls, a);
      out0[row] = {"labels[cls]" if c.binary or c.strings else "cls"};
      if (post) {{
{c_post_transform(ctx, c.post, 2)}      }}
      out1[row * 2] = (float)a[0]; out1[row * 2 + 1] = (float)a[1];"""
    return _kernel(ctx, x, f, finish, [(ctx.out_shape(0), lt), (ctx.out_shape(1), DType.float32)], c.strings)
