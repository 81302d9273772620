"""Structural equality of loop IR (TVM's `assert_structural_equal`).

Two pieces of IR are equal when they have the same statements and expressions with
the same dtypes, literals, loop kinds, scopes and messages, up to a one-to-one renaming
of variables and buffers: each variable of one side stands for exactly one of the
other, in every place it occurs (so two loops sharing a variable on one side must share
one on the other). Names are display only and are not compared, nor is what a
variable means to a schedule (its domain, spatial or reduce); function names are
compared, as calls refer to them. Each function of a module gets its own renaming.
"""

from __future__ import annotations

from kiln.loops import stmt as S
from kiln.loops.expr import Expr, _key


class _Differ(Exception):
    def __init__(self, path: str, why: str):
        super().__init__(f"at {path}: {why}")


class _Equal:
    def __init__(self):
        self.fwd: dict = {}   # var or buffer of the left -> its counterpart on the right
        self.back: dict = {}
        self.memo: set = set()

    def same(self, a, b, path: str, why: str):
        if a != b:
            raise _Differ(path, f"{why}: {a!r} vs {b!r}")

    def pair(self, a, b, path: str):
        """a and b stand for each other from now on (or already do)."""
        if self.fwd.get(a, b) is not b or self.back.get(b, a) is not a:
            raise _Differ(path, f"{a!r} and {b!r} do not correspond (renaming is not one-to-one)")
        self.fwd[a], self.back[b] = b, a

    def buffer(self, a: S.Buffer, b: S.Buffer, path: str):
        if self.fwd.get(a) is b:
            return
        self.same(a.dtype, b.dtype, path, f"buffer {a.name!r} dtype")
        self.same(a.scope, b.scope, path, f"buffer {a.name!r} scope")
        self.same(len(a.shape), len(b.shape), path, f"buffer {a.name!r} rank")
        for k, (x, y) in enumerate(zip(a.shape, b.shape)):
            self.dim(x, y, f"{path}/{a.name}.shape[{k}]")
        self.pair(a, b, path)

    def dim(self, x, y, path: str):
        if isinstance(x, Expr) and isinstance(y, Expr):
            self.expr(x, y, path)
        else:
            self.same(type(x), type(y), path, "dim kind")
            self.same(x, y, path, "dim")

    def expr(self, a: Expr, b: Expr, path: str):
        if (a, b) in self.memo:
            return
        self.same(a.op, b.op, path, "op")
        self.same(a.dtype, b.dtype, path, f"dtype of {a.op}")
        if a.op == "var":
            self.pair(a, b, path)
        elif a.op == "load":
            self.buffer(a.arg, b.arg, path)
        elif a.op == "reduce":
            self.same(a.arg[0], b.arg[0], path, "reducer")
            self.same(len(a.arg[1]), len(b.arg[1]), path, "reduction axes")
            for x, y in zip(a.arg[1], b.arg[1]):
                self.expr(x, y, path + "/axis")
        else:
            self.same(_key(a.arg), _key(b.arg), path, f"{a.op} attribute")
        self.same(len(a.args), len(b.args), path, f"operands of {a.op}")
        for k, (x, y) in enumerate(zip(a.args, b.args)):
            self.expr(x, y, f"{path}/{a.op}[{k}]")
        self.memo.add((a, b))

    def stmt(self, a, b, path: str):
        self.same(type(a).__name__, type(b).__name__, path, "statement")
        path = f"{path}/{type(a).__name__}"
        if isinstance(a, S.Seq):
            self.same(len(a.stmts), len(b.stmts), path, "statement count")
            for k, (x, y) in enumerate(zip(a.stmts, b.stmts)):
                self.stmt(x, y, f"{path}[{k}]")
        elif isinstance(a, S.For):
            self.same(a.kind, b.kind, path, "loop kind")
            self.expr(a.var, b.var, path + ".var")
            self.expr(a.min, b.min, path + ".min")
            self.expr(a.extent, b.extent, path + ".extent")
            self.stmt(a.body, b.body, path)
        elif isinstance(a, S.Store):
            self.buffer(a.buffer, b.buffer, path)
            self.same(len(a.indices), len(b.indices), path, "store rank")
            for k, (x, y) in enumerate(zip(a.indices, b.indices)):
                self.expr(x, y, f"{path}.index[{k}]")
            self.expr(a.value, b.value, path + ".value")
        elif isinstance(a, S.Allocate):
            self.same(a.scope, b.scope, path, "allocation scope")
            self.buffer(a.buffer, b.buffer, path)
            self.stmt(a.body, b.body, path)
        elif isinstance(a, S.IfThenElse):
            self.expr(a.cond, b.cond, path + ".cond")
            self.stmt(a.then, b.then, path + ".then")
            self.same(a.else_ is None, b.else_ is None, path, "has an else branch")
            if a.else_ is not None:
                self.stmt(a.else_, b.else_, path + ".else")
        elif isinstance(a, S.Let):
            self.expr(a.var, b.var, path + ".var")
            self.expr(a.value, b.value, path + ".value")
            self.stmt(a.body, b.body, path)
        elif isinstance(a, S.Evaluate):
            self.expr(a.expr, b.expr, path)
        elif isinstance(a, S.Call):
            self.same(a.func, b.func, path, "callee")
            self.same(len(a.args), len(b.args), path, "argument count")
            for x, y in zip(a.args, b.args):
                self.same(type(x), type(y), path, "argument kind")
                if isinstance(x, S.View):
                    self.same(x.byte_offset, y.byte_offset, path, "view offset")
                    x, y = x.buffer, y.buffer
                self.buffer(x, y, path)
        else:
            raise _Differ(path, f"unknown statement type {type(a).__name__}")

    def func(self, a, b, path: str):
        self.same(type(a).__name__, type(b).__name__, path, "function kind")
        self.same(a.name, b.name, path, "function name")
        path = f"{path}/{a.name}"
        self.same(len(a.params), len(b.params), path, "parameter count")
        for x, y in zip(a.params, b.params):
            self.buffer(x, y, path + "/params")
        if isinstance(a, S.PrimFunc):
            self.same(a.noalias, b.noalias, path, "noalias")
            self.stmt(a.body, b.body, path)
        else:
            for f in ("c_body", "dynamic", "preamble", "libs", "errors"):
                self.same(getattr(a, f), getattr(b, f), path, f)


def _compare(a, b) -> None:
    if isinstance(a, S.LoopModule) and isinstance(b, S.LoopModule):
        _Equal().same((a.entry, a.interface), (b.entry, b.interface), "module", "entry, interface")
        _Equal().same(len(a.funcs), len(b.funcs), "module", "function count")
        for x, y in zip(a.funcs, b.funcs):
            _Equal().func(x, y, "module")
    elif isinstance(a, (S.PrimFunc, S.ExternFunc)):
        _Equal().func(a, b, "")
    elif isinstance(a, Expr) and isinstance(b, Expr):
        _Equal().expr(a, b, "")
    elif isinstance(a, S.Stmt) and isinstance(b, S.Stmt):
        _Equal().stmt(a, b, "")
    else:
        raise _Differ("", f"cannot compare {type(a).__name__} with {type(b).__name__}")


def structural_equal(a, b) -> bool:
    """True when `a` and `b` (modules, functions, statements or expressions) are the same IR."""
    try:
        _compare(a, b)
    except _Differ:
        return False
    return True


def assert_structural_equal(a, b) -> None:
    """Raise AssertionError saying where `a` and `b` first differ."""
    try:
        _compare(a, b)
    except _Differ as e:
        raise AssertionError(f"loop IR differs {e}\n--- left:\n{a}\n--- right:\n{b}") from None
