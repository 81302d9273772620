"""Recurrent layers RNN, GRU and LSTM (ONNX opset 7 … 22).

The three share everything but the cell: layout (0: time-major, 1:
batch-major), directions, per-batch `sequence_lens` (steps past a sequence's
end leave the state alone and write zeros to Y; reverse runs each sequence
from its own last step; an empty sequence's final state is zero, as in ONNX
Runtime), activations with alpha/beta, clip, and initial states.
"""

from __future__ import annotations


import numpy as np

from kiln.graph.types import TensorType
from kiln.ops.registry import OPAQUE, op

_DIRS = {"forward": 1, "reverse": 1, "bidirectional": 2}
# name -> (function of (x, alpha, beta), default alpha, default beta); alpha/beta
# lists are consumed only by the activations that take them (as ONNX Runtime
# does). Defaults are the ONNX ops' (ORT uses 0 for Affine/ScaledTanh/ThresholdedRelu).
_ACTS = {
    "relu": (lambda x, a, b: np.maximum(x, 0), None, None),
    "tanh": (lambda x, a, b: np.tanh(x), None, None),
    "sigmoid": (lambda x, a, b: 1 / (1 + np.exp(-x)), None, None),
    "affine": (lambda x, a, b: a * x + b, 1.0, 0.0),
    "leakyrelu": (lambda x, a, b: np.where(x >= 0, x, a * x), 0.01, None),
    "thresholdedrelu": (lambda x, a, b: np.where(x > a, x, 0), 1.0, None),
    "scaledtanh": (lambda x, a, b: a * np.tanh(b * x), 1.0, 1.0),
    "hardsigmoid": (lambda x, a, b: np.clip(a * x + b, 0, 1), 0.2, 0.5),
    "elu": (lambda x, a, b: np.where(x >= 0, x, a * (np.exp(x) - 1)), 1.0, None),
    "softsign": (lambda x, a, b: x / (1 + np.abs(x)), None, None),
    "softplus": (lambda x, a, b: np.log1p(np.exp(x)), None, None),
}
_DEFAULT_ACTS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}
_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def _num_dirs(ctx) -> int:
    d = ctx.attr("direction", "forward")
    if d not in _DIRS:
        ctx.fail(f"direction must be one of {sorted(_DIRS)}, got {d!r}")
    return _DIRS[d]


def _infer(ctx):
    x, r = ctx.tensor(0), ctx.tensor(2)
    if x.shape is not None and len(x.shape) != 3:
        ctx.fail(f"X must be rank 3, got shape {x.shape}")
    seq, batch = (ctx.new_dim(), ctx.new_dim()) if x.shape is None else x.shape[:2]
    if ctx.attr("layout", 0):
        seq, batch = batch, seq
    hidden = ctx.attr("hidden_size", None)
    if hidden is None:
        hidden = r.shape[-1] if r.shape is not None else ctx.new_dim()
    nd = _num_dirs(ctx)
    _activations(ctx, ctx.node.op, nd)  # bad names fail at compile time
    y, h = (seq, nd, batch, hidden), (nd, batch, hidden)
    if ctx.attr("layout", 0):
        y, h = (batch, seq, nd, hidden), (batch, nd, hidden)
    n_state = 2 if ctx.node.op == "LSTM" else 1
    return [TensorType(x.dtype, s) for s in [y] + [h] * n_state][:max(ctx.num_outputs, 1)]


def _activation_specs(ctx, kind: str, nd: int):
    """Per direction, the list of activations (f, g[, h]) as (lower-case name, alpha, beta)."""
    names = ctx.attr("activations", None) or _DEFAULT_ACTS[kind] * nd
    per = len(_DEFAULT_ACTS[kind])
    if len(names) != per * nd:
        ctx.fail(f"activations: expected {per * nd} names for {nd} direction(s), "
                 f"given {len(names)}")
    alphas, betas = list(ctx.attr("activation_alpha", [])), list(ctx.attr("activation_beta", []))
    specs = []
    for name in names:
        name = name.decode() if isinstance(name, bytes) else name
        if name.lower() not in _ACTS:
            ctx.fail(f"unknown activation {name!r}; expected one of {sorted(_ACTS)}")
        _, a, b = _ACTS[name.lower()]
        a = alphas.pop(0) if a is not None and alphas else a
        b = betas.pop(0) if b is not None and betas else b
        specs.append((name.lower(), a, b))
    return [specs[i * per:(i + 1) * per] for i in range(nd)]


def _activations(ctx, kind: str, nd: int):
    """Per direction, the list of activation callables (f, g[, h])."""
    return [[lambda x, f=_ACTS[name][0], a=a, b=b: f(x, a, b) for name, a, b in d]
            for d in _activation_specs(ctx, kind, nd)]


