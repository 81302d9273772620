"""Loop-level expressions: one immutable, hash-consed node type (tinygrad's UOp idea).

Every node is `Expr(op, dtype, args, arg)`. Building the same structure twice returns
the same object, so `a is b` *is* structural equality and Exprs are cheap dict keys.
Python `==` therefore stays identity; build comparisons with `.eq()` / `.ne()`
(`<`, `<=`, `>`, `>=` do build Exprs). Index arithmetic is int64; `//` and `%` are
floor division/modulo (Python semantics), `truncdiv`/`truncmod` are C's.
"""

from __future__ import annotations

import itertools
import math
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.dtypes import DType
from kiln.errors import KilnError

INDEX = DType.int64

# How loop IR prints (Expr here, statements, functions and modules in kiln.loops.stmt):
# kiln.loops.printer, which imports the IR, registers its `text` here when imported, and the
# kiln.loops package imports it first, so it is in place whenever loop IR exists. The IR does
# not import its printer.
_PRINTER: list = []


def register_printer(fn) -> None:
    """Make `fn(ir) -> str` what str() of loop IR returns (kiln.loops.printer's `text`)."""
    _PRINTER[:] = [fn]


def ir_text(ir) -> str:
    """`ir` (an Expr, statement, function or module) as the registered printer writes it."""
    return _PRINTER[0](ir)


# op name -> C-like infix symbol, used by the printer and the C backend
BINARY = {"add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "floormod": "%",
          "truncdiv": "/", "truncmod": "%", "min": "min", "max": "max",
          "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!=",
          "and": "&&", "or": "||", "bitand": "&", "bitor": "|", "bitxor": "^", "shl": "<<", "shr": ">>"}
COMPARE = {"lt", "le", "gt", "ge", "eq", "ne"}
UNARY_INTRIN = {"exp", "exp_floored", "log", "sqrt", "rsqrt", "tanh", "erf", "erfc", "sin", "cos", "tan", "asin", "acos",
                "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "abs", "floor", "ceil", "round",
                "sigmoid", "fabs", "isnan", "isinf", "sign", "log2", "exp2", "trunc"}
BINARY_INTRIN = {"pow", "fmod", "atan2"}
REDUCERS = ("sum", "prod", "max", "min")


@dataclass(frozen=True)
class VarInfo:
    """What a variable is: a name for printing, a unique id (two `var("i")` differ),
    and for iteration variables their domain (min, extent) and kind."""
    name: str
    uid: int
    dom: tuple[int, int] | None = None
    kind: str = "spatial"  # "spatial" | "reduce"


_uids = itertools.count()


def _key(arg):
    if isinstance(arg, float):
        return ("f", arg.hex())
    return arg


class _Interned(type):
    """Metaclass that hash-conses Expr construction."""
    cache: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()

    def __call__(cls, op, dtype, args=(), arg=None):
        key = (op, dtype, args, _key(arg))
        hit = _Interned.cache.get(key)
        if hit is None:
            hit = super().__call__(op, dtype, tuple(args), arg)
            _Interned.cache[key] = hit
        return hit


