"""kiln::Recurrent: the time loop of an RNN, GRU or LSTM whose input projection is done.

ONNX's recurrent ops multiply every step's input by W inside the loop. kiln's
`decompose_recurrent` pass (kiln.passes.recurrent) takes that product out as one
GEMM over all steps and directions (MatMul + Add, which pack_weights and fusion
make one packed GEMM with a bias epilogue) and leaves this op the part that is
truly sequential:

    Recurrent(xw, rp, rbh?, sequence_lens?, initial_h?, initial_c?, P?)
        {kind, hidden_size, direction, layout, activations, activation_alpha,
         activation_beta, clip, linear_before_reset, input_forget}
        -> Y, Y_h[, Y_c]   (exactly the ONNX op's outputs, in its layout)

- xw: x @ W^T + Wb + Rb for every step, [steps, batch, nd * G * H] (layout 0) or
  [batch, steps, nd * G * H] (layout 1); direction d's G gates at [d * G * H, ...)
  in ONNX's gate order. Every recurrent bias is folded in except GRU's with
  linear_before_reset, whose h-gate bias sits inside r * (h @ Rh^T + Rbh): that one
  is `rbh` [nd, H].
- rp: R packed as the native step reads it (`pack_r`): [nd, P, H, G, U], panel p
  holding hidden units [p * U, p * U + U) of every gate, one row of G * U floats per
  recurrent input q, so a step streams each panel once and ends it with the gate
  nonlinearities of those U units in registers. Units past H are zero.
- the other inputs, attributes and outputs are the ONNX op's (kiln.ops.rnn).
"""

from __future__ import annotations

import numpy as np

from kiln.graph.types import TensorType
from kiln.ops.registry import OPAQUE, op
from kiln.ops.rnn import _GATES as GATES, _activation_specs, _activations, _num_dirs, recur

DOMAIN = "kiln"


def pack_r(r: np.ndarray, gates: int, lanes: int) -> np.ndarray:
    """R [nd, G * H, H] -> panels [nd, P, H, G, lanes] (P = ceil(H / lanes), zero padded)."""
    nd, gh, hs = r.shape
    p = -(-hs // lanes)
    rr = np.zeros((nd, gates, p * lanes, hs), r.dtype)
    rr[:, :, :hs] = r.reshape(nd, gates, hs, hs)
    return np.ascontiguousarray(rr.reshape(nd, gates, p, lanes, hs).transpose(0, 2, 4, 1, 3))


def unpack_r(rp: np.ndarray) -> np.ndarray:
    """The R [nd, G * H, H] that `pack_r` packed."""
    nd, p, hs, g, lanes = rp.shape
    return rp.transpose(0, 3, 1, 4, 2).reshape(nd, g, p * lanes, hs)[:, :, :hs].reshape(nd, g * hs, hs)


def _kind(ctx) -> str:
    kind = ctx.attr("kind", None)
    kind = kind.decode() if isinstance(kind, bytes) else kind
    if kind not in GATES:
        ctx.fail(f"kind must be one of {sorted(GATES)}, got {kind!r}")
    return kind


def _infer(ctx):
    kind, xw, rp = _kind(ctx), ctx.tensor(0), ctx.tensor(1)
    nd, g, hs, layout = _num_dirs(ctx), GATES[kind], int(ctx.attr("hidden_size")), int(ctx.attr("layout", 0))
    _activation_specs(ctx, kind, nd)
    if xw.shape is not None and (len(xw.shape) != 3 or (isinstance(xw.shape[2], int) and xw.shape[2] != nd * g * hs)):
        ctx.fail(f"xw must be [steps, batch, {nd * g * hs}] (or batch-major), got shape {xw.shape}")
    if rp.shape is not None and (len(rp.shape) != 5 or tuple(rp.shape[:1]) + tuple(rp.shape[2:4]) != (nd, hs, g)):
        ctx.fail(f"rp must be packed [{nd}, P, {hs}, {g}, lanes], got shape {rp.shape}")
    seq, batch = (ctx.new_dim(), ctx.new_dim()) if xw.shape is None else xw.shape[:2]
    if layout:
        seq, batch = batch, seq
    y, h = (seq, nd, batch, hs), (nd, batch, hs)
    if layout:
        y, h = (batch, seq, nd, hs), (batch, nd, hs)
    n_state = 2 if kind == "LSTM" else 1
    return [TensorType(xw.dtype, s) for s in [y] + [h] * n_state][:max(ctx.num_outputs, 1)]


@op("Recurrent", infer=_infer, domain=DOMAIN, fusion=OPAQUE)
def recurrent(ctx, xw, rp, rbh=None, lens=None, h0=None, c0=None, p=None):
    """The ONNX op's semantics on the projected input (kiln.ops.rnn's reference cell)."""
    kind, layout, dtype = _kind(ctx), int(ctx.attr("layout", 0)), xw.dtype
    nd, g, hs = _num_dirs(ctx), GATES[kind], int(ctx.attr("hidden_size"))
    xw = (xw.swapaxes(0, 1) if layout else xw).astype(np.float32)
    steps, batch = xw.shape[:2]
    xw = xw.reshape(steps, batch, nd, g * hs).transpose(0, 2, 1, 3)
    r = unpack_r(rp).astype(np.float32)
    rbh = np.zeros((nd, hs), np.float32) if rbh is None else rbh.astype(np.float32)
    p = np.zeros((nd, 3 * hs), np.float32) if p is None else p.astype(np.float32)
    lens = np.full(batch, steps, np.int64) if lens is None else lens.astype(np.int64)
    if layout:
        h0, c0 = (None if s is None else s.swapaxes(0, 1) for s in (h0, c0))
    h0, c0 = (np.zeros((nd, batch, hs), np.float32) if s is None else s.astype(np.float32) for s in (h0, c0))
    y, hn, cn = recur(kind, xw, r, rbh, lens, h0, c0, p, _activations(ctx, kind, nd), ctx.attr("clip", None),
                      bool(ctx.attr("linear_before_reset", 0)), bool(ctx.attr("input_forget", 0)),
                      ctx.attr("direction", "forward"))
    outs = [y, hn, cn][:3 if kind == "LSTM" else 2]
    if layout:
        outs = [y.transpose(2, 0, 1, 3)] + [s.swapaxes(0, 1) for s in outs[1:]]
    return tuple(o.astype(dtype) for o in outs)
