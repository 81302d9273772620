"""Native lowerings of the optimizer updates (kiln.ops.training): elementwise computes in
float64, cast back per output.
"""

from __future__ import annotations

import kiln.loops as L

from kiln.dtypes import DType
from kiln.lower.context import lowering
from kiln.ops.training import TRAINING, _groups, _momentum_attrs


# ---- native lowerings: elementwise computes in float64, cast back per output ----

def _lower_optimizer(states: int, update):
    """`update(ctx, r, t, x, g, *state)` over loop expressions (float64) -> (x_new, *state_new)."""
    def lower(ctx, r, t, *tensors):
        from kiln.lower.elementwise import _at
        n = _groups(ctx, states)
        for k, tt in enumerate(ctx.input_types):
            if tt.dtype.c is None or (k >= 2 and not tt.dtype.is_float):
                ctx.fail(f"input {k} of type {tt.dtype} has no native kernel", stage="lower")
        groups = [tensors[k * n:(k + 1) * n] for k in range(2 + states)]
        f64 = DType.float64
        scalar = lambda v: v[tuple(0 for _ in v.shape)]  # noqa: E731 - R and T hold one value
        rr, tt = L.cast(f64, scalar(r)), scalar(t)
        outs = []
        for k in range(1 + states):
            for i in range(n):
                like = groups[0][i] if k == 0 else groups[k + 1][i]
                shape = ctx.out_shape(k * n + i)

                def value(*idx, k=k, i=i, like=like):
                    args = [L.cast(f64, _at(g[i], idx)) for g in groups]
                    return L.cast(like.dtype, update(ctx, rr, tt, *args)[k])
                outs.append(L.compute(shape, value, f"{ctx.node.op.lower()}{k}_{i}"))
        return outs
    return lower


def _c(v) -> L.Expr:
    return L.const(float(v), DType.float64)


def _regularized_e(ctx, x, g):
    return _c(ctx.attr("norm_coefficient", 0.0)) * x + g


def _adagrad_e(ctx, r, t, x, g, h):
    rate = r / (_c(1) + L.cast(DType.float64, t) * _c(ctx.attr("decay_factor", 0.0)))
    g = _regularized_e(ctx, x, g)
    h = h + g * g
    return x - rate * g / (L.sqrt(h) + _c(ctx.attr("epsilon", 0.0))), h


def _adam_e(ctx, r, t, x, g, v, h):
    alpha, beta = ctx.attr("alpha", 0.9), ctx.attr("beta", 0.999)
    g = _regularized_e(ctx, x, g)
    v = _c(alpha) * v + _c(1 - alpha) * g
    h = _c(beta) * h + _c(1 - beta) * g * g
    tf = L.cast(DType.float64, t)
    r = L.select(t > L.const(0, t.dtype),
                 r * L.sqrt(_c(1) - L.pow_(_c(beta), tf)) / (_c(1) - L.pow_(_c(alpha), tf)), r)
    x = x - r * v / (L.sqrt(h) + _c(ctx.attr("epsilon", 1e-6)))
    return _c(1 - ctx.attr("norm_coefficient_post", 0.0)) * x, v, h


def _momentum_e(ctx, r, t, x, g, v):
    mode, alpha, beta = _momentum_attrs(ctx)
    g = _regularized_e(ctx, x, g)
    v = _c(alpha) * v + L.select(t > L.const(0, t.dtype), _c(beta), _c(1)) * g
    return x - r * (v if mode == "standard" else g + _c(alpha) * v), v


for _name, _states, _update in (("Adagrad", 1, _adagrad_e), ("Adam", 2, _adam_e), ("Momentum", 1, _momentum_e)):
    lowering(_name, domain=TRAINING)(_lower_optimizer(_states, _update))