@dataclass(frozen=True, eq=False, repr=False)
class Expr(metaclass=_Interned):
    op: str
    dtype: DType
    args: tuple = ()
    arg: Any = None

    # -- introspection ----------------------------------------------------
    @property
    def is_const(self) -> bool:
        return self.op == "const"

    @property
    def value(self):
        return self.arg

    @property
    def name(self) -> str:
        return self.arg.name if self.op == "var" else str(self)

    def __repr__(self):
        return ir_text(self)

    __str__ = __repr__

    def __bool__(self):
        raise KilnError(f"an Expr has no truth value ({self}); use select()/.eq() instead")

    # -- operator overloading ---------------------------------------------
    def __add__(self, o): return binary("add", self, o)
    def __radd__(self, o): return binary("add", o, self)
    def __sub__(self, o): return binary("sub", self, o)
    def __rsub__(self, o): return binary("sub", o, self)
    def __mul__(self, o): return binary("mul", self, o)
    def __rmul__(self, o): return binary("mul", o, self)
    def __truediv__(self, o): return binary("div", self, o)
    def __rtruediv__(self, o): return binary("div", o, self)
    def __floordiv__(self, o): return binary("floordiv", self, o)
    def __rfloordiv__(self, o): return binary("floordiv", o, self)
    def __mod__(self, o): return binary("floormod", self, o)
    def __rmod__(self, o): return binary("floormod", o, self)
    def __lt__(self, o): return binary("lt", self, o)
    def __le__(self, o): return binary("le", self, o)
    def __gt__(self, o): return binary("gt", self, o)
    def __ge__(self, o): return binary("ge", self, o)
    def eq(self, o): return binary("eq", self, o)
    def ne(self, o): return binary("ne", self, o)
    def __and__(self, o): return binary("and" if self.dtype is DType.bool else "bitand", self, o)
    def __or__(self, o): return binary("or" if self.dtype is DType.bool else "bitor", self, o)
    def __xor__(self, o): return binary("ne" if self.dtype is DType.bool else "bitxor", self, o)
    def __lshift__(self, o): return binary("shl", self, o)
    def __rshift__(self, o): return binary("shr", self, o)
    def __neg__(self): return binary("sub", const(0, self.dtype), self)
    def __abs__(self): return call("abs", self)

    def __invert__(self):
        if self.dtype is DType.bool:
            return Expr("not", DType.bool, (self,))
        return binary("bitxor", self, const(-1, self.dtype))

    def astype(self, dtype: DType) -> "Expr":
        return cast(dtype, self)


# -- constructors -------------------------------------------------------------

def var(name: str, dtype: DType = INDEX, dom: tuple[int, int] | None = None, kind: str = "spatial") -> Expr:
    return Expr("var", dtype, (), VarInfo(name, next(_uids), dom, kind))


def const(value, dtype: DType) -> Expr:
    if dtype.is_float:
        value = float(value)
    elif dtype is DType.bool:
        value = int(bool(value))
    else:
        value = int(value)
    return Expr("const", dtype, (), value)


def as_expr(x, like: DType | None = None) -> Expr:
    """Python scalar -> const (typed like the other operand); Exprs pass through."""
    if isinstance(x, Expr):
        return x
    if hasattr(x, "as_expr"):
        return x.as_expr()
    if like is None:
        like = DType.bool if isinstance(x, bool) else INDEX if isinstance(x, int) else DType.float32
    return const(x, like)


def binary(op: str, a, b) -> Expr:
    a = as_expr(a, b.dtype if isinstance(b, Expr) else None)
    b = as_expr(b, a.dtype)
    if a.dtype is not b.dtype:
        raise KilnError(f"dtype mismatch in {op}: {a.dtype} vs {b.dtype} ({a} {BINARY[op]} {b}); cast explicitly")
    dt = a.dtype
    if op in ("floordiv", "floormod", "truncdiv", "truncmod", "shl", "shr", "bitand", "bitor", "bitxor") \
            and dt.is_float:
        raise KilnError(f"{op} needs integer operands, got {dt}")
    if op == "div" and not dt.is_float:
        raise KilnError(f"true division needs float operands, got {dt}; use // or truncdiv")
    return Expr(op, DType.bool if op in COMPARE else dt, (a, b))


def min_(a, b) -> Expr: return binary("min", a, b)
def max_(a, b) -> Expr: return binary("max", a, b)
def truncdiv(a, b) -> Expr: return binary("truncdiv", a, b)
def truncmod(a, b) -> Expr: return binary("truncmod", a, b)
def logical_not(a) -> Expr: return Expr("not", DType.bool, (as_expr(a),))


