"""What the torch op tests share: a one-function module, random inputs, and the comparison
of kiln's outputs with eager torch's (same structure, dtype and shape; values within 1e-5)."""

from __future__ import annotations

import torch


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def rnd(*shape, dtype=torch.float32, lo=-2.0, hi=2.0):
    if dtype.is_floating_point:
        return (torch.rand(shape) * (hi - lo) + lo).to(dtype)
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    return torch.randint(int(lo) - 3, int(hi) + 4, shape).to(dtype)


def pos(*shape):
    return torch.rand(shape) + 0.1


def assert_same(got, want, rtol=1e-5, atol=1e-5):
    want_l, got_l = torch.utils._pytree.tree_leaves(want), torch.utils._pytree.tree_leaves(got)
    assert len(want_l) == len(got_l)
    for w, g in zip(want_l, got_l):
        assert g.dtype == w.dtype, (g.dtype, w.dtype)
        assert g.shape == w.shape, (g.shape, w.shape)
        if w.dtype.is_floating_point:
            torch.testing.assert_close(g, w, rtol=rtol, atol=atol, equal_nan=True)
        else:
            assert torch.equal(g, w)
