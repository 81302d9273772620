"""Native (cpu) lowerings of the remaining families against the NumPy reference:
recurrent layers, signal processing, detection, classical ML, optimizers, random.

Each case is a one-node ONNX model: runtime inputs are random graph inputs,
compile-time inputs are initializers (C(...)). All cases of a test are lowered
node by node and built as one C module (one compiler run, cached), then each
kernel is run on the inputs and compared with the interpreter. Kernels whose
output sizes depend on data report their dims in one extra int64 parameter.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper as oh, numpy_helper

import kiln
from kiln.codegen import build_c
from kiln.interpreter import Interpreter
from kiln.loops import LoopModule
from kiln.lower.kernel import lower_node

RNG = np.random.default_rng(0)
ML = "ai.onnx.ml"
TRAINING = "ai.onnx.preview.training"


def rand(shape, dtype=np.float32, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(dtype)


class C:
    """A compile-time known input (an initializer)."""

    def __init__(self, data, dtype=None):
        self.data = np.asarray(data, dtype)


def case(op, inputs, attrs=None, opset=None, outputs=1, domain="", id=None, rtol=1e-5, atol=1e-6):
    """A one-node model: each input is an array (a graph input), a C(...) or None (absent)."""
    names = ["" if v is None else f"x{k}" for k, v in enumerate(inputs)]
    outs = [o if isinstance(o, str) else f"y{k}" for k, o in enumerate(
        range(outputs) if isinstance(outputs, int) else outputs)]
    node = oh.make_node(op, names, outs, domain=domain or None, **(attrs or {}))
    vi = [oh.make_tensor_value_info(n, oh.np_dtype_to_tensor_dtype(v.dtype), v.shape)
          for n, v in zip(names, inputs) if isinstance(v, np.ndarray)]
    init = [numpy_helper.from_array(v.data, n) for n, v in zip(names, inputs) if isinstance(v, C)]
    g = oh.make_graph([node], "g", vi, [oh.make_tensor_value_info(o, 0, None) for o in outs if o], init)
    opsets = [oh.make_opsetid("", opset or 22)]
    if domain:
        opsets.append(oh.make_opsetid(domain, opset or (5 if domain == ML else 1)))
    model = oh.make_model(g, opset_imports=opsets)
    return pytest.param(model, [v for v in inputs if isinstance(v, np.ndarray)], rtol, atol, id=id or op)


def _lower(model, name):
    graph = kiln.load_onnx(model)
    (node,) = graph.nodes
    values = [None if v is None else v.const for v in node.inputs]
    return graph, lower_node(node, graph.opset(node.domain), values, name)


def check_all(cases):
    """Lower every case, build them as one module, compare each kernel with the interpreter."""
    built = [_lower(model, f"k{n}") + (inputs, rtol, atol)
             for n, (model, inputs, rtol, atol) in enumerate(cases)]
    mod = build_c(LoopModule([b[1] for b in built]))
    for n, (graph, func, inputs, rtol, atol) in enumerate(built):
        node = graph.nodes[0]
        want = Interpreter(graph).run(inputs)
        fed = dict(zip([v.id for v in graph.inputs], inputs))
        args = [np.array(v.const if v.const is not None else fed[v.id], order="C")
                for v in node.inputs if v is not None]
        bufs = [np.zeros(p.shape, p.dtype.np) for p in func.params[len(args):]]
        mod[func.name](*args, *bufs)
        used = [k for k, v in enumerate(node.outputs) if v is not None]
        if getattr(func, "dynamic", False):
            dims, at, got = bufs[-1].tolist(), 0, []
            for buf in bufs[:-1]:
                shape = tuple(dims[at:at + buf.ndim])
                at += buf.ndim
                got.append(buf.reshape(-1)[:int(np.prod(shape))].reshape(shape))
        else:
            got = bufs
        got = [got[k] for k in used]
        assert len(got) == len(want), node
        for k, (w, g) in enumerate(zip(want, got)):
            what = f"case {n} ({node.op} {node.attrs}) output {k}"
            assert g.dtype == w.dtype and g.shape == w.shape, (what, g.dtype, g.shape, w.dtype, w.shape)
            if w.dtype.kind in "fc":
                finite = np.abs(w.astype(np.float64))[np.isfinite(w)]
                scale = max(1.0, float(finite.max(initial=0)))
                np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol,
                                           atol=atol * scale, err_msg=what)
            else:
                np.testing.assert_array_equal(g, w, err_msg=what)


def values(cases):
    return [tuple(c.values) for c in cases]


# ---- RNN, GRU, LSTM ----

_RNN_IDS = iter(range(10**6))


def rnn_case(kind, seq=4, batch=3, inp=5, hs=4, nd=1, layout=0, bias=True, lens=None, h0=False,
             c0=False, peep=False, outputs=None, dtype=np.float32, **attrs):
    g = {"RNN": 1, "GRU": 3, "LSTM": 4}[kind]
    x = rand((batch, seq, inp) if layout else (seq, batch, inp), dtype)
    state = (batch, nd, hs) if layout else (nd, batch, hs)
    ins = [x, rand((nd, g * hs, inp), dtype, 0.5), rand((nd, g * hs, hs), dtype, 0.5),
           rand((nd, 2 * g * hs), dtype, 0.5) if bias else None,
           None if lens is None else np.asarray(lens, np.int32),
           rand(state, dtype) if h0 else None]
    if kind == "LSTM":
        ins += [rand(state, dtype) if c0 else None, rand((nd, 3 * hs), dtype, 0.5) if peep else None]
    while ins[-1] is None:
        ins.pop()
    n_out = outputs or (3 if kind == "LSTM" else 2)
    direction = "bidirectional" if nd == 2 else attrs.pop("direction", "forward")
    tol = dict(rtol=3e-3, atol=3e-3) if dtype == np.float16 else {}
    return case(kind, ins, dict(hidden_size=hs, direction=direction, layout=layout, **attrs),
                outputs=n_out, id=f"{kind}-{next(_RNN_IDS)}", **tol)


RNN_CASES = [rnn_case(kind, **kw) for kind in ("RNN", "GRU", "LSTM") for kw in (
    dict(), dict(bias=False, outputs=1), dict(nd=2, h0=True, c0=True),
    dict(direction="reverse", lens=[4, 2, 0]), dict(nd=2, lens=[3, 4, 1], layout=1),
    dict(layout=1, h0=True, c0=True, peep=True, clip=0.7), dict(dtype=np.float64, nd=2, peep=True),
    dict(dtype=np.float16, seq=2))] + [
    rnn_case("RNN", nd=2, activations=["LeakyRelu", "Elu"], activation_alpha=[0.3, 0.7]),
    rnn_case("RNN", activations=["Affine"], activation_alpha=[0.5], activation_beta=[0.25]),
    rnn_case("RNN", activations=["ThresholdedRelu"], activation_alpha=[0.1]),
    rnn_case("RNN", activations=["ScaledTanh"], activation_alpha=[1.5], activation_beta=[0.5]),
    rnn_case("RNN", nd=2, activations=["Softsign", "Softplus"]),
    rnn_case("GRU", activations=["HardSigmoid", "Relu"], activation_alpha=[0.3], activation_beta=[0.4]),
    rnn_case("GRU", nd=2, linear_before_reset=1, h0=True, lens=[2, 4, 3]),
    rnn_case("GRU", linear_before_reset=1, clip=0.5, layout=1),
    rnn_case("LSTM", input_forget=1, peep=True, h0=True, c0=True),
    rnn_case("LSTM", nd=2, activations=["Sigmoid", "Tanh", "Relu", "HardSigmoid", "Softsign", "Tanh"],
             activation_alpha=[0.2], activation_beta=[0.5], lens=[1, 4, 2]),
    rnn_case("LSTM", outputs=["", "", "yc"], hs=7, inp=3),
    rnn_case("LSTM", outputs=["", "yh"], seq=1, batch=1, hs=1, inp=1),
    # sizes past the kernels' vector blocks (16 floats, 8 doubles), with ragged tails
    *[rnn_case(kind, seq=6, batch=5, inp=17, hs=20, nd=2, lens=[6, 3, 0, 5, 1]) for kind in ("RNN", "GRU", "LSTM")],
    rnn_case("GRU", seq=3, batch=2, inp=9, hs=9, dtype=np.float64, linear_before_reset=1),
    rnn_case("LSTM", seq=2, batch=3, inp=33, hs=16, peep=True, h0=True, c0=True, layout=1),
]


def test_recurrent():
    check_all(values(RNN_CASES))


# ---- signal: DFT, STFT, windows, MelWeightMatrix ----

SIG = dict(rtol=1e-4, atol=1e-5)
REAL, CPLX = rand((2, 9, 3, 1)), rand((2, 8, 3, 2))

SIGNAL_CASES = [
    case("DFT", [REAL], opset=17, id="DFT-real-axis1", **SIG),
    case("DFT", [CPLX], {"axis": 2, "inverse": 1}, opset=17, id="DFT-17-inverse-axis2", **SIG),
    case("DFT", [CPLX, C(11)], {"axis": 1, "onesided": 1}, opset=17, id="DFT-17-onesided-padded", **SIG),
    case("DFT", [REAL, C(5), C(1)], opset=20, id="DFT-truncated", **SIG),
    case("DFT", [REAL, None, C(-2)], {"onesided": 1}, opset=20, id="DFT-rfft-neg-axis", **SIG),
    case("DFT", [CPLX, None, np.array(2, np.int64)], opset=20, id="DFT-runtime-axis", **SIG),
    case("DFT", [CPLX, None, np.array(-3, np.int64)], {"inverse": 1}, opset=20, id="DFT-runtime-axis-neg", **SIG),
    case("DFT", [CPLX[:, :5], None, C(1)], {"inverse": 1, "onesided": 1}, opset=20, id="DFT-irfft-even", **SIG),
    case("DFT", [CPLX[:, :5], C(9), C(1)], {"inverse": 1, "onesided": 1}, opset=20, id="DFT-irfft-odd", **SIG),
    case("DFT", [CPLX[:, :5], C(4), C(1)], {"inverse": 1, "onesided": 1}, opset=20, id="DFT-irfft-short", **SIG),
    case("DFT", [rand((3, 16, 2), np.float64), None, C(0)], {"onesided": 1}, opset=20, id="DFT-f64", **SIG),
    case("DFT", [rand((4, 6, 1), np.float16)], opset=20, id="DFT-f16", rtol=1e-2, atol=1e-2),
    case("DFT", [rand((0, 4, 2))], opset=20, id="DFT-empty-batch"),
    case("DFT", [rand((4, 300, 1))], {"onesided": 1}, opset=20, id="DFT-parallel-lines", **SIG),
    case("STFT", [rand((2, 32, 1)), C(4), rand((8,))], id="STFT-window", **SIG),
    case("STFT", [rand((1, 30, 2)), C(5), None, C(9)], {"onesided": 0}, id="STFT-complex-two-sided", **SIG),
    case("STFT", [rand((3, 20, 1), np.float64), C(3), rand((6,), np.float64), C(6)], id="STFT-f64", **SIG),
    case("STFT", [rand((1, 12, 1)), C(12)], id="STFT-one-frame", **SIG),
    *[case(w, [C(n)], {"periodic": p, "output_datatype": dt}, id=f"{w}-{n}-{p}-{dt}")
      for w, n, p, dt in (("HannWindow", 10, 1, 1), ("HannWindow", 7, 0, 11), ("HammingWindow", 16, 1, 11),
                          ("HammingWindow", 1, 0, 1), ("BlackmanWindow", 9, 0, 1), ("BlackmanWindow", 0, 1, 1),
                          ("BlackmanWindow", 33, 1, 10))],
    case("MelWeightMatrix", [C(8), C(64), np.array(8000, np.int64), np.array(0.0, np.float32),
                             np.array(4000.0, np.float32)], id="Mel"),
    case("MelWeightMatrix", [C(5), C(33), np.array(16000), np.array(100.0), np.array(7000.0)],
         {"output_datatype": 11}, id="Mel-f64"),
    case("MelWeightMatrix", [C(20, np.int32), C(512, np.int32), np.array(22050, np.int32),
                             np.array(30.0, np.float32), np.array(11025.0, np.float32)], id="Mel-big"),
]


def test_signal():
    check_all(values(SIGNAL_CASES))


# ---- detection: NonMaxSuppression ----

def _boxes(b, n, center=False):
    lo = RNG.integers(0, 6, (b, n, 2)).astype(np.float32)
    size = RNG.integers(0, 6, (b, n, 2)).astype(np.float32)
    if center:
        return np.concatenate([lo[..., ::-1] + size / 2, size[..., ::-1]], -1)
    box = np.concatenate([lo, lo + size], -1)
    flip = RNG.random((b, n)) < 0.3
    box[flip] = box[flip][:, [2, 3, 0, 1]]  # corners in either order
    return box


_SCORES = RNG.integers(0, 6, (2, 3, 12)).astype(np.float32) / 5  # ties on purpose
_SCORES[0, 1, 3] = np.nan
NMS_CASES = [
    case("NonMaxSuppression", [_boxes(2, 12), _SCORES, C([9]), C([0.3], np.float32), C([0.1], np.float32)],
         id="NMS-all-inputs"),
    case("NonMaxSuppression", [_boxes(2, 12), _SCORES, np.array([3]), np.array([0.0], np.float32)],
         id="NMS-runtime-limit-zero-iou"),
    case("NonMaxSuppression", [_boxes(2, 12, True), _SCORES, C([100]), np.array([0.2], np.float32)],
         {"center_point_box": 1}, id="NMS-center"),
    case("NonMaxSuppression", [_boxes(2, 12), _SCORES], id="NMS-no-limit"),
    case("NonMaxSuppression", [_boxes(2, 12), _SCORES, C([4]), C([1.0], np.float32), np.array([2.0], np.float32)],
         id="NMS-nothing-over-threshold"),
    case("NonMaxSuppression", [np.tile(_boxes(1, 1), (1, 6, 1)), _SCORES[:1, :, :6], C([6]),
                               C([0.999], np.float32)], id="NMS-identical-boxes"),
]


def test_non_max_suppression():
    check_all(values(NMS_CASES))


# ---- training: Adagrad, Adam, Momentum ----

def _optimizer(op, states, n=1, t=3, dtype=np.float32, **attrs):
    shapes = [(3, 4), (5,), (2, 1, 3)][:n]
    ins = [np.array(0.1, np.float32), np.array(t, np.int64)]
    for k in range(2 + states):  # X, G, then states; the squared-gradient state (last) is >= 0
        squares = k == 1 + states and op in ("Adagrad", "Adam")
        ins += [np.abs(rand(s, dtype)) if squares else rand(s, dtype) for s in shapes]
    return case(op, ins, attrs, domain=TRAINING, outputs=n * (1 + states), id=f"{op}-{n}-{t}-{attrs}")


TRAINING_CASES = [
    _optimizer("Adagrad", 1, decay_factor=0.1, epsilon=1e-5, norm_coefficient=0.01),
    _optimizer("Adagrad", 1, n=3, t=0, dtype=np.float64),
    _optimizer("Adam", 2, alpha=0.8, beta=0.9, epsilon=1e-4, norm_coefficient=0.02, norm_coefficient_post=0.1),
    _optimizer("Adam", 2, n=2, t=0),
    _optimizer("Adam", 2, n=3, t=7, dtype=np.float64),
    _optimizer("Momentum", 1, mode="standard", alpha=0.9, beta=0.5),
    _optimizer("Momentum", 1, n=2, t=0, mode="nesterov", alpha=0.7, beta=0.3, norm_coefficient=0.1),
]


def test_optimizers():
    check_all(values(TRAINING_CASES))


# ---- ai.onnx.ml ----

def _tree_ensemble(n_trees=3, depth=3, n_feat=4, n_targets=2, modes=(0, 1, 2, 3, 4, 5, 6), missing=True,
                   dtype=np.float32, probabilities=False, **attrs):
    """Random trees in TreeEnsemble's encoding (splits on small integers, so EQ/MEMBER branch)."""
    a = {k: [] for k in ("feat", "mode", "split", "tid", "fid", "tleaf", "fleaf", "miss", "lt", "lw", "mem")}

    def build(d):
        if d == 0 or (d < depth and RNG.random() < 0.25):
            a["lt"].append(int(RNG.integers(0, n_targets)))
            a["lw"].append(float(RNG.uniform(0.05, 0.95) if probabilities else RNG.standard_normal()))
            return len(a["lt"]) - 1, 1
        k = len(a["feat"])
        mode = int(RNG.choice(modes))
        a["feat"].append(int(RNG.integers(0, n_feat)))
        a["mode"].append(mode)
        a["split"].append(float(RNG.integers(0, 4)) + (0.5 if mode in (0, 1, 2, 3) and RNG.random() < 0.5 else 0))
        a["miss"].append(int(missing and RNG.random() < 0.5))
        for key in ("tid", "fid", "tleaf", "fleaf"):
            a[key].append(0)
        if mode == 6:
            a["mem"] += [float(v) for v in RNG.choice(5, 2, replace=False)] + [np.nan]
        (a["tid"][k], a["tleaf"][k]), (a["fid"][k], a["fleaf"][k]) = build(d - 1), build(d - 1)
        return k, 0

    roots = [build(depth)[0] for _ in range(n_trees)]
    t = lambda v, dt=dtype: numpy_helper.from_array(np.asarray(v, dt))  # noqa: E731
    attrs = dict(nodes_featureids=a["feat"], nodes_modes=t(a["mode"], np.uint8), nodes_splits=t(a["split"]),
                 nodes_truenodeids=a["tid"], nodes_falsenodeids=a["fid"], nodes_trueleafs=a["tleaf"],
                 nodes_falseleafs=a["fleaf"], nodes_missing_value_tracks_true=a["miss"], leaf_targetids=a["lt"],
                 leaf_weights=t(a["lw"]), tree_roots=roots, n_targets=n_targets, **attrs)
    if a["mem"]:
        attrs["membership_values"] = t(a["mem"])
    x = RNG.integers(0, 5, (7, n_feat)).astype(dtype)
    x[RNG.random(x.shape) < 0.15] = np.nan
    return case("TreeEnsemble", [x], attrs, domain=ML, id=f"TreeEnsemble-{attrs.get('aggregate_function')}-"
                f"{attrs.get('post_transform')}-{np.dtype(dtype).name}")


