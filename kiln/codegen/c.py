"""LoopModule -> C11 (GNU dialect) source with OpenMP pragmas.

Every identifier in the output is generated here (prefix + sanitized name + number),
and no user string reaches a comment or literal, so a model cannot inject code.
Each PrimFunc `f` becomes `int32_t kiln_f(T* restrict ...)` returning 0, -1 when
a heap allocation failed, k+1 when its k-th run-time `check` failed (PrimFunc.errors
says what each means; the bad value is left for `kiln_error_value`), or, for a
function of `Call`s (the entry), `-KILN_CALL_STATUS(k, s)` when its k-th call
(0-based) failed first with status s; calls after a failed one do not run.
`kiln_` is the default symbol prefix: `with_prefix` renames a module's functions
(an artifact's `resnet18_main`, `resnet18_k0_Conv`, ...) so several modules link into
one program. Loads/stores index flat row-major arrays; floor
division/modulo become plain `/` `%` when the simplifier proves operands non-negative.

Dtypes C has no type for (bfloat16, float8*, float4e2m1, int4/uint4/int2/uint2) are
storage types (`NARROW`): their bytes are what NumPy/ml_dtypes stores, a load converts
to the compute type (float32, int32), a store converts back, and every operation whose
result has such a dtype rounds (wraps) its float32/int32 result to a representable value,
so each op behaves as computing in float32 and casting back (as the reference does).
A cast to one may carry a conversion mode in `Expr.arg` (the store helper's suffix:
"sat" for float8's saturate=1, "up"/"down"/"nearest" with an optional "_sat" for
float8e8m0's round_mode); see kiln.codegen.narrow for the helpers' C.
"""

from __future__ import annotations

import contextlib
import math
import re
from dataclasses import dataclass

import numpy as np

from kiln.codegen.address import Tile
from kiln.codegen.csource import SHARED_BEGIN, SHARED_END, c_source, threads_impl_of
from kiln.codegen.cvector import PERMUTE, _NotVector, _coefficient, _flat, permuted_lanes
from kiln.codegen.compile_cost import compile_cost  # noqa: F401 (kiln.codegen.c.compile_cost)
from kiln.codegen.narrow import CATALOG, helper_source
from kiln.codegen.outline import outline
from kiln.codegen.prelude import FUNCTIONS, PRELUDE, UNIT_PRELUDE, UNIT_START  # noqa: F401 (c.PRELUDE)
from kiln.codegen.scalar import helper_text, opaque_text
from kiln.dtypes import DType
from kiln.errors import KilnError
from kiln.loops import stmt as S
from kiln.loops.expr import Expr, const, free_vars, substitute
from kiln.loops.simplify import Ctx
from kiln.loops.symbols import SERIAL_WORK

STACK_LIMIT = 16 * 1024  # bytes; larger "auto" allocations go to the heap
# How a parallel loop's iterations go to the threads: taken in shrinking chunks (guided)
# rather than cut in equal shares up front (static), so a thread that starts late (woken from
# its sleep between kernels: kiln.runtime.threads) or runs slowly (its core shared with other
# work) leaves its iterations to the others instead of making them wait at the join.
OMP_SCHEDULE = "guided"

_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "truncdiv": "/", "truncmod": "%",
          "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!=", "and": "&&", "or": "||",
          "bitand": "&", "bitor": "|", "bitxor": "^", "shl": "<<", "shr": ">>"}
_MATH = {"exp": "exp", "log": "log", "sqrt": "sqrt", "tanh": "tanh", "erf": "erf", "erfc": "erfc", "sin": "sin",
         "cos": "cos", "tan": "tan", "asin": "asin", "acos": "acos", "atan": "atan", "sinh": "sinh",
         "cosh": "cosh", "asinh": "asinh", "acosh": "acosh", "atanh": "atanh", "pow": "pow",
         "fabs": "fabs", "floor": "floor", "ceil": "ceil", "round": "rint", "fmod": "fmod",
         "log2": "log2", "exp2": "exp2", "trunc": "trunc", "atan2": "atan2"}



@dataclass(frozen=True)
class Narrow:
    """How the C backend holds a dtype C has no type for."""
    storage: str     # C type of its bytes in memory (DType.c_storage)
    compute: DType   # the dtype its values live in between load and store
    load: str        # helper: storage -> compute (exact)
    store: str       # helper: compute -> storage (rounds as ml_dtypes' astype)
    round: str       # helper: compute -> compute, the nearest representable value (store, load)


def _narrow(dt: DType, tag: str) -> Narrow:
    c = "f32" if dt.is_float else "i32"
    return Narrow(dt.c_storage, DType.float32 if dt.is_float else DType.int32,
                  f"kiln_{tag}_to_{c}", f"kiln_{c}_to_{tag}", f"kiln_round_{tag}")


NARROW = {dt: _narrow(dt, tag) for dt, tag in [
    (DType.bfloat16, "bf16"), (DType.float8e4m3fn, "f8e4m3fn"), (DType.float8e4m3fnuz, "f8e4m3fnuz"),
    (DType.float8e5m2, "f8e5m2"), (DType.float8e5m2fnuz, "f8e5m2fnuz"), (DType.float8e8m0, "f8e8m0"),
    (DType.float4e2m1, "f4e2m1"), (DType.int4, "i4"), (DType.uint4, "u4"), (DType.int2, "i2"),
    (DType.uint2, "u2")]}


def ctype(dt: DType) -> str:
    """The C type of `dt`'s elements in memory (buffers, parameters)."""
    if dt.c_storage is None:
        raise KilnError(f"the C backend cannot handle dtype {dt}", stage="codegen")
    return dt.c_storage


