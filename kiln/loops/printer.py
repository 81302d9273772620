"""Prints the loop IR as C-like pseudocode (`str(func)`), for humans and golden tests.

Distinct variables or buffers that share a name get a `_1`, `_2` suffix so the
printed text is unambiguous.
"""

from __future__ import annotations

from kiln.loops import stmt as S
from kiln.loops.expr import BINARY, Expr


class Namer:
    """Stable, unique display names for vars and buffers."""

    def __init__(self):
        self.names: dict = {}
        self.used: set = set()

    def __call__(self, obj, base: str) -> str:
        if obj not in self.names:
            name, k = base, 0
            while name in self.used:
                k += 1
                name = f"{base}_{k}"
            self.used.add(name)
            self.names[obj] = name
        return self.names[obj]


def _const(e: Expr) -> str:
    if e.dtype.name == "bool":
        return "true" if e.arg else "false"
    if e.dtype.is_float:
        return f"{e.arg!r}f" if e.dtype.name == "float32" else f"{e.arg!r}" if e.dtype.name == "float64" \
            else f"{e.dtype}({e.arg!r})"
    return str(e.arg) if e.dtype.name == "int64" else f"{e.dtype}({e.arg})"


def expr_str(e: Expr, namer: Namer | None = None) -> str:
    n = namer or Namer()

    def go(e: Expr, top=False) -> str:
        op = e.op
        if op == "var":
            return n(e, e.arg.name)
        if op == "const":
            return _const(e)
        if op == "load":
            return f"{n(e.arg, e.arg.name)}[{', '.join(go(i, True) for i in e.args)}]"
        if op in ("min", "max"):
            return f"{op}({go(e.args[0], True)}, {go(e.args[1], True)})"
        if op in BINARY:
            s = f"{go(e.args[0])} {BINARY[op]} {go(e.args[1])}"
            if op in ("truncdiv", "truncmod"):
                s = f"{op}({go(e.args[0], True)}, {go(e.args[1], True)})"
                return s
            return s if top else f"({s})"
        if op == "not":
            return f"!{go(e.args[0])}"
        if op == "cast":
            return f"{e.dtype}({go(e.args[0], True)})"
        if op == "call":
            return f"{e.arg}({', '.join(go(a, True) for a in e.args)})"
        if op == "select":
            return f"select({', '.join(go(a, True) for a in e.args)})"
        if op == "check":
            v, ok, rep = (go(a, True) for a in e.args)
            return f"check({v}, {ok}, {rep}, {e.arg!r})"
        if op == "reduce":
            comb, axes = e.arg
            return f"{comb}({go(e.args[0], True)}, axis=[{', '.join(go(a, True) for a in axes)}])"
        return f"{op}<{e.arg}>({', '.join(go(a, True) for a in e.args)})"

    return go(e, True)


def stmt_str(s: S.Stmt, namer: Namer | None = None, indent: int = 0) -> str:
    n = namer or Namer()
    lines: list[str] = []

    def ex(e):
        return expr_str(e, n)

    def go(s, d):
        pad = "  " * d
        if isinstance(s, S.For):
            v = ex(s.var)
            kind = "" if s.kind == "serial" else s.kind + " "
            zero = s.min.op == "const" and s.min.arg == 0
            end = ex(s.extent) if zero else ex(s.min + s.extent)
            lines.append(f"{pad}{kind}for ({v} = {ex(s.min)}; {v} < {end}; ++{v}) {{")
            go(s.body, d + 1)
            lines.append(pad + "}")
        elif isinstance(s, S.Store):
            lines.append(f"{pad}{n(s.buffer, s.buffer.name)}[{', '.join(map(ex, s.indices))}] = {ex(s.value)};")
        elif isinstance(s, S.Seq):
            for t in s.stmts:
                go(t, d)
        elif isinstance(s, S.IfThenElse):
            lines.append(f"{pad}if ({ex(s.cond)}) {{")
            go(s.then, d + 1)
            if s.else_ is not None:
                lines.append(pad + "} else {")
                go(s.else_, d + 1)
            lines.append(pad + "}")
        elif isinstance(s, S.Allocate):
            b = s.buffer
            lines.append(f"{pad}allocate {b.dtype} {n(b, b.name)}[{', '.join(map(str, b.shape))}] ({s.scope}) {{")
            go(s.body, d + 1)
            lines.append(pad + "}")
        elif isinstance(s, S.Let):
            lines.append(f"{pad}let {ex(s.var)} = {ex(s.value)};")
            go(s.body, d)
        elif isinstance(s, S.Evaluate):
            lines.append(f"{pad}{ex(s.expr)};")
        elif isinstance(s, S.Call):
            args = [f"{n(a.buffer, a.buffer.name)} + {a.byte_offset}B" if isinstance(a, S.View)
                    else n(a, a.name) for a in s.args]
            lines.append(f"{pad}call {s.func}({', '.join(args)});")
        else:
            lines.append(f"{pad}<{type(s).__name__}>")

    go(s, indent)
    return "\n".join(lines)


def func_str(f: S.PrimFunc) -> str:
    n = Namer()
    params = ", ".join(f"{b.dtype} {n(b, b.name)}[{', '.join(map(str, b.shape))}]" for b in f.params)
    return f"func {f.name}({params}) {{\n{stmt_str(f.body, n, 1)}\n}}"
