"""Tree ensembles of `ai.onnx.ml`: TreeEnsemble (opset 5), TreeEnsembleRegressor and
TreeEnsembleClassifier (what scikit-learn forests and boosting become through skl2onnx).

All three encodings are read into one `Forest` (node arrays, roots, leaf contributions).
The reference walks every row down each tree with NumPy; the native kernel
(kiln.lower.ml_trees) packs the forest into per-tree node records and runs
kiln/codegen/c_src/ml_trees.c (a branch-light walk, rows in parallel, or trees for few rows).

Scores are summed per row in tree order in float32 (float64 for float64 input), as ONNX
Runtime does, so labels at exact ties agree with it. TreeEnsembleClassifier follows ONNX
Runtime's rules where the spec is silent (two classes scored by one class id, base values
of size 1 or 2, the label of a binary model); the docstring of `_classify` says which.
"""

from __future__ import annotations

import math

import numpy as np

from dataclasses import dataclass

from kiln.dtypes import DType
from kiln.graph.types import TensorType
from kiln.ops.ml_common import ML, numeric_input, post_name, post_transform, rows_type
from kiln.ops.registry import OPAQUE, op
from kiln.ops.strings import string_array


_MODES = ("LEQ", "LT", "GTE", "GT", "EQ", "NEQ", "MEMBER")
_LEGACY_MODES = {"BRANCH_LEQ": 0, "BRANCH_LT": 1, "BRANCH_GTE": 2, "BRANCH_GT": 3, "BRANCH_EQ": 4,
                 "BRANCH_NEQ": 5, "LEAF": -1}
_AGGS = ("AVERAGE", "SUM", "MIN", "MAX")


@dataclass
class Forest:
    """One tree ensemble, whatever its encoding.

    Nodes are numbered 0..len(feat)-1; a node's true/false successor is a node, or a leaf
    when true_leaf/false_leaf says so. Leaves are numbered 0..n_leaves-1 and feed
    (leaf_of[k], target_of[k], weight_of[k]) contributions, combined in that order."""
    feat: np.ndarray
    mode: np.ndarray          # 0..6, _MODES
    split: np.ndarray
    nan_true: np.ndarray
    true_id: np.ndarray
    false_id: np.ndarray
    true_leaf: np.ndarray
    false_leaf: np.ndarray
    sets: dict                # node -> its BRANCH_MEMBER set
    roots: list               # (id, is_leaf) per tree
    leaf_of: np.ndarray
    target_of: np.ndarray
    weight_of: np.ndarray
    n_leaves: int
    n_targets: int
    agg: int                  # _AGGS index


def acc_dtype(dtype) -> np.dtype:
    """Trees compare and sum in float64 for float64 input, float32 otherwise."""
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


def _strs(v) -> list[str]:
    return [s.decode() if isinstance(s, bytes) else s for s in v]


def _attr_str(ctx, name, default):
    v = ctx.attr(name, default)
    return v.decode() if isinstance(v, bytes) else v


# ---- reading the encodings ----

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


def _ensemble_forest(ctx) -> Forest:
    """TreeEnsemble (opset 5): nodes and leaves in separate arrays."""
    modes = np.ravel(ctx.attr("nodes_modes")).astype(np.int64)
    if ((modes < 0) | (modes > 6)).any():
        ctx.fail(f"nodes_modes must be in 0..6 ({', '.join(_MODES)}), got {sorted(set(modes.tolist()))}")
    ints = lambda name, dtype=np.int64: np.asarray(ctx.attr(name), dtype).ravel()  # noqa: E731
    feat = ints("nodes_featureids")
    targets = ints("leaf_targetids")
    agg = int(ctx.attr("aggregate_function", 1))
    return Forest(feat=feat, mode=modes, split=np.ravel(ctx.attr("nodes_splits")).astype(np.float64),
                  nan_true=np.asarray(ctx.attr("nodes_missing_value_tracks_true", None) or [0] * len(feat), bool),
                  true_id=ints("nodes_truenodeids"), false_id=ints("nodes_falsenodeids"),
                  true_leaf=ints("nodes_trueleafs", bool), false_leaf=ints("nodes_falseleafs", bool),
                  sets=_member_sets(ctx, modes), roots=[(int(r), False) for r in ctx.attr("tree_roots")],
                  leaf_of=np.arange(len(targets)), target_of=targets,
                  weight_of=np.ravel(ctx.attr("leaf_weights")).astype(np.float64), n_leaves=len(targets),
                  n_targets=int(ctx.attr("n_targets")), agg=agg)