def compute_dtype(dt: DType) -> DType:
    """The dtype `dt`'s values are computed in: itself, or a storage dtype's compute type."""
    nt = NARROW.get(dt)
    return dt if nt is None else nt.compute


def vtype(dt: DType) -> str:
    """The C type of `dt`'s values in expressions and variables."""
    return ctype(compute_dtype(dt))


def _tag(dt: DType) -> str:
    return {"float": "f32", "double": "f64", "_Float16": "f16", "bool": "b"}.get(ctype(dt), dt.name)


class _Names:
    """Generated C identifiers: kind prefix + sanitized name + counter (always unique)."""

    def __init__(self):
        self.map: dict = {}

    def __call__(self, obj, base: str, prefix: str) -> str:
        if obj not in self.map:
            clean = re.sub(r"[^A-Za-z0-9]", "_", base)[:24]
            self.map[obj] = f"{prefix}{len(self.map)}_{clean}"
        return self.map[obj]


DEFAULT_PREFIX = "kiln"


def func_symbol(name: str, prefix: str = DEFAULT_PREFIX) -> str:
    """The exported C symbol of PrimFunc `name` (sanitized; `prefix`_ before it)."""
    clean = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return f"{prefix}_{clean}"


def c_identifier(name: str) -> str:
    """`name` made a C identifier: other characters become `_`, a leading digit gets `m_`."""
    clean = re.sub(r"[^A-Za-z0-9_]", "_", name).strip("_") or "model"
    return f"m_{clean}" if clean[0].isdigit() else clean


def split_units(source: str) -> list[str]:
    """The translation units of `source` as emit_c_units wrote them (joined in any way)."""
    return [UNIT_START + u for u in source.split(UNIT_START)[1:]]


def single_unit(source: str) -> str:
    """One translation unit equivalent to the units of `source`: their shared declarations
    once, then every unit's functions (what an artifact ships as model.c)."""
    units = split_units(source)
    head = units[0].split(FUNCTIONS)[0]
    return head + FUNCTIONS + "".join(u.split(FUNCTIONS, 1)[1] for u in units)