def _tree_regressor(n_trees=3, depth=3, n_feat=3, n_targets=2, agg="SUM", post="NONE", base=None, xdtype=np.float32):
    """Random trees in TreeEnsembleRegressor's (tree id, node id) encoding; a leaf may feed several targets."""
    a = {k: [] for k in ("tree", "node", "feat", "mode", "value", "tid", "fid", "miss",
                         "ttree", "tnode", "tgt", "tw")}
    for tree in range(n_trees):
        count = [0]

        def build(d, tree=tree, count=count):
            k, nid = len(a["tree"]), count[0]
            count[0] += 1
            leaf = d == 0 or (d < depth and RNG.random() < 0.25)
            a["tree"].append(tree)
            a["node"].append(nid)
            a["feat"].append(int(RNG.integers(0, n_feat)))
            a["mode"].append("LEAF" if leaf else str(RNG.choice(["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE",
                                                                 "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"])))
            a["value"].append(float(RNG.integers(0, 4)) + 0.5 * (RNG.random() < 0.5))
            a["miss"].append(int(RNG.random() < 0.5))
            a["tid"].append(0)
            a["fid"].append(0)
            if leaf:
                for tg in RNG.choice(n_targets, int(RNG.integers(1, n_targets + 1)), replace=False):
                    a["ttree"].append(tree)
                    a["tnode"].append(nid)
                    a["tgt"].append(int(tg))
                    a["tw"].append(float(RNG.standard_normal()))
            else:
                a["tid"][k], a["fid"][k] = build(d - 1), build(d - 1)
            return nid

        build(depth)
    attrs = dict(nodes_treeids=a["tree"], nodes_nodeids=a["node"], nodes_featureids=a["feat"],
                 nodes_modes=a["mode"], nodes_values=a["value"], nodes_truenodeids=a["tid"],
                 nodes_falsenodeids=a["fid"], nodes_missing_value_tracks_true=a["miss"], target_treeids=a["ttree"],
                 target_nodeids=a["tnode"], target_ids=a["tgt"], target_weights=a["tw"], n_targets=n_targets,
                 aggregate_function=agg, post_transform=post)
    if base is not None:
        attrs["base_values"] = base
    x = RNG.integers(0, 5, (6, n_feat)).astype(xdtype)
    if np.dtype(xdtype).kind == "f":
        x[RNG.random(x.shape) < 0.15] = np.nan
    return case("TreeEnsembleRegressor", [x], attrs, domain=ML, opset=3, id=f"TreeRegressor-{agg}-{post}")


