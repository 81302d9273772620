"""Prints the loop IR as C-like pseudocode (`str(func)`), for humans, golden tests and
`kiln.loops.parse`, which reads it back to the same IR (structurally equal:
`kiln.loops.structural`).

    func scale(float32 A[8, 16], int32 S[8], float32 C[8, 16]) {
      parallel for (i = 0; i < 8; ++i) {
        vectorized for (j = 0; j < 16; ++j) {
          C[i, j] = select(A[i, j] > 0.0f, A[i, j] * float32(S[i]), 0.0f);
        }
      }
    }

The text says everything the IR holds: literals carry their dtype when it is not the
default one (`3` int64, `1.5f` float32, `1.5` float64, `int32(3)`, `float16(1.5)`), casts
are `float32(x)` (`cast<int32>(3)` when the operand is a literal, `cast<float8e4m3fn, sat>(x)`
with a conversion mode), a loop variable or `let` that is not typed like its value says so
(`for (int32 i = 0; ...)`, `let int32 x = ...;`), a buffer that is not "global" says its
scope, and extern kernels print their C body, preamble and metadata. Nested binary
operations are fully parenthesized. Distinct variables or buffers that share a name get a
`_1`, `_2` suffix so the printed text is unambiguous; a name that is not an identifier (or
is a keyword) is printed as a JSON string.

Blocks: the statements of a loop/if/allocate body are one statement or a `Seq`; a `let`
without braces scopes over the rest of its block; a bare `{ ... }` is always a `Seq`
(nested or shorter than two), and `let x = v { ... }` is a `let` followed by more
statements of its block. What a variable is at the schedule level (its domain, spatial or
reduce) is not part of the loop IR text.
"""

from __future__ import annotations

import json
import re

from kiln.dtypes import DType
from kiln.loops import stmt as S
from kiln.loops.expr import BINARY, INDEX, Expr, register_printer

IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\Z")
# words that start a statement or are literals: a name spelled like one is printed quoted
KEYWORDS = frozenset({"for", "parallel", "vectorized", "unrolled", "serial", "if", "else", "allocate", "let",
                      "call", "func", "extern", "entry", "interface", "true", "false", "inf", "inff", "nan",
                      "nanf", "cast", "axis"}) | {d.name for d in DType}
DEFAULT_BUFFER_SCOPE = "global"


def name_str(name: str) -> str:
    """A name as the parser reads it back: bare when an identifier, else a JSON string."""
    return name if IDENT.match(name) and name not in KEYWORDS else json.dumps(name)


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
            self.names[obj] = name_str(name)
        return self.names[obj]


def float_literal(v: float) -> str:
    return repr(float(v))


def _const(e: Expr) -> str:
    dt = e.dtype
    if dt is DType.bool:
        return "true" if e.arg else "false"
    if dt.is_float:
        return f"{float_literal(e.arg)}f" if dt is DType.float32 else float_literal(e.arg) \
            if dt is DType.float64 else f"{dt.name}({float_literal(e.arg)})"
    return str(e.arg) if dt is INDEX else f"{dt.name}({e.arg})"


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
        if op in ("min", "max", "truncdiv", "truncmod"):
            return f"{op}({go(e.args[0], True)}, {go(e.args[1], True)})"
        if op in BINARY:
            s = f"{go(e.args[0])} {BINARY[op]} {go(e.args[1])}"
            return s if top else f"({s})"
        if op == "not":
            return f"!{go(e.args[0])}"
        if op == "cast":
            a = e.args[0]
            if e.arg is not None:
                return f"cast<{e.dtype.name}, {e.arg}>({go(a, True)})"
            if a.op == "const":
                return f"cast<{e.dtype.name}>({go(a, True)})"
            return f"{e.dtype.name}({go(a, True)})"
        if op == "call":
            return f"{e.arg}({', '.join(go(a, True) for a in e.args)})"
        if op == "select":
            return f"select({', '.join(go(a, True) for a in e.args)})"
        if op == "check":
            v, ok, rep = (go(a, True) for a in e.args)
            return f"check({v}, {ok}, {rep}, {json.dumps(e.arg)})"
        if op == "reduce":
            comb, axes = e.arg
            return f"{comb}({go(e.args[0], True)}, axis=[{', '.join(go(a, True) for a in axes)}])"
        return f"{op}<{e.arg}>({', '.join(go(a, True) for a in e.args)})"

    return go(e, True)


def _dims(shape, ex) -> str:
    return ", ".join(ex(s) if isinstance(s, Expr) else str(s) for s in shape)


def buffer_decl(b: S.Buffer, n: Namer) -> str:
    """`dtype name[dims][ scope]`, as params and allocations declare a buffer."""
    scope = "" if b.scope == DEFAULT_BUFFER_SCOPE else f" {name_str(b.scope)}"
    return f"{b.dtype.name} {n(b, b.name)}[{_dims(b.shape, lambda e: expr_str(e, n))}]{scope}"


