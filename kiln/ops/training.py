"""Optimizer update rules of the `ai.onnx.preview.training` domain: Adagrad, Adam, Momentum.

Each op takes a learning rate R, a step count T, then n tensors to optimize,
their n gradients and n tensors per optimizer state; it returns the n updated
tensors followed by the updated states, group by group. The math runs in
float64 and each result is cast back to its input's dtype. Their native lowerings
live in kiln.lower.training.
"""

from __future__ import annotations

import numpy as np

from kiln.graph.types import TensorType
from kiln.ops.registry import OPAQUE, op


TRAINING = "ai.onnx.preview.training"


def _groups(ctx, n_state: int) -> int:
    """How many tensors are optimized, checking the inputs split into X, G and the states."""
    per = ctx.num_inputs - 2
    if per <= 0 or per % (2 + n_state):
        ctx.fail(f"expected R, T and {2 + n_state} equal groups of tensors (X, G, states), "
                 f"got {ctx.num_inputs} inputs")
    return per // (2 + n_state)


def _optimizer_infer(n_state: int):
    def infer(ctx):
        n = _groups(ctx, n_state)
        for i, what in ((0, "R"), (1, "T")):
            if ctx.tensor(i).rank not in (None, 0):
                ctx.fail(f"{what} must be a scalar, got {ctx.tensor(i)}")
        # output group 0 mirrors the X inputs (group 0); output group k>0 the state group k+1
        types = [ctx.tensor(2 + (g if g == 0 else g + 1) * n + i)
                 for g in range(1 + n_state) for i in range(n)]
        for i in range(n):
            x, grad = ctx.tensor(2 + i), ctx.tensor(2 + n + i)
            if x.shape is not None and grad.shape is not None and len(x.shape) != len(grad.shape):
                ctx.fail(f"X{i + 1} {x} and its gradient {grad} differ in rank")
        return [TensorType(t.dtype, t.shape) for t in types]
    return infer


def _optimizer(name: str, states: int, update):
    """Register `update(ctx, r, t, x, g, *state) -> (x_new, *state_new)` as a variadic op."""
    @op(name, infer=_optimizer_infer(states), domain=TRAINING, fusion=OPAQUE)
    def run(ctx, r, t, *tensors):
        n = _groups(ctx, states)
        groups = [tensors[k * n:(k + 1) * n] for k in range(2 + states)]
        r, t = float(np.ravel(r)[0]), int(np.ravel(t)[0])
        results = [update(ctx, r, t, *(np.asarray(g[i], np.float64) for g in groups)) for i in range(n)]
        # results[i] is (x_new, *states_new) of tensor i; outputs go group by group
        like = [groups[0]] + groups[2:]
        return tuple(np.asarray(res[k], dtype=like[k][i].dtype)
                     for k in range(1 + states) for i, res in enumerate(results))
    return run


def _regularized(ctx, x, g):
    return ctx.attr("norm_coefficient", 0.0) * x + g


def _adagrad(ctx, r, t, x, g, h):
    rate = r / (1 + t * ctx.attr("decay_factor", 0.0))
    g = _regularized(ctx, x, g)
    h = h + g * g
    return x - rate * g / (np.sqrt(h) + ctx.attr("epsilon", 0.0)), h


def _adam(ctx, r, t, x, g, v, h):
    alpha, beta = ctx.attr("alpha", 0.9), ctx.attr("beta", 0.999)
    g = _regularized(ctx, x, g)
    v = alpha * v + (1 - alpha) * g
    h = beta * h + (1 - beta) * g * g
    if t > 0:  # bias correction of both moments
        r = r * np.sqrt(1 - beta ** t) / (1 - alpha ** t)
    x = x - r * v / (np.sqrt(h) + ctx.attr("epsilon", 1e-6))
    return (1 - ctx.attr("norm_coefficient_post", 0.0)) * x, v, h


def _momentum_attrs(ctx):
    mode = ctx.attr("mode")
    if mode not in ("standard", "nesterov"):
        ctx.fail(f"mode must be 'standard' or 'nesterov', got {mode!r}")
    return mode, ctx.attr("alpha"), ctx.attr("beta")


def _momentum(ctx, r, t, x, g, v):
    mode, alpha, beta = _momentum_attrs(ctx)
    g = _regularized(ctx, x, g)
    v = alpha * v + (beta if t > 0 else 1) * g
    return x - r * (v if mode == "standard" else g + alpha * v), v


_optimizer("Adagrad", 1, _adagrad)
_optimizer("Adam", 2, _adam)
_optimizer("Momentum", 1, _momentum)