def _t(v, dt):
    return numpy_helper.from_array(np.asarray(v, dt))


_XI = RNG.integers(-3, 4, (4, 5)).astype(np.int64)
ML_CASES = [
    case("Binarizer", [rand((3, 4))], {"threshold": 0.1}, domain=ML),
    case("Binarizer", [_XI], {"threshold": 0.5}, domain=ML, id="Binarizer-int"),
    case("Binarizer", [rand((5,), np.float64)], domain=ML, id="Binarizer-f64"),
    case("ArrayFeatureExtractor", [rand((3, 4)), np.array([3, 0, 3], np.int64)], domain=ML),
    case("ArrayFeatureExtractor", [rand((2, 3, 5)), np.array([[4], [1]], np.int64)], domain=ML, id="AFE-3d"),
    case("ArrayFeatureExtractor", [_XI[0], np.array([2], np.int64)], domain=ML, id="AFE-1d"),
    case("LabelEncoder", [_XI], {"keys_int64s": [3, -2, 0, 3], "values_floats": [1.5, -2.0, 7.0, 9.0],
                                 "default_float": -1.0}, domain=ML, id="LabelEncoder-int-float"),
    case("LabelEncoder", [np.array([0.5, np.nan, -0.0, 2.0, 3.0, 1.0], np.float32)],
         {"keys_floats": [1.0, np.nan, 0.0, 0.5], "values_int64s": [10, 20, 30, 40]}, domain=ML,
         id="LabelEncoder-float-int-nan"),
    case("LabelEncoder", [np.array([[1, 5], [2, 9]], np.int32)],
         {"keys_tensor": _t([5, 1, 7], np.int32), "values_tensor": _t([0.25, 0.5, 0.75], np.float64),
          "default_tensor": _t([-3.0], np.float64)}, domain=ML, opset=4, id="LabelEncoder-tensors"),
    case("LabelEncoder", [_XI], {"keys_tensor": _t([], np.int64), "values_tensor": _t([], np.int64)}, domain=ML,
         opset=4, id="LabelEncoder-no-keys"),
    _tree_ensemble(),
    _tree_ensemble(aggregate_function=0, post_transform=2, n_targets=3, depth=4),
    _tree_ensemble(aggregate_function=2, post_transform=1, n_trees=4),
    _tree_ensemble(aggregate_function=3, post_transform=3, dtype=np.float64, missing=False),
    _tree_ensemble(n_targets=1, n_trees=1, depth=3, post_transform=4, modes=(0, 6), probabilities=True),
    _tree_regressor(),
    _tree_regressor(agg="AVERAGE", post="LOGISTIC", base=[0.5, -0.5]),
    _tree_regressor(agg="MIN", post="SOFTMAX", base=[1.0], n_targets=3),
    _tree_regressor(agg="MAX", post="SOFTMAX_ZERO", xdtype=np.int64),
    _tree_regressor(agg="SUM", post="PROBIT", n_targets=1, depth=2),
    case("Scaler", [rand((3, 4))], {"offset": [0.5, -1.0, 2.0, 0.0], "scale": [2.0]}, domain=ML),
    case("Scaler", [_XI], {"offset": [1.0], "scale": [0.5, 1.0, 2.0, 3.0, -1.0]}, domain=ML, id="Scaler-int"),
    *[case("Normalizer", [x], {"norm": n}, domain=ML, id=f"Normalizer-{n}")
      for n, x in (("MAX", rand((4, 5))), ("L1", np.vstack([rand((3, 6)), np.zeros((1, 6), np.float32)])),
                   ("L2", rand((7,), np.float64)))],
    case("Imputer", [np.where(RNG.random((4, 3)) < 0.3, np.nan, rand((4, 3)))],
         {"imputed_value_floats": [1.0, 2.0, 3.0]}, domain=ML, id="Imputer-nan"),
    case("Imputer", [np.round(rand((4, 3)))], {"imputed_value_floats": [9.0], "replaced_value_float": 0.0},
         domain=ML, id="Imputer-value"),
    case("Imputer", [_XI], {"imputed_value_int64s": [7], "replaced_value_int64": 1}, domain=ML, id="Imputer-int"),
    *[case("LinearRegressor", [rand((5, 3))], {"coefficients": list(rand(6)), "intercepts": [0.5, -1.0],
                                               "targets": 2, "post_transform": post}, domain=ML,
           id=f"LinearRegressor-{post}") for post in ("NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO")],
    case("LinearRegressor", [rand((3,))], {"coefficients": [0.1, 0.2, 0.3], "post_transform": "PROBIT"},
         domain=ML, id="LinearRegressor-1d-probit", rtol=1e-4),
    # (its inputs share one type, T1: ONNX Runtime refuses a float beside an int64, and so does kiln)
    case("FeatureVectorizer", [rand((3, 2)), rand((3, 5)), rand((3, 2, 2))], {"inputdimensions": [3, 2, 4]},
         domain=ML),
    case("FeatureVectorizer", [_XI[:3], _XI[:3, :2]], {"inputdimensions": [2, 4]}, domain=ML,
         id="FeatureVectorizer-int64"),
    case("FeatureVectorizer", [rand((3, 2), np.float64), rand((3, 2, 2), np.float64)], {"inputdimensions": [3, 4]},
         domain=ML, id="FeatureVectorizer-float64"),
    case("OneHotEncoder", [_XI], {"cats_int64s": [2, -3, 0, 2, 7]}, domain=ML, opset=1, id="OneHotEncoder-int"),
    case("OneHotEncoder", [np.array([[0.5, -2.7, np.nan], [3.9, 1e30, 0.0]], np.float32)],
         {"cats_int64s": [0, 3, -2]}, domain=ML, opset=1, id="OneHotEncoder-float"),
    case("OneHotEncoder", [np.array([["a", "b\u00e9"], ["zz", ""]], dtype=object)],
         {"cats_strings": ["b\u00e9", "", "a", "q"]}, domain=ML, opset=1, id="OneHotEncoder-str"),
]


