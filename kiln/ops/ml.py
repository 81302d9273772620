"""Classical-ML operators of the `ai.onnx.ml` domain (what sklearn/xgboost exporters emit).

LabelEncoder, TreeEnsemble (and the older TreeEnsembleRegressor encoding),
ArrayFeatureExtractor, Binarizer, plus the small
preprocessing ops that commonly surround them (Scaler, Normalizer, Imputer,
LinearRegressor, FeatureVectorizer, CategoryMapper).
"""

from __future__ import annotations

import math

import numpy as np

import kiln.loops as L
from kiln.dtypes import DType
from kiln.graph.types import TensorType
from kiln.ops.registry import lowering, op, same_as
from kiln.ops.strings import string_array

ML = "ai.onnx.ml"


def _float_input(ctx, i: int = 0) -> TensorType:
    t = ctx.tensor(i)
    if not (t.dtype.is_float or t.dtype.is_int):
        ctx.fail(f"input {i} must be numeric, got {t.dtype}")
    return t


def _rows(ctx, t: TensorType, width) -> TensorType:
    """[N, width] float32: the output shape of the row-wise ML ops (1-D input is one row)."""
    n = 1 if t.rank == 1 else (t.shape[0] if t.shape else ctx.new_dim())
    return TensorType(DType.float32, (n, width))


# ---- LabelEncoder ----

def _encoder_table(ctx):
    """(keys, values, default): keys/values as arrays, default as a 0-d array of the value type."""
    def pick(prefix, kinds):
        given = [(k, ctx.attr(prefix + k)) for k in kinds if ctx.has_attr(prefix + k)]
        if len(given) != 1:
            ctx.fail(f"exactly one of {', '.join(prefix + k for k in kinds)} must be set, "
                     f"got {[k for k, _ in given] or 'none'}")
        kind, v = given[0]
        dtype = {"strings": object, "int64s": np.int64, "floats": np.float32}.get(kind)
        return np.asarray(v, dtype=dtype).ravel()

    kinds = ("strings", "int64s", "floats", "tensor")
    keys, values = pick("keys_", kinds), pick("values_", kinds)
    if len(keys) != len(values):
        ctx.fail(f"{len(keys)} keys but {len(values)} values")
    vtype = DType.from_numpy(values.dtype)
    fallback = "_Unused" if vtype == DType.string else -0.0 if vtype.is_float else -1
    if ctx.has_attr("default_tensor"):
        default = np.asarray(ctx.attr("default_tensor")).ravel()[:1]
    else:
        name = {DType.string: "default_string", DType.int64: "default_int64",
                DType.float32: "default_float"}.get(vtype)
        default = [ctx.attr(name, fallback) if name else fallback]
    return keys, values, np.asarray(default, dtype=values.dtype).reshape(())


def _infer_label_encoder(ctx):
    t = ctx.tensor(0)
    if ctx.opset < 2:  # v1: classes_strings maps strings to their index and back
        return [TensorType(DType.int64 if t.dtype == DType.string else DType.string, t.shape)]
    keys, values, _ = _encoder_table(ctx)
    if DType.from_numpy(keys.dtype) != t.dtype:
        ctx.fail(f"input type {t.dtype} does not match the keys' type {DType.from_numpy(keys.dtype)}")
    return [TensorType(DType.from_numpy(values.dtype), t.shape)]


def _key(v):
    """A dict key under which every NaN is the same key (NaN keys match any NaN)."""
    return "nan" if isinstance(v, float) and math.isnan(v) else v


@op("LabelEncoder", infer=_infer_label_encoder, domain=ML)
def label_encoder(ctx, x):
    if ctx.opset < 2:
        classes = list(ctx.attr("classes_strings", []))
        if x.dtype == object:
            index = {s: i for i, s in enumerate(classes)}
            return np.array([index.get(s, ctx.attr("default_int64", -1)) for s in x.ravel()],
                            dtype=np.int64).reshape(x.shape)
        default = ctx.attr("default_string", "_Unused")
        return string_array([classes[i] if 0 <= i < len(classes) else default
                             for i in x.ravel().tolist()], x.shape)
    keys, values, default = _encoder_table(ctx)
    table = {_key(k): v for k, v in zip(keys.tolist(), values)}  # a repeated key: the last wins
    out = np.empty(x.size, dtype=values.dtype)
    out[:] = [table.get(_key(k), default) for k in x.ravel().tolist()]
    return out.reshape(x.shape)


# ---- TreeEnsemble ----

_MODES = ("LEQ", "LT", "GTE", "GT", "EQ", "NEQ", "MEMBER")


def _infer_tree_ensemble(ctx):
    t = ctx.tensor(0)
    if not t.dtype.is_float or t.rank not in (None, 2):
        ctx.fail(f"X must be a 2-D float tensor [N, F], got {t}")
    n_nodes = len(ctx.attr("nodes_featureids"))
    for name in ("nodes_modes", "nodes_splits", "nodes_truenodeids", "nodes_falsenodeids",
                 "nodes_trueleafs", "nodes_falseleafs"):
        if len(np.ravel(ctx.attr(name))) != n_nodes:
            ctx.fail(f"{name} has {len(np.ravel(ctx.attr(name)))} entries, expected {n_nodes}")
    if len(ctx.attr("leaf_targetids")) != len(np.ravel(ctx.attr("leaf_weights"))):
        ctx.fail("leaf_targetids and leaf_weights differ in length")
    if not 0 <= int(ctx.attr("aggregate_function", 1)) <= 3:
        ctx.fail(f"aggregate_function must be in 0..3, got {ctx.attr('aggregate_function')}")
    return [TensorType(t.dtype, (t.shape[0] if t.shape else ctx.new_dim(), int(ctx.attr("n_targets"))))]