def _legacy_forest(ctx, prefix: str, n_targets: int, agg: int) -> Forest:
    """TreeEnsembleRegressor/Classifier: nodes named (tree id, node id), leaves are nodes of
    mode LEAF, contributions named by `prefix` ("target" or "class")."""
    trees, ids = list(ctx.attr("nodes_treeids")), list(ctx.attr("nodes_nodeids"))
    pos = {(t, n): i for i, (t, n) in enumerate(zip(trees, ids))}
    modes = [_LEGACY_MODES.get(m) for m in _strs(ctx.attr("nodes_modes"))]
    if None in modes:
        ctx.fail(f"nodes_modes must be among {', '.join(_LEGACY_MODES)}, got {_strs(ctx.attr('nodes_modes'))}")
    leaf = np.array(modes, np.int64) < 0
    for name in ("nodes_featureids", "nodes_truenodeids", "nodes_falsenodeids", "nodes_modes"):
        if len(ctx.attr(name)) != len(ids):
            ctx.fail(f"{name} has {len(ctx.attr(name))} entries, nodes_nodeids {len(ids)}")

    def children(name):
        out = np.zeros(len(ids), np.int64)
        for i, (t, c) in enumerate(zip(trees, ctx.attr(name))):
            if not leaf[i]:
                if (t, c) not in pos:
                    ctx.fail(f"{name} refers to a node (tree, id) = {(t, c)} that does not exist")
                out[i] = pos[t, c]
        return out

    true_id, false_id = children("nodes_truenodeids"), children("nodes_falsenodeids")
    splits = ctx.attr("nodes_values_as_tensor", None)
    splits = ctx.attr("nodes_values", [0.0] * len(ids)) if splits is None else splits
    nan_true = ctx.attr("nodes_missing_value_tracks_true", None) or [0] * len(ids)
    children_of = set(true_id[~leaf].tolist()) | set(false_id[~leaf].tolist())
    roots: dict = {}
    for i, t in enumerate(trees):
        if i not in children_of:
            roots.setdefault(t, i)
    try:
        leaf_of = [pos[k] for k in zip(ctx.attr(f"{prefix}_treeids"), ctx.attr(f"{prefix}_nodeids"))]
    except KeyError as e:
        ctx.fail(f"a {prefix} weight refers to a node (tree, id) = {e} that does not exist")
    weights = ctx.attr(f"{prefix}_weights_as_tensor", None)
    weights = ctx.attr(f"{prefix}_weights") if weights is None else weights
    return Forest(feat=np.asarray(ctx.attr("nodes_featureids"), np.int64), mode=np.maximum(modes, 0),
                  split=np.ravel(splits).astype(np.float64), nan_true=np.asarray(nan_true, bool),
                  true_id=true_id, false_id=false_id, true_leaf=leaf[true_id], false_leaf=leaf[false_id],
                  sets={}, roots=[(r, bool(leaf[r])) for r in roots.values()],
                  leaf_of=np.asarray(leaf_of, np.int64), target_of=np.asarray(ctx.attr(f"{prefix}_ids"), np.int64),
                  weight_of=np.ravel(weights).astype(np.float64), n_leaves=len(ids), n_targets=n_targets, agg=agg)