def test_ml():
    check_all(values(ML_CASES))


# ---- random: seeded draws equal the reference's; unseeded ones are fresh per call ----

RANDOM_CASES = [
    case("RandomUniform", [], {"shape": [3, 5], "seed": 3.0, "low": -2.0, "high": 5.0}),
    case("RandomUniform", [], {"shape": [7], "seed": 0.5, "dtype": 11}, id="RandomUniform-f64"),
    case("RandomUniformLike", [rand((4, 3), np.float16)], {"seed": 1.0}, id="RandomUniformLike-f16"),
    case("Bernoulli", [RNG.random((5, 6)).astype(np.float32)], {"seed": 2.0}),
    case("Bernoulli", [RNG.random((9,))], {"seed": 7.0, "dtype": 7}, id="Bernoulli-int64"),
    case("Multinomial", [rand((3, 5))], {"seed": 4.0, "sample_size": 20}),
    case("Multinomial", [rand((2, 4), np.float64)], {"seed": 5.0, "sample_size": 3, "dtype": 7},
         id="Multinomial-int64"),
]


def test_seeded_random_draws_match_the_reference():
    check_all(values(RANDOM_CASES))


def test_unseeded_random_draws_differ_per_call():
    model, _, _, _ = case("RandomUniformLike", [rand((64,))], {"low": 1.0, "high": 2.0}).values
    _, func = _lower(model, "u")
    mod = build_c(LoopModule([func]))
    draws = []
    for _ in range(2):
        out = np.zeros(64, np.float32)
        mod["u"](rand((64,)), out)
        assert ((out >= 1) & (out <= 2)).all() and len(np.unique(out)) > 60
        draws.append(out)
    assert not np.array_equal(*draws)