def _member_sets(ctx, modes: np.ndarray) -> dict[int, set]:
    """The NaN-delimited membership_values, one set per BRANCH_MEMBER node in node order."""
    members = np.ravel(ctx.attr("membership_values", np.zeros(0)))
    groups, cur = [], set()
    for v in members.tolist():
        if math.isnan(v):
            groups.append(cur)
            cur = set()
        else:
            cur.add(v)
    nodes = np.flatnonzero(modes == 6).tolist()
    if len(groups) != len(nodes):
        ctx.fail(f"membership_values holds {len(groups)} sets for {len(nodes)} BRANCH_MEMBER nodes")
    return dict(zip(nodes, groups))


def _descend(ctx, x: np.ndarray, root: int, root_is_leaf: bool, arrays: dict) -> np.ndarray:
    """The leaf index each row of `x` reaches from `root`, all rows stepping together."""
    feat, mode, split = arrays["feat"], arrays["mode"], arrays["split"]
    idx = np.full(len(x), root, np.int64)
    leaf = np.full(len(x), root_is_leaf)
    for _ in range(len(feat) + 1):
        live = np.flatnonzero(~leaf)
        if not len(live):
            return idx
        n = idx[live]
        v, s = x[live, feat[n]], split[n]
        member = np.array([val in arrays["sets"].get(k, ()) for val, k in zip(v.tolist(), n.tolist())], bool)
        go = np.choose(mode[n], [v <= s, v < s, v >= s, v > s, v == s, v != s, member])
        go |= arrays["nan_true"][n] & np.isnan(v)
        idx[live] = np.where(go, arrays["true_id"][n], arrays["false_id"][n])
        leaf[live] = np.where(go, arrays["true_leaf"][n], arrays["false_leaf"][n])
    ctx.fail(f"tree rooted at node {root} has a cycle")


def _tree_ensemble_parts(ctx, dtype):
    """TreeEnsemble's attributes as `_descend` arrays (splits in the input's `dtype`), roots,
    (leaf index, target, weight) contributions, target count and aggregate code."""
    modes = np.ravel(ctx.attr("nodes_modes")).astype(np.int64)
    if ((modes < 0) | (modes > 6)).any():
        ctx.fail(f"nodes_modes must be in 0..6 ({', '.join(_MODES)}), got {sorted(set(modes.tolist()))}")
    feat = np.asarray(ctx.attr("nodes_featureids"), np.int64)
    ints = lambda name, dtype=np.int64: np.asarray(ctx.attr(name), dtype)  # noqa: E731
    arrays = dict(feat=feat, mode=modes, split=np.ravel(ctx.attr("nodes_splits")).astype(dtype),
                  sets=_member_sets(ctx, modes),
                  nan_true=np.asarray(ctx.attr("nodes_missing_value_tracks_true", None) or [0] * len(feat), bool),
                  true_id=ints("nodes_truenodeids"), false_id=ints("nodes_falsenodeids"),
                  true_leaf=ints("nodes_trueleafs", bool), false_leaf=ints("nodes_falseleafs", bool))
    targets = ints("leaf_targetids")
    return (arrays, [(int(r), False) for r in ctx.attr("tree_roots")],
            (np.arange(len(targets)), targets, np.ravel(ctx.attr("leaf_weights"))),
            int(ctx.attr("n_targets")), int(ctx.attr("aggregate_function", 1)))


@op("TreeEnsemble", infer=_infer_tree_ensemble, domain=ML)
def tree_ensemble(ctx, x):
    arrays, roots, leaves, n_targets, agg = _tree_ensemble_parts(ctx, x.dtype)
    acc = _aggregate(ctx, x, roots, arrays, leaves, n_targets, agg)
    return post_transform(ctx, acc, int(ctx.attr("post_transform", 0))).astype(x.dtype)


def _aggregate(ctx, x, roots, arrays, leaves, n_targets: int, agg: int) -> np.ndarray:
    """[N, n_targets] float64 scores: each tree's reached leaf contributions, combined by
    AVERAGE (0), SUM (1), MIN (2) or MAX (3); targets no leaf reaches score 0.

    `leaves` is (leaf index, target, weight) per contribution; a leaf may feed several targets.
    """
    table, reduce, neutral = _leaf_table(ctx, x.shape[1], arrays, leaves, n_targets, agg)
    acc = np.full((len(x), n_targets), neutral)
    for root, is_leaf in roots:
        acc = reduce(acc, table[_descend(ctx, x, root, is_leaf, arrays)])
    acc[np.isinf(acc)] = 0
    return acc / len(roots) if agg == 0 and roots else acc


def _leaf_table(ctx, n_features: int, arrays, leaves, n_targets: int, agg: int):
    """(table [leaf, target] float64 of the combined contributions, reduce ufunc, neutral)."""
    feat = arrays["feat"]
    if len(feat) and feat.max() >= n_features:
        ctx.fail(f"a node reads feature {feat.max()} but X has {n_features} features")
    leaf_of, target_of, weight_of = (np.asarray(v) for v in leaves)
    if len(target_of) and not 0 <= target_of.min() <= target_of.max() < n_targets:
        ctx.fail(f"leaf target ids must be in [0, {n_targets}), got {sorted(set(target_of.tolist()))}")
    reduce = {0: np.add, 1: np.add, 2: np.minimum, 3: np.maximum}[agg]
    neutral = {2: np.inf, 3: -np.inf}.get(agg, 0.0)
    table = np.full((max(len(feat), int(leaf_of.max(initial=0)) + 1), n_targets), neutral)
    reduce.at(table, (leaf_of, target_of), weight_of.astype(np.float64))
    return table, reduce, neutral