def _check(ctx, f: Forest, n_features: int) -> None:
    """Every id in range: what both the reference and the kernel rely on."""
    nn = len(f.feat)
    for name in ("mode", "split", "nan_true", "true_id", "false_id", "true_leaf", "false_leaf"):
        if len(getattr(f, name)) != nn:
            ctx.fail(f"the node arrays differ in length ({name}: {len(getattr(f, name))}, features: {nn})")
    for ids, leafs, name in ((f.true_id, f.true_leaf, "true"), (f.false_id, f.false_leaf, "false")):
        size = np.where(leafs, f.n_leaves, nn)
        if ((ids < 0) | (ids >= size)).any():
            ctx.fail(f"a node's {name} successor is out of range")
    for r, is_leaf in f.roots:
        if not 0 <= r < (f.n_leaves if is_leaf else nn):
            ctx.fail(f"tree root {r} is out of range")
    internal = np.zeros(nn, bool)  # the nodes some path tests (a LEAF node's feature is unused)
    internal[[r for r, leaf in f.roots if not leaf]] = True
    internal[f.true_id[~f.true_leaf]] = True
    internal[f.false_id[~f.false_leaf]] = True
    bad = f.feat[internal & ((f.feat < 0) | (f.feat >= n_features))]
    if len(bad):
        ctx.fail(f"node feature ids must be in [0, {n_features}) (X's features), got {sorted(set(bad.tolist()))[:5]}")
    if not (len(f.leaf_of) == len(f.target_of) == len(f.weight_of)):
        ctx.fail(f"leaf contributions differ in length: {len(f.leaf_of)} leaves, {len(f.target_of)} targets, "
                 f"{len(f.weight_of)} weights")
    if len(f.target_of) and not (0 <= f.target_of.min() and f.target_of.max() < f.n_targets):
        ctx.fail(f"target/class ids must be in [0, {f.n_targets}), got {sorted(set(f.target_of.tolist()))[:8]}")
    if not 0 <= f.agg <= 3:
        ctx.fail(f"aggregate_function must be in 0..3 ({', '.join(_AGGS)}), got {f.agg}")


# ---- the reference ----

def _descend(ctx, f: Forest, x: np.ndarray, split: np.ndarray, root: int, root_is_leaf: bool) -> np.ndarray:
    """The leaf each row of `x` reaches from `root`, all rows stepping together."""
    idx = np.full(len(x), root, np.int64)
    leaf = np.full(len(x), root_is_leaf)
    for _ in range(len(f.feat) + 1):
        live = np.flatnonzero(~leaf)
        if not len(live):
            return idx
        n = idx[live]
        v, s = x[live, f.feat[n]], split[n]
        member = np.zeros(len(n), bool)
        for j in np.flatnonzero(f.mode[n] == 6).tolist():  # BRANCH_MEMBER nodes only
            member[j] = v[j] in f.sets.get(int(n[j]), ())
        go = np.choose(f.mode[n], [v <= s, v < s, v >= s, v > s, v == s, v != s, member])
        go |= f.nan_true[n] & np.isnan(v)
        idx[live] = np.where(go, f.true_id[n], f.false_id[n])
        leaf[live] = np.where(go, f.true_leaf[n], f.false_leaf[n])
    ctx.fail(f"tree rooted at node {root} has a cycle")


