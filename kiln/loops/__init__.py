"""kiln's loop level: expressions, compute definitions, schedules, lowering to loops.

An operator's lowering says *what* is computed; a schedule says *how*. Reading a
matmul from definition to native code (Halide-tutorial style)::

    from kiln.dtypes import DType
    from kiln.loops import placeholder, compute, reduce_axis, sum_, Schedule, lower, LoopModule
    from kiln.codegen import build_c

    M = N = K = 256
    A = placeholder((M, K), DType.float32, "A")
    B = placeholder((K, N), DType.float32, "B")
    k = reduce_axis(K, "k")
    C = compute((M, N), lambda i, j: sum_(A[i, k] * B[k, j], axis=k), "C")

    s = Schedule(C)                                 # default: row-major loops, k innermost
    io, jo, ii, ji = s[C].tile(C.axis[0], C.axis[1], 32, 32)
    ko, ki = s[C].split(k, 4)
    s[C].reorder(io, jo, ko, ii, ki, ji)            # ji innermost and contiguous in B and C
    s[C].vectorize(ji)                              # -> #pragma omp simd
    s[C].parallel(io)                               # -> #pragma omp parallel for
    func = lower(s, [A, B, C], name="matmul")
    print(func)                                     # C-like pseudocode of the loop nest
    lib = build_c(LoopModule([func]))               # cc -O3 -march=native -fopenmp, cached
    lib["matmul"](a, b, c)                          # numpy arrays, checked against the params

`s.trace` records every primitive call; `s.trace.replay(new_C)` rebuilds the same
schedule for a freshly built compute (how templated and tuned schedules are stored).
Other primitives: fuse, unroll, compute_at (compute a producer inside a consumer's
loop, just the region it needs), compute_inline, cache_read / cache_write (copy into
a local buffer; with compute_at this gives packing and register blocking).

`str(func)` is C-like pseudocode that parses back (`parse_func`, `parse_module`,
`parse_stmt`, `parse_expr` in kiln.loops.parse) to IR `structural_equal` to the
original: tests write the loop nest a schedule should give as text.
"""

# the printer first: importing it registers how loop IR prints (kiln.loops.expr.register_printer)
from kiln.loops import printer  # noqa: F401
from kiln.loops.compute import ComputeOp, Tensor, compute, placeholder, reduce_axis
from kiln.loops.expr import (INDEX, Expr, abs_, acos, acosh, as_expr, asin, asinh, atan, atanh, call, cast,
                             check,
                             ceil, const, cos, cosh, erf, erfc, exp, fabs, floor, fmod, isinf, isnan, load, log,
                             logical_not, max_, min_, pow_, prod_, reduce, rmax, rmin, round_, rsqrt, select,
                             sigmoid, sign, sin, sinh, sqrt, substitute, sum_, tan, tanh, truncdiv, truncmod,
                             var)
from kiln.loops.lower import lower
from kiln.loops.parse import parse_expr, parse_func, parse_module, parse_stmt
from kiln.loops.schedule import Inst, Schedule, Stage, Trace
from kiln.loops.simplify import Ctx, prove, simplify, simplify_stmt
from kiln.loops.stmt import (Allocate, Buffer, Call, Evaluate, For, IfThenElse, Let, LoopModule, PrimFunc, Seq,
                             Stmt, Store, View, seq)
from kiln.loops.structural import assert_structural_equal, structural_equal

__all__ = [n for n in dir() if not n.startswith("_")]
