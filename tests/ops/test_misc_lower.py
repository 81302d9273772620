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
                scale = max(1.0, float(np.abs(w.astype(np.float64)).max(initial=0)))
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
    case("STFT", [rand((2, 32, 1)), C(4), rand((8,))], id="STFT-window", **SIG),
    case("STFT", [rand((1, 30, 2)), C(5), None, C(9)], {"onesided": 0}, id="STFT-complex-two-sided", **SIG),
    case("STFT", [rand((3, 20, 1), np.float64), C(3), rand((6,), np.float64), C(6)], id="STFT-f64", **SIG),
    case("STFT", [rand((1, 12, 1)), C(12)], id="STFT-one-frame", **SIG),
    *[case(w, [C(n)], {"periodic": p, "output_datatype": dt}, id=f"{w}-{n}-{p}-{dt}")
      for w, n, p, dt in (("HannWindow", 10, 1, 1), ("HannWindow", 7, 0, 11), ("HammingWindow", 16, 1, 11),
                          ("HammingWindow", 1, 0, 1), ("BlackmanWindow", 9, 0, 1), ("BlackmanWindow", 0, 1, 1),
                          ("BlackmanWindow", 33, 1, 10))],
    case("MelWeightMatrix", [C(8), C(64), np.array(8000, np.int32), np.array(0.0, np.float32),
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