def forest_scores(ctx, f: Forest, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(acc, has) [N, n_targets]: each row's leaf weights combined tree after tree (SUM and
    AVERAGE add, MIN/MAX keep the least/greatest), and whether any leaf fed the target."""
    a = acc_dtype(x.dtype)
    x = np.atleast_2d(x).astype(a)
    _check(ctx, f, x.shape[1])
    split, weight = f.split.astype(a), f.weight_of.astype(a)
    order = np.argsort(f.leaf_of, kind="stable")
    starts = np.searchsorted(f.leaf_of[order], np.arange(f.n_leaves + 1))
    acc = np.zeros((len(x), f.n_targets), a)
    has = np.zeros((len(x), f.n_targets), bool)
    for root, is_leaf in f.roots:
        leaf = _descend(ctx, f, x, split, root, is_leaf)
        count = starts[leaf + 1] - starts[leaf]
        for k in range(int(count.max(initial=0))):
            rows = np.flatnonzero(count > k)
            e = order[starts[leaf[rows]] + k]
            tg, w = f.target_of[e], weight[e]
            cur, seen = acc[rows, tg], has[rows, tg]
            if f.agg <= 1:
                acc[rows, tg] = cur + w
            else:
                better = (w < cur) if f.agg == 2 else (w > cur)
                acc[rows, tg] = np.where(~seen | better, w, cur)
            has[rows, tg] = True
    return acc, has


def _finish(f: Forest, acc, has, base) -> np.ndarray:
    """Scores before the post transform: AVERAGE divided, base values added; as ONNX Runtime,
    a target no leaf fed is 0 (its base value alone when it is the only target)."""
    out = np.where(has, acc, acc.dtype.type(0))
    if f.agg == 0:
        out = out / acc.dtype.type(len(f.roots))
    if base is not None and len(base):
        out = out + np.asarray(base, acc.dtype)
    return out if f.n_targets == 1 else np.where(has, out, acc.dtype.type(0))


def _infer_tree_ensemble(ctx):
    t = ctx.tensor(0)
    if not t.dtype.is_float or t.rank not in (None, 2):
        ctx.fail(f"X must be a 2-D float tensor [N, F], got {t}")
    return [TensorType(t.dtype, (t.shape[0] if t.shape else ctx.new_dim(), int(ctx.attr("n_targets"))))]


@op("TreeEnsemble", infer=_infer_tree_ensemble, domain=ML, fusion=OPAQUE)
def tree_ensemble(ctx, x):
    f = _ensemble_forest(ctx)
    acc, has = forest_scores(ctx, f, x)
    return post_transform(ctx, _finish(f, acc, has, None).astype(np.float64),
                          int(ctx.attr("post_transform", 0))).astype(x.dtype)


def _regressor_forest(ctx) -> tuple[Forest, np.ndarray]:
    agg = _attr_str(ctx, "aggregate_function", "SUM")
    if agg not in _AGGS:
        ctx.fail(f"aggregate_function must be AVERAGE, SUM, MIN or MAX, got {agg!r}")
    f = _legacy_forest(ctx, "target", int(ctx.attr("n_targets", 1)), _AGGS.index(agg))
    base = ctx.attr("base_values_as_tensor", None)
    base = np.ravel(ctx.attr("base_values", []) if base is None else base).astype(np.float64)
    if len(base) not in (0, 1, f.n_targets):
        ctx.fail(f"{len(base)} base values for {f.n_targets} targets")
    return f, base


def _infer_tree_regressor(ctx):
    return [rows_type(ctx, numeric_input(ctx), int(ctx.attr("n_targets", 1)))]


@op("TreeEnsembleRegressor", infer=_infer_tree_regressor, domain=ML, fusion=OPAQUE)
def tree_ensemble_regressor(ctx, x):
    f, base = _regressor_forest(ctx)
    acc, has = forest_scores(ctx, f, x)
    return post_transform(ctx, _finish(f, acc, has, base).astype(np.float64),
                          _attr_str(ctx, "post_transform", "NONE")).astype(np.float32)


# ---- TreeEnsembleClassifier ----

@dataclass
class _Classes:
    labels: list              # class labels (ints or strs)
    strings: bool
    base: np.ndarray
    binary: bool              # two classes, every weight on one class id
    all_positive: bool        # no negative class weight
    post: str


def _classifier_forest(ctx) -> tuple[Forest, _Classes]:
    ints, strs = ctx.attr("classlabels_int64s", None), ctx.attr("classlabels_strings", None)
    if (ints is None) == (strs is None):
        ctx.fail("exactly one of classlabels_int64s and classlabels_strings must be given")
    labels = [int(v) for v in ints] if ints is not None else _strs(strs)
    if len(labels) < 2:
        ctx.fail(f"{len(labels)} class label(s): a classifier needs at least two")
    f = _legacy_forest(ctx, "class", len(labels), 1)
    base = ctx.attr("base_values_as_tensor", None)
    base = np.ravel(ctx.attr("base_values", []) if base is None else base).astype(np.float64)
    if len(base) not in (0, len(labels)) and not (len(labels) == 2 and len(base) == 1):
        ctx.fail(f"{len(base)} base values for {len(labels)} classes")
    binary = len(labels) == 2 and len(set(f.target_of.tolist())) == 1
    post = post_name(ctx, _attr_str(ctx, "post_transform", "NONE"))
    if len(labels) == 2 and post == "PROBIT" and 1 not in f.target_of.tolist() and len(base) != 2:
        ctx.fail("two classes scored by class 0 only, under PROBIT: ONNX Runtime leaves the second score "
                 "unwritten, so kiln refuses it")
    return f, _Classes(labels, strs is not None, base, binary, bool((f.weight_of >= 0).all()), post)


def _classify(f: Forest, c: _Classes, acc, has) -> tuple[np.ndarray, np.ndarray]:
    """(label index, or for two classes not `binary` the raw 1/0; scores [N, classes] float64).

    As ONNX Runtime: with more than two classes, base values are added and the label is the
    first class of greatest score among those some leaf (or base value) fed. With two:
    - two base values: if class 1 was fed, score1 = base1 + score0 and score0 = -score1
      (else each adds its own); one base value: added to class 0;
    - a class 1 nobody fed leaves one score s, written as two: [1 - s, s] for a `binary`
      model of positive weights, [logistic(-s), logistic(s)] under LOGISTIC, else [-s, s];
    - otherwise both scores go through post_transform, an unfed class's as 0;
    - the label: class 1 if the positive score (class 1's if fed, else class 0's) exceeds
      0.5 (binary, positive weights) or 0 (otherwise), else class 0."""
    s = acc.copy()
    h = has.copy()
    t = acc.dtype.type
    n = len(s)
    if len(c.labels) > 2:
        nb = len(c.base)
        if nb:
            s[:, :nb] = np.where(h[:, :nb], s[:, :nb] + c.base.astype(acc.dtype), c.base.astype(acc.dtype))
            h[:, :nb] = True
        masked = np.where(h, s, -np.inf)
        label = np.where(h.any(1), np.argmax(masked, 1), 0)
        return label, post_transform(None, s.astype(np.float64), c.post)
    one = ~h[:, 1]  # rows left with one score
    h1 = h[:, 1]
    if len(c.base) == 2:
        b0, b1 = t(c.base[0]), t(c.base[1])
        s1 = np.where(h1, b1 + s[:, 0], s[:, 1] + b1)
        s0 = np.where(h1, -s1, s[:, 0] + b0)
        s[:, 0], s[:, 1] = s0, s1
        one[:] = False
    elif len(c.base) == 1:
        s[:, 0] = s[:, 0] + t(c.base[0])
    pos = np.where(~one & h1, s[:, 1], np.where(h[:, 0], s[:, 0], t(0)))
    wa = np.full(n, 3 if len(c.base) == 0 else -1)
    if c.binary:
        win = pos > (t(0.5) if c.all_positive else t(0))
        wa = np.where(win, 0, 1) if c.all_positive else np.where(win, 2, 3)
    else:
        win = pos > 0
    label = win.astype(np.int64)
    z = np.where(h, s, t(0)).astype(np.float64)  # ORT writes an unfed class's score as 0
    out = np.zeros((n, 2))
    two = ~one
    if two.any():
        out[two] = post_transform(None, z[two], c.post)
    sc = s[:, 0]
    single = np.stack([sc, np.zeros(n, sc.dtype)], 1).astype(np.float64)
    m = (wa == 0) | (wa == 1)
    single[m] = np.stack([t(1) - sc, sc], 1).astype(np.float64)[m]
    m = (wa == 2) | (wa == 3)
    d = sc.astype(np.float64)
    single[m] = (np.stack([1 / (1 + np.exp(d)), 1 / (1 + np.exp(-d))], 1) if c.post == "LOGISTIC"
                 else np.stack([-d, d], 1))[m]
    out[one] = single[one]
    return label, out


def _infer_tree_classifier(ctx):
    t = numeric_input(ctx)
    n_classes = len(ctx.attr("classlabels_int64s", None) or ctx.attr("classlabels_strings", None) or [])
    lt = DType.string if ctx.attr("classlabels_strings", None) is not None else DType.int64
    z = rows_type(ctx, t, n_classes)
    return [TensorType(lt, z.shape[:1]), z]


@op("TreeEnsembleClassifier", infer=_infer_tree_classifier, domain=ML, fusion=OPAQUE)
def tree_ensemble_classifier(ctx, x):
    f, c = _classifier_forest(ctx)
    acc, has = forest_scores(ctx, f, x)
    label, scores = _classify(f, c, acc, has)
    if len(c.labels) > 2 or c.binary:
        labels = [c.labels[i] for i in label.tolist()]
    else:  # ONNX Runtime's positive/negative label: 1/0, or the second/first string label
        labels = [c.labels[i] for i in label.tolist()] if c.strings else label.tolist()
    y = string_array(labels, (len(labels),)) if c.strings else np.asarray(labels, np.int64)
    return y, scores.astype(np.float32)