def stmt_str(s: S.Stmt, namer: Namer | None = None, indent: int = 0) -> str:
    n = namer or Namer()
    lines: list[str] = []

    def ex(e):
        return expr_str(e, n)

    def typed(v: Expr, like: DType) -> str:
        return ex(v) if v.dtype is like else f"{v.dtype.name} {ex(v)}"

    def block(s, d):
        """A body: one statement, or the statements of a Seq of two or more."""
        if isinstance(s, S.Seq) and len(s.stmts) >= 2:
            for k, t in enumerate(s.stmts):
                item(t, d, last=k == len(s.stmts) - 1)
        elif isinstance(s, S.Seq) and not s.stmts:
            pass
        else:
            item(s, d, last=True)

    def item(s, d, last):
        pad = "  " * d
        if isinstance(s, S.Seq):
            lines.append(pad + "{")
            for k, t in enumerate(s.stmts):
                item(t, d + 1, last=k == len(s.stmts) - 1)
            lines.append(pad + "}")
        elif isinstance(s, S.Let):
            head = f"{pad}let {typed(s.var, s.value.dtype)} = {ex(s.value)}"
            if last:
                lines.append(head + ";")
                block(s.body, d)
            else:
                lines.append(head + " {")
                block(s.body, d + 1)
                lines.append(pad + "}")
        elif isinstance(s, S.For):
            v = ex(s.var)
            kind = "" if s.kind == "serial" else s.kind + " "
            zero = s.min.op == "const" and s.min.arg == 0
            end = ex(s.extent) if zero else ex(s.min + s.extent)
            lines.append(f"{pad}{kind}for ({typed(s.var, INDEX)} = {ex(s.min)}; {v} < {end}; ++{v}) {{")
            block(s.body, d + 1)
            lines.append(pad + "}")
        elif isinstance(s, S.Store):
            lines.append(f"{pad}{n(s.buffer, s.buffer.name)}[{', '.join(map(ex, s.indices))}] = {ex(s.value)};")
        elif isinstance(s, S.IfThenElse):
            lines.append(f"{pad}if ({ex(s.cond)}) {{")
            block(s.then, d + 1)
            if s.else_ is not None:
                lines.append(pad + "} else {")
                block(s.else_, d + 1)
            lines.append(pad + "}")
        elif isinstance(s, S.Allocate):
            lines.append(f"{pad}allocate {buffer_decl(s.buffer, n)} ({name_str(s.scope)}) {{")
            block(s.body, d + 1)
            lines.append(pad + "}")
        elif isinstance(s, S.Evaluate):
            lines.append(f"{pad}{ex(s.expr)};")
        elif isinstance(s, S.Call):
            args = [f"{n(a.buffer, a.buffer.name)} + {a.byte_offset}B" if isinstance(a, S.View)
                    else n(a, a.name) for a in s.args]
            lines.append(f"{pad}call {name_str(s.func)}({', '.join(args)});")
        else:
            lines.append(f"{pad}<{type(s).__name__}>")

    block(s, indent)
    return "\n".join(lines)


def func_str(f: S.PrimFunc) -> str:
    n = Namer()
    params = ", ".join(buffer_decl(b, n) for b in f.params)
    alias = "" if f.noalias else " may_alias"
    body = stmt_str(f.body, n, 1)
    return f"func {name_str(f.name)}({params}){alias} {{\n" + (body + "\n" if body else "") + "}"


def raw_block(text: str) -> str:
    """Verbatim text (C source) indented two spaces a line, so a line `}` ends it."""
    return "\n".join("  " + line if line else "" for line in text.split("\n"))


def extern_str(f: S.ExternFunc) -> str:
    n = Namer()
    params = ", ".join(buffer_decl(b, n) for b in f.params)
    attrs = "".join([" dynamic" if f.dynamic else "",
                     f" libs={json.dumps([list(x) for x in f.libs])}" if f.libs else "",
                     f" errors={json.dumps([list(x) for x in f.errors])}" if f.errors else ""])
    out = f"extern func {name_str(f.name)}({params}){attrs} {{\n{raw_block(f.c_body)}\n}}"
    if f.preamble:
        out += f" preamble {{\n{raw_block(f.preamble)}\n}}"
    return out


def module_str(m: S.LoopModule) -> str:
    head = ([f"entry {name_str(m.entry)}"] if m.entry is not None else []) + \
        ([f"interface {json.dumps(m.interface)}"] if m.interface else [])
    return "\n\n".join(["\n".join(head)] * bool(head) + [str(f) for f in m.funcs])


def text(ir) -> str:
    """Any loop IR object as text: what str() of it returns (registered below)."""
    if isinstance(ir, Expr):
        return expr_str(ir)
    if isinstance(ir, S.PrimFunc):
        return func_str(ir)
    if isinstance(ir, S.ExternFunc):
        return extern_str(ir)
    if isinstance(ir, S.LoopModule):
        return module_str(ir)
    return stmt_str(ir)


register_printer(text)   # str() of loop IR (the IR does not import its printer)
