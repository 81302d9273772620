"""Hoisting run-time checks out of the loops they do not depend on.

A `check` (kiln.loops.expr.check) on an index read once per row, e.g. a Gather's index,
lands in the innermost loop of the row copy: the branch and the failure path stop that
loop from vectorizing (an embedding Gather ran 15x slower). Each check whose operands
are the same on every iteration of a loop moves into a `Let` just before the loop.

Only checks every iteration evaluates move: not from an `if` branch, a `select` branch,
the right of `&&`/`||`, or a loop that may run zero times. A check never moves past a
store to a buffer it reads, nor past the binding of a variable it uses.
"""

from __future__ import annotations

from kiln.loops import stmt as S
from kiln.loops.expr import Expr, free_vars, var, walk
from kiln.loops.simplify import substitute_stmt


def hoist_checks(s: S.Stmt) -> S.Stmt:
    """`s` with loop-invariant checks computed once before their loop."""
    if isinstance(s, S.For):
        body = hoist_checks(s.body)
        bound, written = _bound_and_written(body)
        bound.add(s.var)
        moved = [e for e in _evaluated_checks(body)
                 if not (free_vars(e) & bound) and not (_loaded(e) & written)]
        # outermost first: a check inside another check's operands goes with it
        moved = [e for e in moved if not any(e is not o and e in set(walk(o)) for o in moved)]
        if not moved:
            return S.For(s.var, s.min, s.extent, s.kind, body)
        names = {e: var("chk", e.dtype) for e in moved}
        out: S.Stmt = S.For(s.var, s.min, s.extent, s.kind, substitute_stmt(body, names))
        for e in reversed(moved):
            out = S.Let(names[e], e, out)
        return out
    if isinstance(s, S.Seq):
        return S.Seq(tuple(hoist_checks(t) for t in s.stmts))
    if isinstance(s, S.IfThenElse):
        return S.IfThenElse(s.cond, hoist_checks(s.then), None if s.else_ is None else hoist_checks(s.else_))
    if isinstance(s, S.Allocate):
        return S.Allocate(s.buffer, hoist_checks(s.body), s.scope)
    if isinstance(s, S.Let):
        return S.Let(s.var, s.value, hoist_checks(s.body))
    return s


def _evaluated_checks(s: S.Stmt) -> list:
    """The checks each execution of `s` evaluates, in order of first appearance."""
    out: dict = {}

    def expr(e: Expr):
        if e.op == "check":
            out.setdefault(e, None)
        if e.op == "select":
            expr(e.args[0])   # only one branch runs
        elif e.op in ("and", "or"):
            expr(e.args[0])   # C short-circuits the right operand
        else:
            for a in e.args:
                expr(a)

    def stmt(s):
        if isinstance(s, S.Store):
            for e in (*s.indices, s.value):
                expr(e)
        elif isinstance(s, S.Evaluate):
            expr(s.expr)
        elif isinstance(s, S.Let):
            expr(s.value)
            stmt(s.body)
        elif isinstance(s, S.Seq):
            for t in s.stmts:
                stmt(t)
        elif isinstance(s, S.For):
            expr(s.min)
            expr(s.extent)
            if s.extent.op == "const" and s.extent.arg > 0:
                stmt(s.body)
        elif isinstance(s, S.Allocate):
            stmt(s.body)
        elif isinstance(s, S.IfThenElse):
            expr(s.cond)

    stmt(s)
    return list(out)


def _bound_and_written(s: S.Stmt) -> tuple[set, set]:
    """Variables bound inside `s` (loop and let variables) and buffers it writes or allocates."""
    inside = list(S.walk_stmts(s))
    bound = {t.var for t in inside if isinstance(t, (S.For, S.Let))}
    return bound, S.written_buffers(s) | {t.buffer for t in inside if isinstance(t, S.Allocate)}


def _loaded(e: Expr) -> set:
    return {x.arg for x in walk(e) if x.op == "load"}