def cell(kind: str, xw, h, c, r, rbh, p, acts, clip, lbr: bool, forget: bool):
    """One step of one direction from xw = x @ W^T + biases (all but `rbh`): the new (h, c)."""
    f = acts[0]
    g = acts[1] if len(acts) > 1 else None
    pre = (lambda v: np.clip(v, -clip, clip)) if clip is not None else (lambda v: v)
    hs = r.shape[-1]
    if kind == "RNN":
        return f(pre(xw + h @ r.T)), None
    if kind == "GRU":
        hr = h @ r.T
        z = f(pre(xw[:, :hs] + hr[:, :hs]))
        rr = f(pre(xw[:, hs:2 * hs] + hr[:, hs:2 * hs]))
        if lbr:
            hh = g(pre(xw[:, 2 * hs:] + rr * (hr[:, 2 * hs:] + rbh)))
        else:
            hh = g(pre(xw[:, 2 * hs:] + (rr * h) @ r[2 * hs:].T))
        return (1 - z) * hh + z * h, None
    gates = xw + h @ r.T
    gi, go, gf, gc = (gates[:, k * hs:(k + 1) * hs] for k in range(4))
    pi, po, pf = (p[k * hs:(k + 1) * hs] for k in range(3))
    i = f(pre(gi + pi * c))
    fg = 1 - i if forget else f(pre(gf + pf * c))
    c = fg * c + i * g(pre(gc))
    o = f(pre(go + po * c))
    return o * acts[2](c), c


def recur(kind: str, xw, r, rbh, lens, h0, c0, p, acts, clip, lbr: bool, forget: bool, direction: str):
    """The time loop, time-major: xw [steps, nd, batch, G * H] (biases as `cell` wants),
    r [nd, G * H, H], rbh [nd, H], lens [batch], h0 / c0 / out states [nd, batch, H],
    p [nd, 3 * H]; returns (y [steps, nd, batch, H], h_n, c_n). Steps past a row's length
    leave its state and write zeros; reverse runs each row from its own last step; an
    empty row's final state is zero (as ONNX Runtime)."""
    steps, nd, batch, _ = xw.shape
    hs = r.shape[-1]
    y = np.zeros((steps, nd, batch, hs), xw.dtype)
    hn, cn = np.empty_like(h0), np.empty_like(c0)
    cols = np.arange(batch)
    for d in range(nd):
        reverse = d == 1 or direction == "reverse"
        h, c = h0[d], c0[d]
        for t in range(steps):
            live = t < lens
            ti = np.where(live, lens - 1 - t if reverse else t, 0)
            h2, c2 = cell(kind, xw[ti, d, cols], h, c, r[d], rbh[d], p[d], acts[d], clip, lbr, forget)
            h = np.where(live[:, None], h2, h)
            c = c if c2 is None else np.where(live[:, None], c2, c)
            y[ti[live], d, cols[live]] = h[live]
        hn[d], cn[d] = (np.where(lens[:, None] > 0, s, 0) for s in (h, c))  # as ORT
    return y, hn, cn


def _run(kind: str):
    def run(ctx, x, w, r, b=None, lens=None, h0=None, c0=None, p=None):
        layout = ctx.attr("layout", 0)
        dtype = x.dtype
        ct = np.float64 if dtype == np.float64 else np.float32
        if layout:
            x = x.swapaxes(0, 1)
        x = x.astype(ct)
        steps, batch = x.shape[:2]
        nd, g = _num_dirs(ctx), _GATES[kind]
        hs = ctx.attr("hidden_size", r.shape[-1])
        for name, arr, want in (("W", w, (nd, g * hs, x.shape[2])), ("R", r, (nd, g * hs, hs)),
                                ("B", b, (nd, 2 * g * hs)), ("P", p, (nd, 3 * hs))):
            if arr is not None and arr.shape != want:
                ctx.fail(f"{name} must have shape {want}, got {arr.shape}")
        b = np.zeros((nd, 2 * g * hs), ct) if b is None else b.astype(ct)
        p = np.zeros((nd, 3 * hs), ct) if p is None else p.astype(ct)
        lens = np.full(batch, steps, np.int64) if lens is None else lens.astype(np.int64)
        if layout:
            h0, c0 = (None if s is None else s.swapaxes(0, 1) for s in (h0, c0))
        h0, c0 = (np.zeros((nd, batch, hs), ct) if s is None else s.astype(ct) for s in (h0, c0))
        # the input's share of every step and the biases (all but GRU's reset-gated one), as
        # kiln::Recurrent receives them from its GEMM (kiln.passes.recurrent)
        lbr = kind == "GRU" and bool(ctx.attr("linear_before_reset", 0))
        wb, rb = b[:, :g * hs], b[:, g * hs:].copy()
        rbh = rb[:, 2 * hs:].copy() if lbr else np.zeros((nd, hs), ct)
        if lbr:
            rb[:, 2 * hs:] = 0
        xw = np.stack([x @ w[d].astype(ct).T + wb[d] + rb[d] for d in range(nd)], axis=1)
        y, hn, cn = recur(kind, xw, r.astype(ct), rbh, lens, h0, c0, p, _activations(ctx, kind, nd),
                          ctx.attr("clip", None), lbr, bool(ctx.attr("input_forget", 0)),
                          ctx.attr("direction", "forward"))
        outs = [y, hn, cn][:3 if kind == "LSTM" else 2]
        if layout:
            outs = [y.transpose(2, 0, 1, 3)] + [s.swapaxes(0, 1) for s in outs[1:]]
        return tuple(o.astype(dtype) for o in outs)
    return run


for _kind in _GATES:
    op(_kind, infer=_infer, fusion=OPAQUE)(_run(_kind))