def select(cond, a, b) -> Expr:
    cond = as_expr(cond)
    a = as_expr(a, b.dtype if isinstance(b, Expr) else None)
    b = as_expr(b, a.dtype)
    if cond.dtype is not DType.bool or a.dtype is not b.dtype:
        raise KilnError(f"select needs a bool condition and equal branch dtypes, got {cond.dtype}, {a.dtype}, {b.dtype}")
    return Expr("select", a.dtype, (cond, a, b))


def check(value, ok, reported, message: str) -> Expr:
    """`value`, plus a run-time check: where `ok` is false the kernel fails, and the runtime
    raises a KilnError naming the node with `message` (`{value}` in it shows `reported`, an
    integer: the bad index or operand). The check reports, it does not guard: `value` must
    be safe to compute either way (an index already clamped into its axis), so a kernel that
    runs on after a failed check never touches memory out of bounds. The simplifier drops a
    check whose `ok` it proves true (constant or in-range indices cost nothing)."""
    value, ok = as_expr(value), as_expr(ok)
    if ok.dtype is not DType.bool:
        raise KilnError(f"check needs a bool condition, got {ok.dtype}")
    reported = as_expr(reported, INDEX)
    if reported.dtype.is_float:
        raise KilnError(f"check reports an integer, got {reported.dtype}")
    return Expr("check", value.dtype, (value, ok, cast(INDEX, reported)), str(message))


def checks(e: Expr) -> list:
    """The messages of the checks inside `e`, in a fixed order (first appearance)."""
    return list(dict.fromkeys(x.arg for x in walk(e) if x.op == "check"))


def cast(dtype: DType, x) -> Expr:
    x = as_expr(x, dtype)
    return x if x.dtype is dtype else Expr("cast", dtype, (x,))


PREFETCHES = {1: "prefetch", 2: "prefetch_l2"}    # a hint's cache level -> its call's name


def prefetch(load: Expr, level: int = 1) -> Expr:
    """A hint that `load`'s element will be read soon (the C backend's __builtin_prefetch), into
    L1 (`level` 1) or L2 only (2: the element is read later, and L1 keeps what is read now): the
    statement Evaluate(prefetch(buf[i])) reads nothing and writes nothing; an address past the
    buffer is never dereferenced (Stage.prefetch puts these in loop nests)."""
    if not isinstance(load, Expr) or load.op != "load":
        raise KilnError(f"prefetch takes a load of a buffer element, got {load!r}")
    if level not in PREFETCHES:
        raise KilnError(f"prefetch level {level!r}: 1 (L1) or 2 (L2)")
    return Expr("call", load.dtype, (load,), PREFETCHES[level])


def call(name: str, *args) -> Expr:
    """Math intrinsic `name` applied to args (float ops; abs/sign also on ints)."""
    if name not in UNARY_INTRIN | BINARY_INTRIN:
        raise KilnError(f"unknown intrinsic {name!r}")
    want = 2 if name in BINARY_INTRIN else 1
    if len(args) != want:
        raise KilnError(f"intrinsic {name} takes {want} argument(s), got {len(args)}")
    first = as_expr(args[0], DType.float32)
    args = tuple(as_expr(a, first.dtype) for a in args)
    if any(a.dtype is not first.dtype for a in args):
        raise KilnError(f"intrinsic {name}: argument dtypes differ")
    if not first.dtype.is_float and name not in ("abs", "sign"):
        raise KilnError(f"intrinsic {name} needs float arguments, got {first.dtype}")
    dt = DType.bool if name in ("isnan", "isinf") else first.dtype
    return Expr("call", dt, args, name)


def _intrin(name):
    def f(*args):
        return call(name, *args)
    f.__name__ = name
    f.__doc__ = f"intrinsic {name}"
    return f


exp, log, sqrt, rsqrt, tanh, erf, erfc = map(_intrin, ["exp", "log", "sqrt", "rsqrt", "tanh", "erf", "erfc"])
sin, cos, tan, asin, acos, atan = map(_intrin, ["sin", "cos", "tan", "asin", "acos", "atan"])
sinh, cosh, asinh, acosh, atanh = map(_intrin, ["sinh", "cosh", "asinh", "acosh", "atanh"])
pow_, fabs, floor, ceil, round_, sigmoid = map(_intrin, ["pow", "fabs", "floor", "ceil", "round", "sigmoid"])
fmod, isnan, isinf, sign, abs_ = map(_intrin, ["fmod", "isnan", "isinf", "sign", "abs"])


