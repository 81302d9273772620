"""ToNCHWc into one block of a few channels (channels-last, a stem conv's input: kiln.passes.layout
`narrow_input`), with the conv's zero padding made on the way (ToNCHWc's `pads`): a hand-written
kernel (Target-derived vector width) where the loop IR's schedule stores one element at a time.

Each output row interleaves C input rows (one per channel plane): per L pixels (L = the target's
float32 vector lanes) the C vectors loaded from the planes become C vectors of the row (lane j
of output vector k holds channel f % C of pixel f // C, f = k * L + j) through C - 1 two-vector
shuffles each (constant indices: one vpermt2ps each on AVX-512), then the row's pixels past the
last whole vector one by one; the pad columns and rows are stored as zeros. Rows are parallel
tasks (kiln_par_for) where the copy is worth threads.

Why: the scheduled copy (reads contiguous from the planes, writes strided by C) compiles to a
scalar load and store per element, and the stem conv then made a padded copy of its own.
Measured one thread (corpus_cpu --profile, thread CPU time, Sapphire Rapids, load ~5.5, two
rounds), MobileNetV3-Small's 3x224x224 input and its 3x3 stride-2 stem: conversion 0.124 / 0.100
ms -> 0.093 / 0.068, stem conv 0.206 / 0.227 -> 0.140 / 0.150 (its padded copy gone).
"""

from __future__ import annotations

import math

from kiln.codegen.csource import c_par_job
from kiln.loops.symbols import c_size, symbols_in
from kiln.lower.nnutil import parallel_from


def interleave_indices(c: int, lanes: int) -> list[list[tuple[int, list[int]]]]:
    """Per output vector k: the shuffles building it, [(plane q, indices)]: the first takes
    planes 0 and 1 (q = 1; index i < lanes reads plane 0's lane i, lanes + i plane 1's), each
    later one the vector so far and plane q (lanes + i: plane q's lane i, i < lanes: keep lane i).
    Output lane j of vector k is channel f % c of pixel f // c, f = k * lanes + j."""
    plans = []
    for k in range(c):
        src = [((k * lanes + j) % c, (k * lanes + j) // c) for j in range(lanes)]
        steps = [(1, [p if q == 0 else lanes + p if q == 1 else 0 for q, p in src])]
        for q in range(2, c):
            steps.append((q, [lanes + p if sq == q else j for j, (sq, p) in enumerate(src)]))
        plans.append(steps)
    return plans


def interleave_reference(planes: list[list[float]], lanes: int) -> list[float]:
    """What the shuffles of interleave_indices make of `planes` (c lists of `lanes` values),
    applied in Python: the c output vectors concatenated (for tests)."""
    c = len(planes)
    out = []
    for steps in interleave_indices(c, lanes):
        acc = None
        for q, idx in steps:
            a = planes[0] if acc is None else acc
            b = planes[q]
            acc = [a[i] if i < lanes else b[i - lanes] for i in idx]
        out.extend(acc if acc is not None else planes[0])
    return out


def narrow_to_blocked(ctx, x, pads: list[int], lanes: int):
    """The extern kernel of ToNCHWc: x N,C,H,W float32 -> N,1,H+pt+pb,W+pl+pr,C (block = C)."""
    n, c, h, w = x.shape
    pt, pl, pb, pr = pads
    ho, wo = h + pt + pb, w + pl + pr
    vec = lanes if lanes >= 2 and c >= 2 else 0
    t = f"kiln_nv{vec}"      # the vector type and its unaligned load and store
    loads = "".join(f"      const {t} p{q} = {t}_ld(s{q} + col);\n" for q in range(c))
    stores = []
    for k, steps in enumerate(interleave_indices(c, vec) if vec else []):
        expr = "p0"
        for q, idx in steps:
            expr = f"__builtin_shufflevector({expr}, p{q}, {', '.join(map(str, idx))})"
        stores.append(f"      {t}_st(d + col * {c} + {k * vec}, {expr});\n")
    planes = "".join(f"    const float* s{q} = in0 + ((img * {c} + {q}) * {h} + ih) * {w};\n" for q in range(c))
    tail = "".join(f"      d[col * {c} + {q}] = s{q}[col];\n" for q in range(c))
    loop = (f"    const int64_t img = row / {ho}, ih = row % {ho} - {pt};\n"
            f"    float* dst = out0 + row * {wo * c};\n"
            f"    if (ih < 0 || ih >= {h}) {{ __builtin_memset(dst, 0, {wo * c * 4}); continue; }}\n"
            + (f"    __builtin_memset(dst, 0, {pl * c * 4});\n" if pl else "")
            + (f"    __builtin_memset(dst + {(pl + w) * c}, 0, {pr * c * 4});\n" if pr else "")
            + f"    float* d = dst + {pl * c};\n{planes}    int64_t col = 0;\n"
            + (f"    for (; col + {vec} <= {w}; col += {vec}) {{\n{loads}{''.join(stores)}    }}\n" if vec else "")
            + f"    for (; col < {w}; ++col) {{\n{tail}    }}\n")
    rows = n * ho
    captures = [("const float*", "in0"), ("float*", "out0"),
                *(("int64_t", v.arg.name) for v in symbols_in([n]))]
    par = parallel_from(n, lambda k: k * c * h * w, ctx.target, "window")
    pre, call = c_par_job("to_narrow", "row", c_size(rows), loop, captures, par)
    typedef = ("" if not vec else
               f"#ifndef KILN_NV_{vec}\n#define KILN_NV_{vec}\n"
               f"typedef float {t} __attribute__((vector_size({vec * 4})));\n"
               f"static inline {t} {t}_ld(const float* p) {{ {t} v; __builtin_memcpy(&v, p, sizeof v); return v; }}\n"
               f"static inline void {t}_st(float* p, {t} v) {{ __builtin_memcpy(p, &v, sizeof v); }}\n"
               "#endif\n")
    return ctx.extern(call + "  return 0;\n", [x], [(ctx.out_shape(0), ctx.out_dtype(0))], preamble=typedef + pre)


def fits(x, block: int, dtype_ok: bool) -> bool:
    """Whether narrow_to_blocked takes this ToNCHWc: a 2-D float32 input of `block` channels
    (one block, no padding channels) with static channels and spatial dims."""
    s = x.shape
    return dtype_ok and len(s) == 4 and s[1] == block and all(isinstance(d, int) for d in s[1:]) \
        and math.prod(s[1:]) > 0
