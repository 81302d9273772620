"""What the ATen handlers (kiln.frontends.torch_ops) share: the table they register into
(`reg`), and the helpers for axes and torch's type promotion.
"""

from __future__ import annotations

import torch

from kiln.dtypes import DType


aten = torch.ops.aten
TABLE: dict = {}
INT64_MAX = (1 << 63) - 1


def reg(*targets):
    def deco(fn):
        for t in targets:
            TABLE[t] = fn
        return fn
    return deco


def _axis(dim: int, rank: int) -> int:
    return dim + rank if dim < 0 else dim


def _meta(a):
    """An argument as torch.result_type sees it: a fake tensor's metadata, or a python number."""
    if isinstance(a, torch.fx.Node):
        v = a.meta.get("val")
        return v if isinstance(v, torch.Tensor) else 1
    return a


def _promoted(n) -> DType:
    """The dtype torch computes a binary op in (for comparisons, not their bool result)."""
    a, b = (_meta(x) for x in n.args[:2])
    if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
        return DType.int64 if all(isinstance(x, int) for x in (a, b)) else DType.float32
    from kiln.frontends.torch_fx import kiln_dtype
    return kiln_dtype(torch.result_type(a, b))