_LEGACY_MODES = {"BRANCH_LEQ": 0, "BRANCH_LT": 1, "BRANCH_GTE": 2, "BRANCH_GT": 3, "BRANCH_EQ": 4,
                 "BRANCH_NEQ": 5, "LEAF": -1}


def _legacy_trees(ctx, x):
    """TreeEnsembleRegressor's (tree id, node id) encoding as `_descend` arrays, roots and a node lookup."""
    trees, ids = ctx.attr("nodes_treeids"), ctx.attr("nodes_nodeids")
    pos = {(t, n): i for i, (t, n) in enumerate(zip(trees, ids))}
    modes = [_LEGACY_MODES.get(m) for m in ctx.attr("nodes_modes")]
    if None in modes:
        ctx.fail(f"nodes_modes must be among {', '.join(_LEGACY_MODES)}, got {ctx.attr('nodes_modes')}")
    leaf = np.array(modes) < 0

    def children(name):
        try:
            return np.array([i if leaf[i] else pos[t, c] for i, (t, c) in enumerate(zip(trees, ctx.attr(name)))],
                            np.int64)
        except KeyError as e:
            ctx.fail(f"{name} refers to a node (tree, id) = {e} that does not exist")

    true_id, false_id = children("nodes_truenodeids"), children("nodes_falsenodeids")
    splits = ctx.attr("nodes_values_as_tensor", None)
    splits = ctx.attr("nodes_values", [0.0] * len(ids)) if splits is None else splits
    nan_true = ctx.attr("nodes_missing_value_tracks_true", None) or [0] * len(ids)
    arrays = dict(feat=np.asarray(ctx.attr("nodes_featureids"), np.int64), mode=np.maximum(modes, 0),
                  split=np.ravel(splits).astype(x.dtype), sets={}, nan_true=np.asarray(nan_true, bool),
                  true_id=true_id, false_id=false_id, true_leaf=leaf[true_id], false_leaf=leaf[false_id])
    children_of = set(true_id[~leaf].tolist()) | set(false_id[~leaf].tolist())
    roots: dict = {}
    for i, t in enumerate(trees):
        if i not in children_of:
            roots.setdefault(t, i)
    return arrays, [(r, bool(leaf[r])) for r in roots.values()], pos


def _infer_tree_regressor(ctx):
    t = _float_input(ctx)
    return [_rows(ctx, t, int(ctx.attr("n_targets", 1)))]


def _regressor_parts(ctx, dtype):
    """TreeEnsembleRegressor's attributes in TreeEnsemble's form, plus its base values."""
    arrays, roots, pos = _legacy_trees(ctx, np.empty((0, 0), dtype))
    try:
        leaf_of = [pos[k] for k in zip(ctx.attr("target_treeids"), ctx.attr("target_nodeids"))]
    except KeyError as e:
        ctx.fail(f"a target refers to a node (tree, id) = {e} that does not exist")
    weights = ctx.attr("target_weights_as_tensor", None)
    weights = ctx.attr("target_weights") if weights is None else weights
    agg = ctx.attr("aggregate_function", "SUM")
    if agg not in ("AVERAGE", "SUM", "MIN", "MAX"):
        ctx.fail(f"aggregate_function must be AVERAGE, SUM, MIN or MAX, got {agg!r}")
    base = ctx.attr("base_values_as_tensor", None)
    base = np.ravel(ctx.attr("base_values", [0.0]) if base is None else base)
    return (arrays, roots, (leaf_of, ctx.attr("target_ids"), np.ravel(weights)),
            int(ctx.attr("n_targets", 1)), ("AVERAGE", "SUM", "MIN", "MAX").index(agg), base)


@op("TreeEnsembleRegressor", infer=_infer_tree_regressor, domain=ML)
def tree_ensemble_regressor(ctx, x):
    x = np.atleast_2d(x)
    arrays, roots, leaves, n_targets, agg, base = _regressor_parts(ctx, x.dtype)
    acc = _aggregate(ctx, x, roots, arrays, leaves, n_targets, agg)
    acc = acc + base
    return post_transform(ctx, acc, ctx.attr("post_transform", "NONE")).astype(np.float32)


def post_transform(ctx, scores: np.ndarray, kind) -> np.ndarray:
    """The ML ops' score transforms, by enum code (0..4) or name (NONE, SOFTMAX, ...)."""
    names = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")
    kind = names[kind] if isinstance(kind, int) and 0 <= kind < len(names) else kind
    if kind == "NONE":
        return scores
    if kind == "LOGISTIC":
        return 1 / (1 + np.exp(-scores))
    if kind in ("SOFTMAX", "SOFTMAX_ZERO"):
        keep = scores != 0 if kind == "SOFTMAX_ZERO" else np.ones_like(scores, bool)
        e = np.where(keep, np.exp(scores - np.max(np.where(keep, scores, -np.inf), -1, keepdims=True)), 0)
        return e / np.maximum(e.sum(-1, keepdims=True), np.finfo(np.float64).tiny)
    if kind == "PROBIT":
        return np.sqrt(2) * _erfinv(2 * scores - 1)
    ctx.fail(f"post_transform must be one of {', '.join(names)}, got {kind!r}")