def load(buffer, indices) -> Expr:
    """Read buffer[indices]; indices are cast to int64 so data values can index (gather)."""
    idx = tuple(cast(INDEX, as_expr(i)) for i in indices)
    if len(idx) != len(buffer.shape):
        raise KilnError(f"buffer {buffer.name!r} has rank {len(buffer.shape)}, indexed with {len(idx)} indices")
    return Expr("load", buffer.dtype, idx, buffer)


def reduce(combiner: str, value, axis) -> Expr:
    """A reduction of `value` over reduction variables `axis` (one or a sequence)."""
    if combiner not in REDUCERS:
        raise KilnError(f"unknown reducer {combiner!r}")
    axes = tuple(axis) if isinstance(axis, (list, tuple)) else (axis,)
    axes = tuple(as_expr(a) for a in axes)
    for a in axes:
        if a.op != "var" or a.arg.kind != "reduce":
            raise KilnError(f"reduction axis {a} is not a reduce_axis()")
    value = as_expr(value)
    return Expr("reduce", value.dtype, (value,), (combiner, axes))


def reduce_identity(combiner: str, dtype: DType) -> Expr:
    """The value a reduction starts from (and that masked-out elements contribute)."""
    if combiner in ("sum", "prod"):
        return const(0 if combiner == "sum" else 1, dtype)
    if dtype.is_float:
        return const(-math.inf if combiner == "max" else math.inf, dtype)
    if dtype.np.kind in "iub":
        info = np.iinfo(dtype.np) if dtype.np.kind != "b" else None
        lo, hi = (0, 1) if info is None else (int(info.min), int(info.max))
    else:  # int4, uint2...: NumPy's iinfo does not know them, ml_dtypes' does
        import ml_dtypes
        info = ml_dtypes.iinfo(dtype.np)
        lo, hi = int(info.min), int(info.max)
    return const(lo if combiner == "max" else hi, dtype)


def sum_(value, axis) -> Expr: return reduce("sum", value, axis)
def prod_(value, axis) -> Expr: return reduce("prod", value, axis)
def rmax(value, axis) -> Expr: return reduce("max", value, axis)
def rmin(value, axis) -> Expr: return reduce("min", value, axis)


# -- generic traversal --------------------------------------------------------

def rebuild(e: Expr, args: tuple) -> Expr:
    return e if args == e.args else Expr(e.op, e.dtype, tuple(args), e.arg)


def substitute(e: Expr, mapping: dict, memo: dict | None = None) -> Expr:
    """Replace sub-expressions (usually vars) by mapping[...], simultaneously."""
    memo = {} if memo is None else memo
    if e in mapping:
        return mapping[e]
    if e in memo:
        return memo[e]
    out = rebuild(e, tuple(substitute(a, mapping, memo) for a in e.args))
    memo[e] = out
    return out


def map_loads(e: Expr, fn, memo: dict | None = None) -> Expr:
    """Rewrite every load bottom-up: fn(buffer, new_indices, old_load) -> Expr."""
    memo = {} if memo is None else memo
    if e in memo:
        return memo[e]
    args = tuple(map_loads(a, fn, memo) for a in e.args)
    out = fn(e.arg, args, e) if e.op == "load" else rebuild(e, args)
    memo[e] = out
    return out


def walk(e: Expr, seen: set | None = None):
    """Yield each distinct sub-expression once (post-order)."""
    seen = set() if seen is None else seen
    if e in seen:
        return
    seen.add(e)
    for a in e.args:
        yield from walk(a, seen)
    yield e


def free_vars(e: Expr) -> set:
    return {x for x in walk(e) if x.op == "var"}
