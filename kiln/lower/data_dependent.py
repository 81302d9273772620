"""Native lowerings of ops whose output sizes depend on input data.

Each is a hand-written C kernel (`LowerCtx.extern(..., dynamic=True)`): it
writes its outputs compactly into capacity-sized buffers and reports their
actual dims; the cpu target then runs the rest of the graph specialised to
those sizes (kiln.targets.cpu.Staged). Their semantics (infer/run) live with
their families; only the lowerings are here, because they share this protocol.
"""

from __future__ import annotations

import math

from kiln.dtypes import DType
from kiln.lower.context import LowerCtx, lowering


@lowering("NonZero")
def lower_nonzero(ctx: LowerCtx, x):
    """Indices of non-zero elements, [rank, n] int64, in row-major order (numpy.nonzero)."""
    shape = tuple(ctx.input_types[0].shape)
    rank, size = len(shape), math.prod(shape)
    strides = [math.prod(shape[d + 1:]) for d in range(rank)]
    body = [f"  int64_t n = 0;",
            f"  for (int64_t i = 0; i < {size}; ++i) if (in0[i]) ++n;",
            "  int64_t j = 0;",
            f"  for (int64_t i = 0; i < {size}; ++i) {{",
            "    if (!in0[i]) continue;"]
    for d in range(rank):
        body.append(f"    out0[{d} * n + j] = (i / {strides[d]}) % {shape[d]};")
    body += ["    ++j;", "  }"]
    if ctx.dynamic():
        body += ["  out1[0] = " + str(rank) + ";", "  out1[1] = n;"]
    body.append("  return 0;")
    cap = (rank, max(size, 1)) if ctx.dynamic() else tuple(ctx.out_shape(0))
    return ctx.extern("\n".join(body), [x], [(cap, DType.int64)], dynamic=ctx.dynamic())