def _erfinv(y: np.ndarray) -> np.ndarray:
    """Inverse error function: Winitzki's closed form refined by Newton steps (no scipy)."""
    y = np.clip(y, -1, 1)
    a = 0.147
    ln = np.log1p(-y * y)
    t = 2 / (np.pi * a) + ln / 2
    x = np.sign(y) * np.sqrt(np.sqrt(t * t - ln / a) - t)
    erf = np.vectorize(math.erf, otypes=[np.float64])
    with np.errstate(over="ignore", invalid="ignore"):
        for _ in range(3):
            x = np.where(np.abs(y) < 1, x - (erf(x) - y) / (2 / np.sqrt(np.pi) * np.exp(-x * x)), x)
    return x


# ---- small per-element / per-row ops ----

def _infer_feature_extractor(ctx):
    t = ctx.tensor(0)
    idx = ctx.tensor(1)
    if idx.dtype != DType.int64:
        ctx.fail(f"indices must be int64, got {idx.dtype}")
    k = int(np.prod(idx.shape)) if idx.is_static else ctx.new_dim()
    if t.shape is None:
        return [TensorType(t.dtype, None)]
    return [TensorType(t.dtype, (1, k) if len(t.shape) == 1 else t.shape[:-1] + (k,))]


@op("ArrayFeatureExtractor", infer=_infer_feature_extractor, domain=ML)
def array_feature_extractor(ctx, x, indices):
    """Gathers along the last axis; a 1-D input gives one row (as ONNX Runtime does)."""
    idx = indices.ravel()
    if len(idx) and (idx.min() < 0 or idx.max() >= x.shape[-1]):
        ctx.fail(f"indices {idx.tolist()} out of range for last dim {x.shape[-1]}")
    out = x[..., idx]
    return out.reshape(1, -1) if x.ndim == 1 else out


@op("Binarizer", infer=same_as(0), domain=ML)
def binarizer(ctx, x):
    return (x > ctx.attr("threshold", 0.0)).astype(x.dtype)


def _infer_float_like(ctx):
    t = _float_input(ctx)
    return [TensorType(DType.float32, t.shape)]


def _per_feature(ctx, name: str, default: float, width: int) -> np.ndarray:
    v = np.asarray(ctx.attr(name, [default]), np.float32)
    if len(v) not in (1, width):
        ctx.fail(f"{name} has {len(v)} entries; expected 1 or the feature count {width}")
    return v


@op("Scaler", infer=_infer_float_like, domain=ML)
def scaler(ctx, x):
    w = x.shape[-1] if x.ndim else 1
    return ((x.astype(np.float32) - _per_feature(ctx, "offset", 0.0, w)) * _per_feature(ctx, "scale", 1.0, w))


@op("Normalizer", infer=_infer_float_like, domain=ML)
def normalizer(ctx, x):
    x = x.astype(np.float32)
    norm = ctx.attr("norm", "MAX")
    fn = {"MAX": lambda r: np.abs(r).max(-1, keepdims=True), "L1": lambda r: np.abs(r).sum(-1, keepdims=True),
          "L2": lambda r: np.sqrt((r * r).sum(-1, keepdims=True))}.get(norm)
    if fn is None:
        ctx.fail(f"norm must be MAX, L1 or L2, got {norm!r}")
    d = fn(x)
    return np.where(d == 0, x, x / np.where(d == 0, 1, d)).astype(np.float32)


@op("Imputer", infer=same_as(0), domain=ML)
def imputer(ctx, x):
    floats = x.dtype.kind == "f"
    fill = np.asarray(ctx.attr("imputed_value_floats" if floats else "imputed_value_int64s"), x.dtype)
    bad = ctx.attr("replaced_value_float" if floats else "replaced_value_int64", np.nan if floats else 0)
    hit = np.isnan(x) if floats and math.isnan(bad) else x == bad
    return np.where(hit, np.broadcast_to(fill, x.shape[-1:]) if fill.size > 1 else fill, x).astype(x.dtype)


def _infer_linear_regressor(ctx):
    t = _float_input(ctx)
    return [_rows(ctx, t, int(ctx.attr("targets", 1)))]


@op("LinearRegressor", infer=_infer_linear_regressor, domain=ML)
def linear_regressor(ctx, x):
    x = np.atleast_2d(x).astype(np.float32)
    n = int(ctx.attr("targets", 1))
    coef = np.asarray(ctx.attr("coefficients"), np.float32)
    if coef.size != n * x.shape[1]:
        ctx.fail(f"{coef.size} coefficients for {n} targets x {x.shape[1]} features")
    y = x @ coef.reshape(n, -1).T + np.asarray(ctx.attr("intercepts", [0.0] * n), np.float32)
    return post_transform(ctx, y, ctx.attr("post_transform", "NONE")).astype(np.float32)


def _infer_feature_vectorizer(ctx):
    dims = ctx.attr("inputdimensions")
    if len(dims) != ctx.num_inputs:
        ctx.fail(f"inputdimensions has {len(dims)} entries for {ctx.num_inputs} inputs")
    return [_rows(ctx, ctx.tensor(0), int(sum(dims)))]


@op("FeatureVectorizer", infer=_infer_feature_vectorizer, domain=ML)
def feature_vectorizer(ctx, *xs):
    """Concatenates the inputs' features, each cut or zero-padded to its inputdimensions entry."""
    parts = []
    for x, d in zip(xs, ctx.attr("inputdimensions")):
        x = np.atleast_2d(x).astype(np.float32).reshape(len(np.atleast_2d(x)), -1)[:, :d]
        parts.append(np.pad(x, ((0, 0), (0, d - x.shape[1]))))
    return np.concatenate(parts, axis=1)