def with_prefix(source: str, prefix: str, old: str = DEFAULT_PREFIX) -> str:
    """`source` with every module function's symbol `old_X` renamed `prefix_X` (the
    functions are those its prototypes declare; static helpers keep their names)."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", prefix):
        raise KilnError(f"symbol prefix {prefix!r} is not a C identifier", stage="codegen")
    head = split_units(source)[0].split(FUNCTIONS)[0]
    names = re.findall(rf"^int32_t {re.escape(old)}_(\w+)\(", head, re.M)
    if not names:
        return source
    pattern = re.compile(rf"\b{re.escape(old)}_({'|'.join(map(re.escape, names))})\b")
    return pattern.sub(lambda m: f"{prefix}_{m.group(1)}", source)


class _Emitter:
    def __init__(self, module: S.LoopModule, threads_impl: str):
        self.module = module
        self.helpers: dict = {}
        self.narrow: set = set()   # kiln.codegen.narrow helpers used
        self.unrounded: dict = {}  # C text of a rounded value -> the text before rounding
        self.lines: list = []
        self.unrolled = 0          # unrolled loops around the statement being emitted
        self.pool = threads_impl == "pool"   # parallel loops outlined for kiln's pool, not OpenMP
        self.scope: dict = {}      # C name -> (type, how) of the variables in scope (kiln.codegen.outline)
        self.outlined: list = []   # the current function's outlined loops (C lines)
        self.tile: Tile | None = None   # the register tile being emitted (kiln.codegen.address)

    # -- helpers emitted on demand ------------------------------------------------
    def use(self, name: str) -> str:
        """A storage-dtype conversion helper (kiln.codegen.narrow), emitted once if used."""
        if name not in CATALOG:
            raise KilnError(f"no conversion helper {name!r}", stage="codegen")
        self.narrow.add(name)
        return name

    def rounded(self, dt: DType, s: str) -> str:
        """C value `s` (computed in dt's compute type) rounded to a value of dt."""
        nt = NARROW.get(dt)
        if dt is DType.float16:  # GCC evaluates _Float16 arithmetic in float unless cast back
            return f"((_Float16){s})"
        if nt is None:
            return s
        r = f"{self.use(nt.round)}({s})"
        self.unrounded[r] = s  # a store rounds anyway
        return r

    def convert(self, dt: DType, src: DType, s: str, mode: str | None = None) -> str:
        """Cast C value `s` (of src's compute type) to dt's compute type."""
        nt = NARROW.get(dt)
        if nt is None:
            if mode is not None:
                raise KilnError(f"a cast to {dt} takes no conversion mode ({mode!r})", stage="codegen")
            return f"(({ctype(dt)}){s})"
        if nt.compute is DType.float32:
            if mode is None:
                return f"{self.use(nt.round)}((float){s})"
            return f"{self.use(nt.load)}({self.use(f'{nt.store}_{mode}')}((float){s}))"
        if mode is not None:
            raise KilnError(f"a cast to {dt} takes no conversion mode ({mode!r})", stage="codegen")
        v = f"kiln_ftoi_ml((double){s})" if compute_dtype(src).is_float else f"((int32_t){s})"
        if compute_dtype(src).is_float:
            self.use("kiln_ftoi_ml")
        return f"{self.use(nt.round)}({v})"

    def helper(self, kind: str, dt: DType) -> str:
        dt = compute_dtype(dt)
        name = f"kiln_{kind}_{_tag(dt)}"
        if name not in self.helpers:
            self.helpers[name] = helper_text(kind, name, ctype(dt), dt.is_float)
        return name

    def opaque(self, e: Expr) -> str:
        """Float constant `e` as a static variable (kiln.codegen.scalar.opaque_text says why)."""
        dt = compute_dtype(e.dtype)
        v = e.arg if e.dtype is dt else np.array(e.arg).astype(e.dtype.np).item()   # (a narrow dtype's value)
        name = f"kiln_k{_tag(dt)}_{np.array(v, dt.np).view(f'u{dt.itemsize}').item():0{dt.itemsize * 2}x}"
        self.helpers.setdefault(name, opaque_text(name, ctype(dt), self.const(e)))
        return name

    # -- expressions ------------------------------------------------------------------
    def const(self, e: Expr) -> str:
        dt, v = e.dtype, e.arg
        nt = NARROW.get(dt)
        if nt is not None:  # the value the dtype holds (ml_dtypes rounding / wrapping), as compute
            v = np.array(v).astype(dt.np).astype(nt.compute.np).item()
            dt = nt.compute
        if dt is DType.bool:
            return "true" if v else "false"
        if dt.is_float:
            if math.isnan(v):
                lit = "NAN"
            elif math.isinf(v):
                lit = "INFINITY" if v > 0 else "(-INFINITY)"
            else:
                lit = float(v).hex() + ("f" if dt is not DType.float64 else "")
            return lit if dt in (DType.float32, DType.float64) and not lit.startswith("(") else f"(({ctype(dt)}){lit})"
        if dt is DType.int64 and v == -2**63:
            return "INT64_MIN"
        if dt in (DType.int64, DType.int32) and -2**31 < v < 2**31:
            return str(v) if v >= 0 else f"({v})"
        suffix = "ULL" if not dt.is_signed else "LL"
        return f"(({ctype(dt)}){v}{suffix})" if v >= 0 else f"(({ctype(dt)})({v}LL))"

    def expr(self, e: Expr, ctx: Ctx, n: _Names) -> str:
        go = lambda x: self.expr(x, ctx, n)  # noqa: E731
        op, dt = e.op, e.dtype
        if op == "var":
            return n(e, e.arg.name, "v")
        if op == "const":
            return self.const(e)
        if op == "load":
            s = self.element(e.arg, self.flat(e.arg, e.args, ctx), ctx, n)
            nt = NARROW.get(dt)
            return s if nt is None else f"{self.use(nt.load)}({s})"
        if op in _INFIX:
            return self.rounded(dt, f"({go(e.args[0])} {_INFIX[op]} {go(e.args[1])})")
        if op in ("floordiv", "floormod"):
            a, b = e.args
            lo_b = ctx.bounds(b)[0]   # a positive divisor: a constant, or a symbolic size (>= 1)
            if ctx.bounds(a)[0] is not None and ctx.bounds(a)[0] >= 0 and lo_b is not None and lo_b > 0:
                return self.rounded(dt, f"({go(a)} {'/' if op == 'floordiv' else '%'} {go(b)})")
            return self.rounded(dt, f"KILN_{op.upper()}({vtype(dt)}, {go(a)}, {go(b)})")
        if op in ("min", "max"):    # against a constant not NaN: one maxps / minps, not the NaN test's 3 ops
            a, b = sorted(e.args, key=lambda v: v.op == "const")
            known = b.op == "const" and a.op != "const" and compute_dtype(dt).is_float and not math.isnan(b.arg)
            return f"{self.helper(op + 'c' if known else op, dt)}({go(a)}, {self.opaque(b) if known else go(b)})"
        if op == "not":
            return f"(!{go(e.args[0])})"
        if op == "select":
            c, a, b = map(go, e.args)
            return f"({c} ? {a} : {b})"
        if op == "cast":
            a = e.args[0]
            s = go(a)
            if dt is DType.float64 and a.op == "cast" and a.dtype is DType.float32 \
                    and a.args[0].dtype is DType.float64:
                # (double)(float)x: GCC 12's vectorizer drops the rounding in a loop's SLP
                # epilogue (the tail lanes get x itself); an exact fma(f, 1, -0) keeps it
                s = f"__builtin_fmaf({s}, 1.0f, -0.0f)"
            return self.convert(dt, a.dtype, s, e.arg)
        if op == "call":
            return self.call(e, ctx, n)
        if op == "check":  # report when ok is false; the value is safe either way
            v, ok, rep = e.args
            return (f"({{ if (__builtin_expect(!{go(ok)}, 0)) kiln_fail(&kiln_status, &kiln_bad, "
                    f"{self.codes[e.arg]}, {go(rep)}); {go(v)}; }})")
        if op == "reduce":
            raise KilnError("a reduce expression reached codegen unlowered", stage="codegen")
        raise KilnError(f"cannot emit expression op {op!r}", stage="codegen")

    def call(self, e: Expr, ctx: Ctx, n: _Names) -> str:
        name, src = e.arg, compute_dtype(e.args[0].dtype)
        if name in ("prefetch", "prefetch_l2"):  # (kiln.loops.expr.prefetch: read soon, kept in L1 / L2)
            a, locality = e.args[0], 3 if name == "prefetch" else 2
            return f"__builtin_prefetch(&{self.element(a.arg, self.flat(a.arg, a.args, ctx), ctx, n)}, 0, {locality})"
        args = [self.expr(a, ctx, n) for a in e.args]
        if name in ("isnan", "isinf"):
            return f"({name}({args[0]}) != 0)"
        if name in ("sigmoid", "sign") or (name == "abs" and not src.is_float):
            return self.rounded(e.dtype, f"{self.helper(name, src)}({args[0]})")
        if name == "exp_floored":  # exp(max(x, floor)): see the prelude's kiln_exp_floor_*
            wide = DType.float64 if src is DType.float64 else DType.float32
            floor = f"kiln_exp_floor_{_tag(wide)}"
            arg = f"{self.helper('max', wide)}(({ctype(wide)}){args[0]}, {floor})"
            return self.convert(e.dtype, wide, self._math("exp", wide, [arg]))
        if name == "rsqrt":
            return self.rounded(e.dtype, f"(({ctype(src)})1 / {self._math('sqrt', src, args)})")
        if name == "erfc" and src is DType.float32:   # inline, vectorized (kiln_erfc.h)
            self.helpers.setdefault("kiln_erfc_f32", c_source("kiln_exp.h") + c_source("kiln_erfc.h"))
            return self.rounded(e.dtype, f"kiln_erfc_f32({args[0]})")
        return self.rounded(e.dtype, self._math("fabs" if name == "abs" else name, src, args))

    def _math(self, name, dt, args):
        fn = _MATH[name] + ("" if dt is DType.float64 else "f")
        if dt is DType.float16:
            return f"((_Float16){fn}({', '.join(f'(float){a}' for a in args)}))"
        return f"{fn}({', '.join(args)})"

    def flat(self, buf: S.Buffer, idx, ctx: Ctx) -> Expr:
        return ctx.simplify(_flat(buf, idx)) if idx else const(0, DType.int64)

    def element(self, buf: S.Buffer, flat: Expr, ctx: Ctx, n: _Names) -> str:
        """`buf`[`flat`] in C (in a register tile: kiln.codegen.address)."""
        text = lambda e: self.expr(e, ctx, n)  # noqa: E731
        name = n(buf, buf.name, "b")
        return f"{name}[{text(flat)}]" if self.tile is None else self.tile.element(name, buf, flat, text)

    # -- a register tile's vector: straight vector code ------------------------------------
    def vector_store(self, s: S.For, ctx: Ctx, n: _Names) -> str | None:
        """A vectorized loop of one vector's lanes (16, 32 or 64 bytes of float32/float64)
        inside an unrolled loop, storing a value of contiguous loads, lane-invariant values,
        + - * / and lane-invariant selects, as one statement of GCC vector types; else None
        (the loop stays a `#pragma omp simd` loop). A register tile unrolls such loops tens of
        times (MobileNetV2's depthwise 3x3 tile: 126) and GCC then vectorizes each copy
        again, most of the tile's compile time: one depthwise kernel 0.84 s -> 0.17 s of CPU,
        its run time 0.233 -> 0.210 ms (one thread)."""
        st, v = s.body, s.var
        lo, ext = ctx.simplify(s.min), ctx.simplify(s.extent)
        if not isinstance(st, S.Store) or lo.op != "const" or ext.op != "const" or ext.arg < 2:
            return None
        dt = st.buffer.dtype
        if dt not in (DType.float32, DType.float64) or st.value.dtype is not dt \
                or ext.arg * dt.itemsize not in (16, 32, 64):
            return None
        vt = f"kiln_vec_{_tag(dt)}x{ext.arg}"
        lanes = Ctx({**ctx.ranges, v: (lo.arg, lo.arg + ext.arg - 1)})

        def at_first(buf, idx) -> str | None:   # the first lane's element, if the lanes are contiguous
            if buf.dtype is not dt or not idx:
                return None
            flat = lanes.simplify(_flat(buf, idx))
            if _coefficient(flat, v) != 1:
                return None
            return self.element(buf, ctx.simplify(substitute(flat, {v: lo})), ctx, n)

        def permuted(buf, idx) -> str | None:   # lanes of one run in another order: a shuffle
            got = permuted_lanes(buf, idx, v, lo, ext.arg, ctx) if buf.dtype is dt else None
            if got is None:
                return None
            self.helpers.setdefault("KILN_PERMUTE", PERMUTE)
            it = f"{ctype(DType.int32 if dt.itemsize == 4 else DType.int64)}"
            self.helpers.setdefault(f"{vt}_idx", f"typedef {it} {vt}_idx __attribute__((vector_size({ext.arg * dt.itemsize})));")
            start = self.element(buf, ctx.simplify(_flat(buf, (*idx[:-1], const(got[0], idx[-1].dtype)))), ctx, n)
            return f"KILN_PERMUTE({vt}_idx, *(const {vt}*)&{start}, {', '.join(map(str, got[1]))})"

        def vec(e: Expr) -> tuple[str, bool]:   # (C text, whether a vector)
            if v not in free_vars(e):
                return self.expr(e, ctx, n), False
            if e.op == "load" and (first := at_first(e.arg, e.args)) is not None:
                return f"(*(const {vt}*)&{first})", True
            if e.op == "load" and (shuffled := permuted(e.arg, e.args)) is not None:
                return shuffled, True
            if e.op in ("add", "sub", "mul", "div") and e.dtype is dt:
                (a, _), (b, _) = vec(e.args[0]), vec(e.args[1])
                return f"({a} {_INFIX[e.op]} {b})", True
            if e.op == "select" and e.dtype is dt and v not in free_vars(e.args[0]):
                a, b = (f"(({vt}){splat(*vec(x))})" for x in e.args[1:])   # (one type for both arms)
                return f"({self.expr(e.args[0], ctx, n)} ? {a} : {b})", True
            raise _NotVector

        def splat(text: str, is_vector: bool) -> str:   # x - (+0) is x, -0 and NaN included
            return text if is_vector else f"(({text}) - ({vt}){{0}})"
        target = at_first(st.buffer, st.indices)
        if target is None:
            return None
        try:
            value = splat(*vec(st.value))
        except _NotVector:
            return None
        self.helpers.setdefault(vt, f"typedef {ctype(dt)} {vt} __attribute__((vector_size({ext.arg * dt.itemsize}), "
                                    f"aligned({dt.itemsize}), may_alias));")
        return f"*({vt}*)&{target} = {value};"

    # -- statements --------------------------------------------------------------------
    def stmt(self, s: S.Stmt, ctx: Ctx, n: _Names, d: int, in_par: bool):
        pad = "  " * d
        out = self.lines.append
        if isinstance(s, S.For) and s.kind == "unrolled" and self.tile is None and Tile.fits(s):
            self.tiled(s, ctx, n, d, in_par)
        elif isinstance(s, S.For):
            v = n(s.var, s.var.arg.name, "v")
            lo, ext = ctx.simplify(s.min), ctx.simplify(s.extent)
            ranges = dict(ctx.ranges)
            if lo.op == "const" and ext.op == "const":
                ranges[s.var] = (lo.arg, lo.arg + ext.arg - 1)
            elif lo.op == "const":   # a symbolic extent (kiln.loops.symbols)
                ranges[s.var] = (lo.arg, ctx.simplify(lo + ext - 1))
            inner = Ctx(ranges)
            if s.kind == "vectorized" and self.unrolled and (line := self.vector_store(s, ctx, n)) is not None:
                out(pad + line)
                return
            if s.kind == "parallel" and not in_par and self.pool:
                self.outline(s, ctx, n, d, lo, ext, inner)
                return
            if s.kind == "parallel" and not in_par and ext.op != "const":
                # a symbolic extent (kiln.loops.symbols): serial below SERIAL_WORK iterations,
                # decided at run time (a batch of 1 forks no threads)
                work = self.expr(ctx.simplify(_work(s)), ctx, n)
                out(f"{pad}#pragma omp parallel for schedule({OMP_SCHEDULE}) if({work} >= {SERIAL_WORK})")
            elif s.kind == "parallel" and not in_par:
                out(f"{pad}#pragma omp parallel for schedule({OMP_SCHEDULE})")
            elif s.kind == "vectorized" and not _has_loops(s.body):
                out(f"{pad}#pragma omp simd")
            elif s.kind == "unrolled" and ext.op == "const":
                out(f"{pad}#pragma GCC unroll {min(ext.arg, 64)}")
            end = self.expr(ctx.simplify(lo + ext), ctx, n)
            out(f"{pad}for (int64_t {v} = {self.expr(lo, ctx, n)}; {v} < {end}; ++{v}) {{")
            unrolled = s.kind == "unrolled" and ext.op == "const"
            self.unrolled += unrolled
            self.scope[v] = ("int64_t", "value")
            self.stmt(s.body, inner, n, d + 1, in_par or s.kind == "parallel")
            del self.scope[v]
            self.unrolled -= unrolled
            out(pad + "}")
        elif isinstance(s, S.Store):
            nt, v = NARROW.get(s.buffer.dtype), s.value
            if nt is None:
                val = self.expr(v, ctx, n)
            elif v.op == "load" and v.dtype is s.buffer.dtype:  # a copy: the bytes as they are
                val = self.element(v.arg, self.flat(v.arg, v.args, ctx), ctx, n)
            else:
                val = self.expr(v, ctx, n)
                val = f"{self.use(nt.store)}({self.unrounded.get(val, val)})"
            out(f"{pad}{self.element(s.buffer, self.flat(s.buffer, s.indices, ctx), ctx, n)} = {val};")
        elif isinstance(s, S.Seq):
            for t in s.stmts:
                self.stmt(t, ctx, n, d, in_par)
        elif isinstance(s, S.IfThenElse):
            out(f"{pad}if ({self.expr(s.cond, ctx, n)}) {{")
            self.stmt(s.then, ctx, n, d + 1, in_par)
            if s.else_ is not None:
                out(pad + "} else {")
                self.stmt(s.else_, ctx, n, d + 1, in_par)
            out(pad + "}")
        elif isinstance(s, S.Allocate):
            b = s.buffer
            name, t = n(b, b.name, "b"), ctype(b.dtype)
            sized = not isinstance(b.size, Expr)     # else a symbolic size: on the heap
            if sized and (s.scope == "stack" or (s.scope == "auto" and b.nbytes <= STACK_LIMIT)):
                out(f"{pad}{{ {t} {name}[{max(b.size, 1)}] __attribute__((aligned(64)));")
                with self.declared(name, t + "*", "array"):
                    self.stmt(s.body, ctx, n, d + 1, in_par)
                out(pad + "}")
            elif not sized and s.scope == "auto":
                # a symbolic size (kiln.loops.symbols), often a row inside a parallel loop: on
                # the stack (a VLA, gone at the block's end) when small, else on the heap
                size = self.expr(ctx.simplify(b.size), ctx, n)
                fits = f"({size}) * {b.dtype.itemsize} <= {STACK_LIMIT}"
                out(f"{pad}{{ {t} {name}_s[{fits} && ({size}) > 0 ? ({size}) : 1] __attribute__((aligned(64)));")
                out(f"{pad}{t}* restrict {name} = {fits} ? {name}_s : ({t}*)kiln_alloc((uint64_t)({size}) * "
                    f"{b.dtype.itemsize});")
                with self.declared(name, t + "*", "restrict"):
                    self._guarded(s.body, name, ctx, n, d, in_par, f"if ({name} != {name}_s) free({name}); }}")
            else:
                nbytes = f"{b.nbytes}ULL" if sized else f"(uint64_t)({self.expr(ctx.simplify(b.nbytes), ctx, n)})"
                out(f"{pad}{{ {t}* restrict {name} = ({t}*)kiln_alloc({nbytes});")
                with self.declared(name, t + "*", "restrict"):
                    self._guarded(s.body, name, ctx, n, d, in_par, f"free({name}); }}")
        elif isinstance(s, S.Let):
            name = n(s.var, s.var.arg.name, 'v')
            out(f"{pad}{{ const {vtype(s.var.dtype)} {name} = {self.expr(s.value, ctx, n)};")
            with self.declared(name, vtype(s.var.dtype), "value"):
                self.stmt(s.body, ctx, n, d + 1, in_par)
            out(pad + "}")
        elif isinstance(s, S.Evaluate):
            out(f"{pad}(void){self.expr(s.expr, ctx, n)};")
        elif isinstance(s, S.Call):
            # the first failing call ends the run: the runtime names its node and what failed
            # (kiln's pool sleeps while a hand-written kernel forks OpenMP's team: kiln_pool_park)
            park = self.pool and forks_openmp(self.module[s.func])
            out(f"{pad}if (!kiln_failed) {{ {'kiln_pool_park(); ' if park else ''}"
                f"int32_t s_ = {func_symbol(s.func)}({self.call_args(s, n)}); {'kiln_pool_unpark(); ' if park else ''}"
                f"if (s_ != 0) kiln_failed = KILN_CALL_STATUS({self.calls}, s_); }}")
            self.calls += 1
        else:
            raise KilnError(f"cannot emit statement {type(s).__name__}", stage="codegen")

    def tiled(self, s: S.For, ctx: Ctx, n: _Names, d: int, in_par: bool) -> None:
        """Register tile `s` (an unrolled nest) after its accesses' invariant offsets (kiln.codegen.address)."""
        saved, self.lines, self.tile = self.lines, [], Tile(s)
        try:
            self.stmt(s, ctx, n, d, in_par)
        finally:
            tile, body, self.lines, self.tile = self.tile, self.lines, saved, None
        self.lines += [f"{'  ' * d}{{ {tile.declarations(vtype)}", *body, "  " * d + "}"] if tile.offsets else body

    @contextlib.contextmanager
    def declared(self, name: str, ctype_: str, how: str):
        """`name` (C type `ctype_`, `how`: kiln.codegen.outline) is in scope for the statements inside."""
        self.scope[name] = (ctype_, how)
        try:
            yield
        finally:
            del self.scope[name]

    def outline(self, s: S.For, ctx: Ctx, n: _Names, d: int, lo: Expr, ext: Expr, inner: Ctx) -> None:
        """Parallel loop `s` run by kiln's pool: its body outlined (kiln.codegen.outline)."""
        pad, out = "  " * d, self.lines.append
        fn = f"{self.symbol}_par{len(self.outlined)}"
        v = n(s.var, s.var.arg.name, "v")
        saved, self.lines = self.lines, [f"  for (int64_t {v} = kiln_lo; {v} < kiln_hi; ++{v}) {{"]
        self.stmt(s.body, inner, n, 2, True)
        body, self.lines = self.lines + ["  }"], saved
        made = outline(fn, body, self.scope)
        self.outlined += made.definition
        start, end = self.expr(lo, ctx, n), self.expr(ctx.simplify(lo + ext), ctx, n)
        out(f"{pad}{{ {made.struct} kiln_c = {made.init};")
        run = f"kiln_pool_for({fn}, &kiln_c, {start}, {end});"
        if ext.op != "const":   # a symbolic extent: serial below SERIAL_WORK iterations (decided at run time)
            run = f"if ({self.expr(ctx.simplify(_work(s)), ctx, n)} >= {SERIAL_WORK}) {run} else {fn}(&kiln_c, {start}, {end});"
        out(f"{pad}  {run} }}")

    def _guarded(self, body, name: str, ctx, n, d: int, in_par: bool, end: str) -> None:
        """`body` where buffer `name` was allocated (else the allocation failure), then `end`."""
        pad, out = "  " * d, self.lines.append
        out(f"{pad}if ({name}) {{")
        self.stmt(body, ctx, n, d + 1, in_par)
        out(f"{pad}}} else {{")
        out(f"{pad}  #pragma omp atomic write")
        out(f"{pad}  kiln_failed = 1;")
        out(f"{pad}}}")
        out(f"{pad}{end}")

    def call_args(self, s: S.Call, n: _Names) -> str:
        callee = self.module[s.func]
        if len(callee.params) != len(s.args):
            raise KilnError(f"call {s.func}: {len(s.args)} args for {len(callee.params)} params", stage="codegen")
        out = []
        for p, a in zip(callee.params, s.args):
            if isinstance(a, S.View):
                off = a.byte_offset if not isinstance(a.byte_offset, Expr) or a.byte_offset.op == "const" else None
                off = int(off if not isinstance(off, Expr) else off.arg) if off is not None else \
                    self.expr(a.byte_offset, Ctx(), n)   # planned per shape (a symbolic module)
                out.append(f"({ctype(p.dtype)}*)((char*){n(a.buffer, a.buffer.name, 'b')} + {off})")
            else:
                out.append(n(a, a.name, "b"))
        return ", ".join(out)

    # -- functions ------------------------------------------------------------------------
    def signature(self, f: S.PrimFunc, n: _Names) -> str:
        written = S.written_buffers(f.body)
        restrict = " restrict" if f.noalias else ""
        params = ", ".join(f"{'' if p in written else 'const '}{ctype(p.dtype)}*{restrict} {n(p, p.name, 'b')}"
                           for p in f.params)
        return f"int32_t {func_symbol(f.name)}({params or 'void'})"

    def func(self, f: S.PrimFunc) -> list:
        n = _Names()
        self.lines, self.outlined, self.symbol = [], [], func_symbol(f.name)   # (outlined loops' names)
        self.calls = 0
        self.codes = {m: k for k, m in f.errors}
        self.lines.append(self.signature(f, n) + " {")
        self.lines.append("  int32_t kiln_failed = 0;")
        if self.codes:
            self.lines.append("  int32_t kiln_status = 0;")
            self.lines.append("  int64_t kiln_bad = 0;")
        # the entry holds kiln's pool for the inference: its threads spin only meanwhile
        entry = self.pool and f.name == self.module.entry
        if entry:
            self.lines.append("  kiln_pool_enter();")
        written, restrict = S.written_buffers(f.body), "restrict" if f.noalias else "pointer"
        self.scope = {n(p, p.name, "b"): (f"{'' if p in written else 'const '}{ctype(p.dtype)}*", restrict)
                      for p in f.params}
        self.stmt(f.body, Ctx(), n, 1, False)
        if entry:
            self.lines.append("  kiln_pool_leave();")
        if self.codes:
            self.lines.append("  if (kiln_status != 0) { kiln_err_value = kiln_bad; return kiln_status; }")
        self.lines.append("  return -kiln_failed;")
        self.lines.append("}")
        return self.outlined + self.lines


_OPENMP_FORK = re.compile(r"#\s*pragma\s+omp\s+parallel\b|\bomp_get_(?:max_threads|num_threads|thread_num)\b")


def forks_openmp(f) -> bool:
    """Whether kernel `f` is hand-written C that forks OpenMP's team itself (not kiln's pool)."""
    if not isinstance(f, S.ExternFunc):
        return False
    # (less kiln_par_for's texts: it runs on the module's threads)
    text = f.c_body + f.preamble.replace(c_source("kiln_pool.h"), "").replace(c_source("kiln_par.h"), "")
    return bool(_OPENMP_FORK.search(text))


def _work(s: S.Stmt):
    """The iterations `s` runs (an index Expr over its loops' extents)."""
    from kiln.loops.expr import const
    if isinstance(s, S.For):
        return s.extent * _work(s.body)
    if isinstance(s, S.Seq):
        total = const(0, DType.int64)
        for t in s.stmts:
            total = total + _work(t)
        return total
    if isinstance(s, S.IfThenElse):
        return _work(s.then) + (_work(s.else_) if s.else_ is not None else 0)
    if isinstance(s, (S.Allocate, S.Let)):
        return _work(s.body)
    return const(1, DType.int64)


def _has_loops(s: S.Stmt) -> bool:
    if isinstance(s, (S.For, S.Allocate, S.Call)):
        return True
    kids = list(getattr(s, "stmts", ())) + [getattr(s, k, None) for k in ("body", "then", "else_")]
    return any(k is not None and isinstance(k, S.Stmt) and _has_loops(k) for k in kids)


def _extern_signature(f: S.ExternFunc) -> str:
    """Hand-written kernels name their params in0.., out0.. (kiln-made names, checked)."""
    for p in f.params:
        if not re.fullmatch(r"(in|out)[0-9]+", p.name):
            raise KilnError(f"extern kernel {f.name!r}: param name {p.name!r} is not kiln-made",
                            stage="codegen")
    params = ", ".join(f"{'const ' if p.name.startswith('in') else ''}{ctype(p.dtype)}* restrict {p.name}"
                       for p in f.params)
    return f"int32_t {func_symbol(f.name)}({params or 'void'})"


def _emit(module: S.LoopModule, threads_impl: str | None = None,
          split_shared: bool = False) -> tuple[str, list[str], list[str]]:
    """(shared header: prelude, helpers, prototypes; one source text per function; the
    shared kernels' units). `split_shared`: the preambles' shared definitions (csource.c_shared)
    go into units of their own (else they stay in the header, and the last list is empty).
    `threads_impl`: who runs the parallel loops, the Target's (`threads_impl_of`)."""
    em = _Emitter(module, threads_impl_of(threads_impl))
    bodies = [[_extern_signature(f) + " {", f.c_body, "}"] if isinstance(f, S.ExternFunc) else em.func(f)
              for f in module.funcs]
    protos = [(_extern_signature(f) if isinstance(f, S.ExternFunc) else em.signature(f, _Names())) + ";"
              for f in module.funcs]
    if module.interface:
        proto, body = _interface(module.interface)
        protos.append(proto + ";")
        bodies.append(body)
    if any(p.dtype is DType.string for f in module.funcs for p in f.params):  # it may make strings
        for proto, body in _string_functions():
            protos.append(proto + ";")
            bodies.append(body)
    preambles = dict.fromkeys(f.preamble for f in module.funcs if isinstance(f, S.ExternFunc) and f.preamble)
    shared: dict[str, None] = {}
    if split_shared:
        preambles = dict.fromkeys(_lift_shared(p, shared) for p in preambles)
    # kiln's pool: in one text, defined in its header; split, a shared unit of its own (the
    # same in every module: its object compiled once per machine, `pool_block`), declared
    pool = [c_source("kiln_pool_decl.h") if split_shared else c_source("kiln_pool.h")] if em.pool else []
    if split_shared and em.pool:
        shared = {pool_block(): None, **shared}
    header = "\n".join([UNIT_PRELUDE, *pool, *preambles, *helper_source(em.narrow), *em.helpers.values(), "", *protos, "",
                        FUNCTIONS])
    return header, ["\n".join(b) + "\n" for b in bodies], [shared_unit(block) for block in shared]


_SHARED = re.compile(re.escape(SHARED_BEGIN) + ".*?" + re.escape(SHARED_END), re.S)


def pool_block() -> str:
    """kiln's thread pool (kiln_pool.h) as a shared block: a unit of its own in every module
    split into units, whose object the build keeps per machine (`shared_unit`). Its weak
    definitions took 0.12 s of CPU in every unit that held them; compiled once per machine
    (and, cold, at the start of the compile, kiln.codegen.build.prebuild_pool), none."""
    return SHARED_BEGIN + c_source("kiln_pool.h") + SHARED_END


def _lift_shared(preamble: str, into: dict) -> str:
    """`preamble` without its shared definitions, which are added to `into` (by text)."""
    for block in _SHARED.findall(preamble):
        into[block] = None
    return _SHARED.sub("", preamble)


def shared_unit(block: str) -> str:
    """The translation unit of one shared kernel (csource.c_shared): the prelude and its
    definition, nothing of the module, so its text (and object) is the same in every module."""
    return "\n".join([UNIT_PRELUDE, FUNCTIONS, block])


def is_shared_unit(unit: str) -> bool:
    """Whether translation unit `unit` is a shared kernel's (its object is cached per machine)."""
    return unit.startswith(UNIT_PRELUDE) and unit[len(UNIT_PRELUDE):].startswith("\n" + FUNCTIONS + "\n" + SHARED_BEGIN)


INTERFACE = "interface"
STRINGS_GATHER, STRINGS_RELEASE = "strings_gather", "strings_release"


def _string_functions() -> list[tuple[str, list[str]]]:
    """Every module's two exported string functions (renamed with its symbol prefix, so
    several libraries in one program never share them): `gather` copies n strings' bytes
    back to back into dst (how the runtime reads string outputs), `release` frees the
    calling thread's string arena (after the outputs have been read)."""
    gather = f"int32_t {func_symbol(STRINGS_GATHER)}(const kiln_str* s, int64_t n, char* dst)"
    release = f"int32_t {func_symbol(STRINGS_RELEASE)}(void)"
    return [(gather, [gather + " {", "  for (int64_t i = 0; i < n; ++i)",
                      "    if (s[i].len > 0) { memcpy(dst, s[i].ptr, (size_t)s[i].len); dst += s[i].len; }",
                      "  return 0;", "}"]),
            (release, [release + " {", "  kiln_str_free_all();", "  return 0;", "}"])]


def _interface(text: str) -> tuple[str, list[str]]:
    """`int32_t kiln_interface(const char** out)`: points `out` at the module's static
    description (kiln-made JSON of dtypes and numbers; anything else is refused)."""
    if not re.fullmatch(r'[A-Za-z0-9_ ,:"\[\]{}-]*', text):
        raise KilnError("a module's interface text may hold only JSON of names and numbers", stage="codegen")
    proto = f"int32_t {func_symbol(INTERFACE)}(const char** out)"
    literal = text.replace('"', '\\"')
    return proto, [proto + " {", f'  *out = "{literal}";', "  return 0;", "}"]


def with_interface_fields(source: str, prefix: str, **fields: str) -> str:
    """`source` with `fields` (hex or identifier strings) added to the description its
    `prefix`_interface reports: an artifact binds its library to its weights' sha256."""
    for k, v in fields.items():
        if not (re.fullmatch(r"[a-z][a-z0-9_]*", k) and re.fullmatch(r"[A-Za-z0-9_]*", v)):
            raise KilnError(f"interface field {k!r} = {v!r} is not a name and a plain value", stage="codegen")
    extra = "".join(f'\\"{k}\\":\\"{v}\\",' for k, v in fields.items())
    head = f'int32_t {prefix}_{INTERFACE}(const char** out) {{\n  *out = "{{'
    if source.count(head) > 1:
        raise KilnError(f"{prefix}_{INTERFACE} is defined twice", stage="codegen")
    return source.replace(head, head + extra)


def emit_c(module: S.LoopModule, threads_impl: str | None = None) -> str:
    """The C source of a whole module: prelude, helpers, prototypes, kernels (shared
    kernels' definitions in the header); parallel loops on `threads_impl` (the Target's,
    `threads_impl_of`)."""
    header, bodies, _ = _emit(module, threads_impl)
    return "\n".join([_defining(header), *bodies])


def emit_c_units(module: S.LoopModule, n: int, threads_impl: str | None = None) -> list[str]:
    """The module as up to `n` translation units of similar compile time, to compile in
    parallel (the longest first, each into the unit with the least so far), then one unit
    per shared kernel (`shared_unit`). A hand-written kernel's cost counts its preamble (once
    per preamble): its body is often one call of a function the preamble inlines into it
    (flash attention: 1.1 s of bert_encoder's 1.4 s, was placed as if free)."""
    header, bodies, shared = _emit(module, threads_impl, split_shared=True)
    units: list[list[str]] = [[] for _ in range(max(1, min(n, len(bodies))))]
    sizes = [0.0] * len(units)
    costs, seen = [compile_cost(b) for b in bodies], set()
    for k, f in enumerate(module.funcs):
        if isinstance(f, S.ExternFunc) and f.preamble and f.preamble not in seen:
            seen.add(f.preamble)
            costs[k] += compile_cost(_lift_shared(f.preamble, {}))
    for cost, b in sorted(zip(costs, bodies), key=lambda cb: -cb[0]):
        k = sizes.index(min(sizes))
        units[k].append(b)
        sizes[k] += cost
    return ["\n".join([_defining(header) if k == 0 else header, *u]) for k, u in enumerate(units)] + shared


def _defining(header: str) -> str:
    """A unit's `header` (from _emit) with the runtime's definitions: one unit per library."""
    return PRELUDE + header[len(UNIT_PRELUDE):]
