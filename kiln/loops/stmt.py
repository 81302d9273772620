"""Loop-nest statements, buffers, functions and modules of the loop IR.

Statements are frozen dataclasses (structural equality via dataclass eq; the Exprs
inside are hash-consed so comparing them is identity). Buffers are identified by
object, not by name: two buffers named "A" are different buffers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

from kiln.dtypes import DType
from kiln.errors import KilnError
from kiln.loops.expr import Expr, checks, ir_text, load

LOOP_KINDS = ("serial", "parallel", "vectorized", "unrolled")


@dataclass(frozen=True, eq=False)
class Buffer:
    """A dense row-major array. `scope`: "global" (a parameter or heap temp) or "local"."""
    name: str
    dtype: DType
    shape: tuple
    scope: str = "global"

    def __post_init__(self):
        # a dim is an int or a symbolic size Expr (kiln.loops.symbols)
        object.__setattr__(self, "shape", tuple(int(s) if not isinstance(s, Expr) else
                                                int(s.arg) if s.op == "const" else s for s in self.shape))

    def __getitem__(self, idx) -> Expr:
        return load(self, idx if isinstance(idx, tuple) else (idx,))

    def __repr__(self):
        return f"Buffer({self.name}, {self.dtype}, {list(self.shape)})"

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def strides(self) -> tuple[int, ...]:
        """Row-major element strides."""
        out, acc = [], 1
        for s in reversed(self.shape):
            out.append(acc)
            acc *= s
        return tuple(reversed(out))


class Stmt:
    """Base class of statements (for isinstance checks and printing)."""

    def __str__(self):
        return ir_text(self)


@dataclass(frozen=True, repr=False)
class For(Stmt):
    var: Expr
    min: Expr
    extent: Expr
    kind: str
    body: Stmt

    def __post_init__(self):
        if self.kind not in LOOP_KINDS:
            raise KilnError(f"unknown loop kind {self.kind!r}")


@dataclass(frozen=True, repr=False)
class Store(Stmt):
    buffer: Buffer
    indices: tuple
    value: Expr


@dataclass(frozen=True, repr=False)
class Allocate(Stmt):
    """`buffer` exists inside `body`. scope "stack" | "heap" | "auto" (stack when small)."""
    buffer: Buffer
    body: Stmt
    scope: str = "auto"


@dataclass(frozen=True, repr=False)
class Seq(Stmt):
    stmts: tuple


@dataclass(frozen=True, repr=False)
class IfThenElse(Stmt):
    cond: Expr
    then: Stmt
    else_: Stmt | None = None


@dataclass(frozen=True, repr=False)
class Let(Stmt):
    var: Expr
    value: Expr
    body: Stmt


@dataclass(frozen=True, repr=False)
class Evaluate(Stmt):
    expr: Expr


@dataclass(frozen=True)
class View:
    """A typed window into `buffer` (usually an arena) starting `byte_offset` bytes in."""
    buffer: Buffer
    byte_offset: int


@dataclass(frozen=True, repr=False)
class Call(Stmt):
    """Call kernel `func` (a PrimFunc name in the same module) with buffers or Views."""
    func: str
    args: tuple


def seq(*stmts) -> Stmt:
    """Flatten nested Seqs and drop Nones; a single statement is returned as is."""
    flat = []
    for s in stmts:
        if s is None:
            continue
        flat.extend(s.stmts if isinstance(s, Seq) else [s])
    return flat[0] if len(flat) == 1 else Seq(tuple(flat))


def walk_stmts(s: Stmt):
    """`s` and every statement inside it, parents before children, in program order."""
    yield s
    for k in list(getattr(s, "stmts", ())) + [getattr(s, f, None) for f in ("body", "then", "else_")]:
        if isinstance(k, Stmt):
            yield from walk_stmts(k)


def written_buffers(s: Stmt) -> set:
    """Buffers `s` stores to or passes to a call (which may write them)."""
    out: set = set()
    for t in walk_stmts(s):
        if isinstance(t, Store):
            out.add(t.buffer)
        elif isinstance(t, Call):
            out.update(a.buffer if isinstance(a, View) else a for a in t.args)
    return out


def stmt_checks(s: Stmt) -> list:
    """The messages of every `check` in `s`, in a fixed order: check k (0-based) fails
    its kernel with status k + 1."""
    out: dict = {}
    for t in walk_stmts(s):
        exprs = [getattr(t, f, None) for f in ("min", "extent", "cond", "value", "expr")]
        for e in [*exprs, *getattr(t, "indices", ())]:
            if isinstance(e, Expr):
                out.update(dict.fromkeys(checks(e)))
    return list(out)


@dataclass(frozen=True, repr=False)
class PrimFunc:
    """A kernel: params are buffers passed by pointer; `noalias` lets codegen use restrict."""
    name: str
    params: tuple
    body: Stmt
    noalias: bool = True

    @property
    def errors(self) -> tuple:
        """(status, message) of each run-time check in the body (see `expr.check`)."""
        return tuple((k + 1, m) for k, m in enumerate(stmt_checks(self.body)))

    def __str__(self):
        return ir_text(self)


@dataclass(frozen=True, repr=False)
class ExternFunc:
    """A kernel written by hand in C (for ops unnatural as computes): `c_body` is the
    function body; its params are named in0.., out0.. as the lowering that wrote it used."""
    name: str
    params: tuple
    c_body: str
    dynamic: bool = False  # last param receives the outputs' actual dims (see LowerCtx.extern)
    preamble: str = ""     # file-scope C the body needs (#include lines, static helpers)
    libs: tuple = ()       # C libraries it links: (name for -l, header, package that provides them)
    errors: tuple = ()     # (status, what it means) for the body's non-zero returns; a body
    #                        reporting a bad value uses KILN_FAIL(status, value) ({value} in the text)

    def __str__(self):
        return ir_text(self)


@dataclass
class LoopModule:
    """The unit of code generation: kernels plus (optionally) the name of an entry function
    and an interface: a static text (JSON of the entry's input/output dtypes and shapes,
    workspace and weights sizes) the library reports through `interface()`, so a loader
    can refuse a manifest that disagrees with the code before the first call."""
    funcs: list = field(default_factory=list)
    entry: str | None = None
    interface: str = ""

    def __post_init__(self):
        names = [f.name for f in self.funcs]
        if len(set(names)) != len(names):
            raise KilnError(f"duplicate function names in LoopModule: {names}")

    def __getitem__(self, name: str) -> PrimFunc:
        for f in self.funcs:
            if f.name == name:
                return f
        raise KilnError(f"no function {name!r} in module")

    def __str__(self):
        return ir_text(self)