def _infer_category_mapper(ctx):
    t = ctx.tensor(0)
    if t.dtype not in (DType.string, DType.int64):
        ctx.fail(f"input must be string or int64, got {t.dtype}")
    return [TensorType(DType.int64 if t.dtype == DType.string else DType.string, t.shape)]


@op("CategoryMapper", infer=_infer_category_mapper, domain=ML)
def category_mapper(ctx, x):
    strings, ints = list(ctx.attr("cats_strings")), list(ctx.attr("cats_int64s"))
    if x.dtype == object:
        table = dict(zip(strings, ints))
        return np.array([table.get(s, ctx.attr("default_int64", -1)) for s in x.ravel()], np.int64).reshape(x.shape)
    table = dict(zip(ints, strings))
    return string_array([table.get(int(v), ctx.attr("default_string", "_Unused")) for v in x.ravel()], x.shape)


# ---- native lowerings ----
#
# Binarizer is a compute; the table-driven ops are C kernels whose tables (tree nodes,
# leaf weights, label maps, coefficients) are baked into the source as exact literals.
# Scores are combined in double as the reference does, then cast to the output type.

def _c_type(ctx, dt: DType, what: str = "input") -> str:
    if dt.c is None:
        ctx.fail(f"{what} of type {dt} has no native (C) type", stage="lower")
    return dt.c


def _table(ctx, name: str, ctype: str, data, dt: DType) -> str:
    """`static const ctype name[] = {...};` with exact literals (one dummy element when empty)."""
    from kiln.ops.tensor import c_literals
    data = np.asarray(data, dt.np).reshape(-1)
    lits = c_literals(data, dt) if data.size else ["0"]
    return f"  static const {ctype} {name}[{max(data.size, 1)}] = {{{', '.join(lits)}}};\n"


@lowering("Binarizer", domain=ML)
def _binarizer_lower(ctx, x):
    dt = ctx.input_types[0].dtype
    _c_type(ctx, dt)
    thr = float(ctx.attr("threshold", 0.0))
    if dt.is_float:  # the threshold is rounded to the input's type (NumPy's weak Python scalars)
        thr_e = L.const(float(np.asarray(thr, dt.np)), DType.float64)
        val = lambda v: L.cast(DType.float64, v)  # noqa: E731 - exact for every float type
    else:
        thr_e, val = L.const(thr, DType.float64), (lambda v: L.cast(DType.float64, v))
    return L.compute(x.shape, lambda *i: L.select(val(x[i]) > thr_e, L.const(1, dt), L.const(0, dt)),
                     "binarizer")


@lowering("ArrayFeatureExtractor", domain=ML)
def _feature_extractor_lower(ctx, x, indices):
    xt = ctx.input_types[0]
    t = _c_type(ctx, xt.dtype)
    width = xt.shape[-1] if xt.shape else 1
    k = math.prod(ctx.input_types[1].shape)
    rows = math.prod(xt.shape[:-1]) if xt.shape else 1
    body = f"""  for (int64_t j = 0; j < {k}; ++j) if (in1[j] < 0 || in1[j] >= {width}) return 1;
  for (int64_t r = 0; r < {rows}; ++r)
    for (int64_t j = 0; j < {k}; ++j) out0[r * {k} + j] = in0[r * {width} + in1[j]];
  (void)sizeof({t});
  return 0;"""
    return ctx.extern(body, [x, indices], [(ctx.out_shape(), xt.dtype)])


@lowering("LabelEncoder", domain=ML)
def _label_encoder_lower(ctx, x):
    if ctx.opset < 2:
        ctx.fail("LabelEncoder-1 maps strings, which native code cannot hold", stage="lower")
    keys, vals, default = _encoder_table(ctx)
    kt, vt = DType.from_numpy(keys.dtype), DType.from_numpy(vals.dtype)
    kc, vc = _c_type(ctx, kt, "keys"), _c_type(ctx, vt, "values")
    table = {_key(k): v for k, v in zip(keys.tolist(), vals)}  # as the reference: the last key wins
    nan_val = table.pop("nan", None)
    ordered = sorted(table)
    body = (_table(ctx, "keys", kc, ordered, kt) +
            _table(ctx, "vals", vc, [table[k] for k in ordered], vt) +
            _table(ctx, "dflt", vc, [default], vt))
    n = math.prod(ctx.input_types[0].shape)
    nan_case = (f"    if (v != v) {{ out0[i] = {'vals_nan[0]' if nan_val is not None else 'dflt[0]'}; continue; }}\n"
                if kt.is_float else "")
    if nan_val is not None:
        body += _table(ctx, "vals_nan", vc, [nan_val], vt)
    body += f"""  for (int64_t i = 0; i < {n}; ++i) {{
    const {kc} v = in0[i];
{nan_case}    int64_t lo = 0, hi = {len(ordered)};
    while (lo < hi) {{
      const int64_t mid = lo + (hi - lo) / 2;
      if (keys[mid] < v) lo = mid + 1; else hi = mid;
    }}
    out0[i] = (lo < {len(ordered)} && keys[lo] == v) ? vals[lo] : dflt[0];
  }}
  return 0;"""
    return ctx.extern(body, [x], [(ctx.out_shape(), vt)])


_POST = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")


def _c_post_transform(ctx, kind, n: int) -> str:
    """C over `double* a` (one row of n scores): the reference's `post_transform` in float64."""
    kind = _POST[kind] if isinstance(kind, int) and 0 <= kind < len(_POST) else kind
    if kind not in _POST:
        ctx.fail(f"post_transform must be one of {', '.join(_POST)}, got {kind!r}")
    if kind == "NONE":
        return ""
    if kind == "LOGISTIC":
        return f"    for (int64_t t = 0; t < {n}; ++t) a[t] = 1.0 / (1.0 + exp(-a[t]));\n"
    if kind == "PROBIT":
        return f"""    for (int64_t t = 0; t < {n}; ++t) {{
      double y = 2.0 * a[t] - 1.0;
      y = y < -1.0 ? -1.0 : y > 1.0 ? 1.0 : y;
      const double ln = log1p(-y * y), tt = 2.0 / (3.141592653589793 * 0.147) + ln / 2.0;
      const double sg = y > 0 ? 1.0 : y < 0 ? -1.0 : y;
      double x = sg * sqrt(sqrt(tt * tt - ln / 0.147) - tt);
      for (int k = 0; k < 3; ++k)
        if (fabs(y) < 1.0) x = x - (erf(x) - y) / (2.0 / sqrt(3.141592653589793) * exp(-x * x));
      a[t] = 1.4142135623730951 * x;
    }}
"""
    keep = "a[t] != 0" if kind == "SOFTMAX_ZERO" else "1"
    return f"""    {{
      double m = -INFINITY, s = 0;
      for (int64_t t = 0; t < {n}; ++t) if ({keep}) m = (a[t] > m || a[t] != a[t]) ? a[t] : m;
      for (int64_t t = 0; t < {n}; ++t) {{ a[t] = ({keep}) ? exp(a[t] - m) : 0.0; s += a[t]; }}
      s = s < 2.2250738585072014e-308 ? 2.2250738585072014e-308 : s;
      for (int64_t t = 0; t < {n}; ++t) a[t] = a[t] / s;
    }}
"""


def _tree_kernel(ctx, x, arrays, roots, leaves, n_targets: int, agg: int, base, post, out_dt: DType):
    xt = ctx.input_types[0]
    t = _c_type(ctx, xt.dtype)
    if xt.rank > 2:
        ctx.fail(f"X must be 1-D or 2-D, got {xt}", stage="lower")
    rows, width = (1, xt.shape[0]) if xt.rank == 1 else xt.shape if xt.rank == 2 else (1, 1)
    table, _, _ = _leaf_table(ctx, width, arrays, leaves, n_targets, agg)
    feat = np.asarray(arrays["feat"], np.int64)
    nn, nrows = len(feat), len(table)
    if len(feat) and feat.min() < -width:
        ctx.fail(f"a node reads feature {feat.min()} but X has {width} features")
    feat = np.where(feat < 0, feat + width, feat)

    def target(ids, leaf_flags):  # next node / leaf row, negative ids wrapped as NumPy does; -1: invalid
        ids = np.asarray(ids, np.int64)
        size = np.where(leaf_flags, nrows, nn)
        ok = (ids >= -size) & (ids < size)
        return np.where(ok, np.where(ids < 0, ids + size, ids), -1)
    nxt_t = target(arrays["true_id"], arrays["true_leaf"])
    nxt_f = target(arrays["false_id"], arrays["false_leaf"])
    # membership sets, sorted, CSR by node
    sets = arrays["sets"]
    mstart, mvals = [0], []
    for k in range(nn):
        mvals += sorted(sets.get(k, ()))
        mstart.append(len(mvals))
    # the leaf table as CSR rows of (target, value) where some leaf contributes
    has = np.zeros(table.shape, bool)
    leaf_of, target_of, _ = (np.asarray(v, np.int64) for v in leaves)
    if len(leaf_of):
        has[leaf_of, target_of] = True
    lstart, ltgt, lval = [0], [], []
    for r in range(nrows):
        cols = np.flatnonzero(has[r])
        ltgt += cols.tolist()
        lval += table[r, cols].tolist()
        lstart.append(len(ltgt))
    root_ids = []
    for r, is_leaf in roots:
        size = nrows if is_leaf else nn
        root_ids.append((r + size if -size <= r < 0 else r if 0 <= r < size else -1, int(is_leaf)))
    i64, u8, f64 = DType.int64, DType.uint8, DType.float64
    split = np.asarray(arrays["split"]).astype(np.float64)
    body = "".join([
        _table(ctx, "feat", "int64_t", feat, i64), _table(ctx, "mode", "uint8_t", arrays["mode"], u8),
        _table(ctx, "split", "double", split, f64), _table(ctx, "nan_true", "uint8_t", arrays["nan_true"], u8),
        _table(ctx, "nxt_t", "int64_t", nxt_t, i64), _table(ctx, "nxt_f", "int64_t", nxt_f, i64),
        _table(ctx, "leaf_t", "uint8_t", arrays["true_leaf"], u8),
        _table(ctx, "leaf_f", "uint8_t", arrays["false_leaf"], u8),
        _table(ctx, "mstart", "int64_t", mstart, i64), _table(ctx, "mvals", "double", mvals, f64),
        _table(ctx, "lstart", "int64_t", lstart, i64), _table(ctx, "ltgt", "int64_t", ltgt, i64),
        _table(ctx, "lval", "double", lval, f64),
        _table(ctx, "roots", "int64_t", [r for r, _ in root_ids], i64),
        _table(ctx, "root_leaf", "uint8_t", [lf for _, lf in root_ids], u8),
        _table(ctx, "base", "double", base if base is not None else [0.0], f64),
    ])
    neutral = {2: "INFINITY", 3: "-INFINITY"}.get(agg, "0.0")
    combine = {0: "a[tg] + w", 1: "a[tg] + w",
               2: "(a[tg] != a[tg] || w != w) ? NAN : (w < a[tg] ? w : a[tg])",
               3: "(a[tg] != a[tg] || w != w) ? NAN : (w > a[tg] ? w : a[tg])"}[agg]
    nb = 0 if base is None else len(base)
    if base is not None and nb not in (1, n_targets):
        ctx.fail(f"{nb} base values for {n_targets} targets")
    body += f"""  double* a = (double*)malloc(sizeof(double) * {max(n_targets, 1)});
  if (!a) return -1;
  int rc = 0;
  for (int64_t row = 0; row < {rows} && !rc; ++row) {{
    const {t}* xr = in0 + row * {width};
    for (int64_t tg = 0; tg < {n_targets}; ++tg) a[tg] = {neutral};
    for (int64_t tree = 0; tree < {len(root_ids)} && !rc; ++tree) {{
      int64_t n = roots[tree];
      int leaf = root_leaf[tree];
      for (int64_t step = 0; step <= {nn} && !leaf && n >= 0; ++step) {{
        const double v = (double)xr[feat[n]], s = split[n];
        int go;
        switch (mode[n]) {{
          case 0: go = v <= s; break;
          case 1: go = v < s; break;
          case 2: go = v >= s; break;
          case 3: go = v > s; break;
          case 4: go = v == s; break;
          case 5: go = v != s; break;
          default: {{
            int64_t lo = mstart[n], hi = mstart[n + 1];
            while (lo < hi) {{ const int64_t mid = lo + (hi - lo) / 2; if (mvals[mid] < v) lo = mid + 1; else hi = mid; }}
            go = lo < mstart[n + 1] && mvals[lo] == v;
          }}
        }}
        if (nan_true[n] && v != v) go = 1;
        leaf = go ? leaf_t[n] : leaf_f[n];
        n = go ? nxt_t[n] : nxt_f[n];
      }}
      if (!leaf || n < 0) {{ rc = 1; break; }}
      for (int64_t e = lstart[n]; e < lstart[n + 1]; ++e) {{
        const int64_t tg = ltgt[e];
        const double w = lval[e];
        a[tg] = {combine};
      }}
    }}
    if (rc) break;
    for (int64_t tg = 0; tg < {n_targets}; ++tg) {{
      if (isinf(a[tg])) a[tg] = 0.0;
      {f"a[tg] = a[tg] / {float(len(root_ids))!r};" if agg == 0 and root_ids else ""}
      {f"a[tg] = a[tg] + base[{'0' if nb == 1 else 'tg'}];" if nb else ""}
    }}
{_c_post_transform(ctx, post, n_targets)}    for (int64_t tg = 0; tg < {n_targets}; ++tg) out0[row * {n_targets} + tg] = ({out_dt.c})a[tg];
  }}
  free(a);
  return rc;"""
    return ctx.extern(body, [x], [(ctx.out_shape(), out_dt)])


@lowering("TreeEnsemble", domain=ML)
def _tree_ensemble_lower(ctx, x):
    dt = ctx.input_types[0].dtype
    arrays, roots, leaves, n_targets, agg = _tree_ensemble_parts(ctx, dt.np)
    return _tree_kernel(ctx, x, arrays, roots, leaves, n_targets, agg, None,
                        int(ctx.attr("post_transform", 0)), dt)


@lowering("TreeEnsembleRegressor", domain=ML)
def _tree_regressor_lower(ctx, x):
    dt = ctx.input_types[0].dtype
    _c_type(ctx, dt)
    arrays, roots, leaves, n_targets, agg, base = _regressor_parts(ctx, dt.np)
    return _tree_kernel(ctx, x, arrays, roots, leaves, n_targets, agg, np.asarray(base, np.float64),
                        ctx.attr("post_transform", "NONE"), DType.float32)


def _feature_table(ctx, name: str, default: float, width: int) -> tuple[str, str]:
    """A per-feature float32 attribute as a C table and the C index to read it with."""
    v = _per_feature(ctx, name, default, width)
    return _table(ctx, name, "float", v, DType.float32), ("0" if len(v) == 1 else "j")


@lowering("Scaler", domain=ML)
def _scaler_lower(ctx, x):
    xt = ctx.input_types[0]
    _c_type(ctx, xt.dtype)
    width = xt.shape[-1] if xt.shape else 1
    off, oi = _feature_table(ctx, "offset", 0.0, width)
    sc, si = _feature_table(ctx, "scale", 1.0, width)
    n = math.prod(xt.shape)
    body = off + sc + f"""  for (int64_t q = 0; q < {n}; ++q) {{
    const int64_t j = q % {width};
    const float d = (float)in0[q] - offset[{oi}];
    out0[q] = d * scale[{si}];
  }}
  return 0;"""
    return ctx.extern(body, [x], [(ctx.out_shape(), DType.float32)])


@lowering("Normalizer", domain=ML)
def _normalizer_lower(ctx, x):
    xt = ctx.input_types[0]
    _c_type(ctx, xt.dtype)
    if not xt.shape:
        ctx.fail("Normalizer needs at least one axis", stage="lower")
    norm = ctx.attr("norm", "MAX")
    width, rows = xt.shape[-1], math.prod(xt.shape[:-1])
    step = {"MAX": "{ const float v = fabsf(r[j]); d = (v > d || v != v || d != d) ? (d != d ? d : v) : d; }",
            "L1": "acc += (double)fabsf(r[j]);",
            "L2": "{ const float sq = r[j] * r[j]; acc += (double)sq; }"}.get(norm)
    if step is None:
        ctx.fail(f"norm must be MAX, L1 or L2, got {norm!r}")
    finish = {"MAX": "", "L1": "d = (float)acc;", "L2": "d = sqrtf((float)acc);"}[norm]
    body = f"""  float* r = (float*)malloc(sizeof(float) * ({width} + 1));
  if (!r) return -1;
  for (int64_t row = 0; row < {rows}; ++row) {{
    for (int64_t j = 0; j < {width}; ++j) r[j] = (float)in0[row * {width} + j];
    float d = -INFINITY;
    double acc = 0;
    for (int64_t j = 0; j < {width}; ++j) {step}
    {finish}
    for (int64_t j = 0; j < {width}; ++j) out0[row * {width} + j] = d == 0 ? r[j] : r[j] / d;
  }}
  free(r);
  return 0;"""
    return ctx.extern(body, [x], [(ctx.out_shape(), DType.float32)])


@lowering("Imputer", domain=ML)
def _imputer_lower(ctx, x):
    xt = ctx.input_types[0]
    t = _c_type(ctx, xt.dtype)
    floats = xt.dtype.is_float
    fill = np.asarray(ctx.attr("imputed_value_floats" if floats else "imputed_value_int64s"), xt.dtype.np).ravel()
    bad = ctx.attr("replaced_value_float" if floats else "replaced_value_int64", np.nan if floats else 0)
    width = xt.shape[-1] if xt.shape else 1
    if fill.size != 1 and (fill.size != width or not xt.shape):
        ctx.fail(f"{fill.size} imputed values for {width} features")
    if floats and math.isnan(bad):
        hit = "v != v"
    else:
        body_bad = _table(ctx, "bad", t, [np.asarray(bad).astype(xt.dtype.np)], xt.dtype)
        hit = "v == bad[0]"
    body = (_table(ctx, "fill", t, fill, xt.dtype) + ("" if hit == "v != v" else body_bad) +
            f"""  for (int64_t q = 0; q < {math.prod(xt.shape)}; ++q) {{
    const {t} v = in0[q];
    out0[q] = ({hit}) ? fill[{'0' if fill.size == 1 else f'q % {width}'}] : v;
  }}
  return 0;""")
    return ctx.extern(body, [x], [(ctx.out_shape(), xt.dtype)])


@lowering("LinearRegressor", domain=ML)
def _linear_regressor_lower(ctx, x):
    xt = ctx.input_types[0]
    _c_type(ctx, xt.dtype)
    if xt.rank > 2:
        ctx.fail(f"X must be 1-D or 2-D, got {xt}", stage="lower")
    rows, width = (1, xt.shape[0]) if xt.rank == 1 else xt.shape if xt.rank == 2 else (1, 1)
    n = int(ctx.attr("targets", 1))
    coef = np.asarray(ctx.attr("coefficients"), np.float32).ravel()
    if coef.size != n * width:
        ctx.fail(f"{coef.size} coefficients for {n} targets x {width} features")
    icpt = np.asarray(ctx.attr("intercepts", [0.0] * n), np.float32).ravel()
    if icpt.size not in (1, n):
        ctx.fail(f"{icpt.size} intercepts for {n} targets")
    body = (_table(ctx, "coef", "float", coef, DType.float32) + _table(ctx, "icpt", "float", icpt, DType.float32) +
            f"""  double a[{max(n, 1)}];
  for (int64_t row = 0; row < {rows}; ++row) {{
    for (int64_t t = 0; t < {n}; ++t) {{
      double acc = 0;
      for (int64_t j = 0; j < {width}; ++j) acc += (double)(float)in0[row * {width} + j] * (double)coef[t * {width} + j];
      a[t] = (double)((float)acc + icpt[{'0' if icpt.size == 1 else 't'}]);
    }}
{_c_post_transform(ctx, ctx.attr("post_transform", "NONE"), n)}    for (int64_t t = 0; t < {n}; ++t) out0[row * {n} + t] = (float)a[t];
  }}
  return 0;""")
    return ctx.extern(body, [x], [(ctx.out_shape(), DType.float32)])


@lowering("FeatureVectorizer", domain=ML)
def _feature_vectorizer_lower(ctx, *xs):
    dims = [int(d) for d in ctx.attr("inputdimensions")]
    rows, total = ctx.out_shape()
    body, col = [], 0
    for k, (xt, d) in enumerate(zip(ctx.input_types, dims)):
        _c_type(ctx, xt.dtype)
        r = 1 if xt.rank <= 1 else xt.shape[0]
        w = math.prod(xt.shape[1:]) if xt.rank > 1 else math.prod(xt.shape)
        if r != rows:
            ctx.fail(f"input {k} has {r} rows, the output {rows}", stage="lower")
        body.append(f"""  for (int64_t r = 0; r < {rows}; ++r)
    for (int64_t j = 0; j < {d}; ++j)
      out0[r * {total} + {col} + j] = j < {w} ? (float)in{k}[r * {w} + j] : 0.0f;
""")
        col += d
    return ctx.extern("".join(body) + "  return 0;", list(xs), [(ctx.out_shape(), DType.float32)])
