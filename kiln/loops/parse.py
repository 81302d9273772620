"""Reads the loop IR's pseudocode (what `kiln.loops.printer` prints) back into the IR.

    parse_module(str(module))   # LoopModule: funcs, externs, entry, interface
    parse_func(str(func))       # one PrimFunc (or ExternFunc)
    parse_stmt(text, env)       # a statement; env names its free vars and buffers
    parse_expr(text, env)       # an expression

The result is structurally equal to what was printed (`kiln.loops.structural`): same
statements, same hash-consed expressions up to a renaming of variables and buffers,
and a name that appears twice in one function is the same object, as the printer
names one object one way. Hand-written text parses too (before/after tests of schedule
primitives): binary operators have C's precedence, so parentheses are optional.
Names a function's parameters use in their shapes and nothing binds (`float32 A[n, 4]`)
are symbolic int64 dims. A mistake is a KilnError with line:column and what was expected.
A small recursive-descent parser over a regex lexer, nothing more.
"""

from __future__ import annotations

import json
import re

from kiln.dtypes import DType
from kiln.errors import KilnError
from kiln.loops import stmt as S
from kiln.loops.expr import (BINARY_INTRIN, INDEX, PREFETCHES, REDUCERS, UNARY_INTRIN, Expr, binary, call, const, prefetch, select,
                             var)

_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<float>(?:\d+\.\d*(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+)f?)
  | (?P<int>\d+)
  | (?P<name>[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<str>"(?:[^"\\\n]|\\.)*")
  | (?P<op>//|<<|>>|<=|>=|==|!=|&&|\|\||\+\+|[-+*/%<>!&|^()\[\]{},;=:])
""", re.VERBOSE)

# binary operator -> (precedence, op); higher binds tighter (C's order)
_BINOPS = {"||": (1, "or"), "&&": (2, "and"), "|": (3, "bitor"), "^": (4, "bitxor"), "&": (5, "bitand"),
           "==": (6, "eq"), "!=": (6, "ne"), "<": (7, "lt"), "<=": (7, "le"), ">": (7, "gt"), ">=": (7, "ge"),
           "<<": (8, "shl"), ">>": (8, "shr"), "+": (9, "add"), "-": (9, "sub"),
           "*": (10, "mul"), "/": (10, "div"), "//": (10, "floordiv"), "%": (10, "floormod")}
_FLOAT_WORDS = {"inf": DType.float64, "nan": DType.float64, "inff": DType.float32, "nanf": DType.float32}
_LOOP_KINDS = {"parallel", "vectorized", "unrolled", "serial"}
_DTYPES = {d.name: d for d in DType}


class _Tok:
    __slots__ = ("kind", "text", "pos", "end")

    def __init__(self, kind, text, pos, end):
        self.kind, self.text, self.pos, self.end = kind, text, pos, end

    def __repr__(self):
        return "end of text" if self.kind == "eof" else repr(self.text)


class _Parser:
    def __init__(self, text: str, env: dict | None = None):
        self.text = text
        self.pos = 0
        self._peek: _Tok | None = None
        self.env = dict(env or {})
        self.scopes: list[dict] = [dict(self.env)]
        self.objects: dict = dict(env or {})   # name -> the one var/buffer it names in this function
        self.free_dims = False                 # unknown names in a param's shape declare int64 vars

    # -- lexing ----------------------------------------------------------------------
    def where(self, pos: int) -> str:
        line = self.text.count("\n", 0, pos) + 1
        col = pos - (self.text.rfind("\n", 0, pos) + 1) + 1
        return f"{line}:{col}"

    def error(self, msg: str, tok: _Tok | None = None):
        tok = tok or self.peek()
        return KilnError(f"loop IR text {self.where(tok.pos)}: {msg}", stage="parse")

    def peek(self) -> _Tok:
        if self._peek is None:
            pos = self.pos
            while True:
                if pos >= len(self.text):
                    self._peek = _Tok("eof", "", pos, pos)
                    break
                m = _TOKEN.match(self.text, pos)
                if not m:
                    raise KilnError(f"loop IR text {self.where(pos)}: unexpected character {self.text[pos]!r}",
                                    stage="parse")
                if m.lastgroup != "ws":
                    self._peek = _Tok(m.lastgroup, m.group(), pos, m.end())
                    break
                pos = m.end()
        return self._peek

    def next(self) -> _Tok:
        t = self.peek()
        self.pos, self._peek = t.end, None
        return t

    def seek(self, pos: int) -> None:
        self.pos, self._peek = pos, None

    def at(self, *texts) -> bool:
        t = self.peek()
        return t.kind in ("op", "name") and t.text in texts

    def accept(self, text: str) -> bool:
        if self.at(text):
            self.next()
            return True
        return False

    def expect(self, text: str, what: str = "") -> _Tok:
        if not self.at(text):
            raise self.error(f"expected {text!r}{what}, found {self.peek()!r}")
        return self.next()

    def name(self, what: str = "a name") -> str:
        t = self.peek()
        if t.kind == "name":
            return self.next().text
        if t.kind == "str":
            return json.loads(self.next().text)
        raise self.error(f"expected {what}, found {t!r}")

    def dtype(self) -> DType:
        t = self.peek()
        if t.kind != "name" or t.text not in _DTYPES:
            raise self.error(f"expected a dtype ({', '.join(_DTYPES)}), found {t!r}")
        return _DTYPES[self.next().text]

    def json_value(self):
        """A JSON value straight from the text (extern metadata)."""
        pos = self.peek().pos
        try:
            value, end = json.JSONDecoder().raw_decode(self.text, pos)
        except ValueError as e:
            raise KilnError(f"loop IR text {self.where(pos)}: expected a JSON value ({e.msg})", stage="parse") from None
        self.seek(end)
        return value

    def raw_block(self) -> str:
        """After `{` ending a line: verbatim lines, each indented two spaces, up to a line `}`."""
        brace = self.expect("{")
        nl = self.text.find("\n", brace.end)
        if nl < 0 or self.text[brace.end:nl].strip():
            raise self.error("expected a line break after '{' (a verbatim C block starts on the next line)")
        lines, pos = [], nl + 1
        while True:
            if pos > len(self.text):
                raise KilnError(f"loop IR text {self.where(brace.pos)}: verbatim block not closed by a line '}}'",
                                stage="parse")
            end = self.text.find("\n", pos)
            end = len(self.text) if end < 0 else end
            line = self.text[pos:end]
            if line.startswith("}"):
                self.seek(pos)
                self.expect("}")
                return "\n".join(lines)
            if line and not line.startswith("  "):
                raise KilnError(f"loop IR text {self.where(pos)}: a verbatim line is indented two spaces",
                                stage="parse")
            lines.append(line[2:])
            pos = end + 1

    # -- names and scopes --------------------------------------------------------------
    def lookup(self, name: str, tok: _Tok, want):
        for scope in reversed(self.scopes):
            if name in scope:
                obj = scope[name]
                break
        else:
            if self.free_dims and want is Expr:
                obj = self.bind(name, DType.int64, tok)
                self.scopes[0][name] = obj
                return obj
            raise self.error(f"unknown name {name!r}", tok)
        if not isinstance(obj, want):
            kind = "a buffer" if want is S.Buffer else "a variable"
            raise self.error(f"{name!r} is not {kind}", tok)
        return obj

    def bind(self, name: str, dtype: DType, tok: _Tok) -> Expr:
        """The variable `name` names in this function (one object per name)."""
        v = self.objects.get(name)
        if v is None:
            v = self.objects[name] = var(name, dtype)
        elif not isinstance(v, Expr) or v.dtype is not dtype:
            raise self.error(f"{name!r} already names {v!r}; cannot bind it as a {dtype.name} variable", tok)
        return v

    def buffer(self, name: str, dtype: DType, shape: tuple, scope: str, tok: _Tok) -> S.Buffer:
        b = self.objects.get(name)
        if b is None:
            b = self.objects[name] = S.Buffer(name, dtype, shape, scope)
        elif not isinstance(b, S.Buffer) or b.dtype is not dtype or b.scope != scope or \
                len(b.shape) != len(shape) or any(x is not y and x != y for x, y in zip(b.shape, shape)):
            raise self.error(f"{name!r} is declared twice, differently", tok)
        return b

    # -- expressions ---------------------------------------------------------------------
    def expr(self, min_prec: int = 1) -> Expr:
        lhs = self.unary()
        while True:
            t = self.peek()
            if t.kind != "op" or t.text not in _BINOPS or _BINOPS[t.text][0] < min_prec:
                return lhs
            prec, op = _BINOPS[self.next().text]
            rhs = self.expr(prec + 1)
            try:
                lhs = binary(op, lhs, rhs)
            except KilnError as e:
                raise self.error(e.raw_message, t) from None

    def unary(self) -> Expr:
        t = self.peek()
        if t.kind == "op" and t.text == "!":
            self.next()
            a = self.unary()
            if a.dtype is not DType.bool:
                raise self.error(f"'!' needs a bool operand, got {a.dtype.name}", t)
            return Expr("not", DType.bool, (a,))
        if t.kind == "op" and t.text == "-":
            self.next()
            lit = self.literal(negative=True)
            if lit is None:
                raise self.error("expected a number after unary '-' (write 0 - x to negate an expression)")
            return lit
        return self.primary()

    def literal(self, negative=False, dtype: DType | None = None) -> Expr | None:
        """A number, true/false or inf/nan (None when the next token is none of them)."""
        t = self.peek()
        sign = "-" if negative else ""
        if t.kind == "int":
            self.next()
            return self.typed(int(sign + t.text), dtype or INDEX, t)
        if t.kind == "float" or (t.kind == "name" and t.text in _FLOAT_WORDS):
            self.next()
            f32 = t.text.endswith("f") and t.text not in ("inf", "nan")
            text = t.text[:-1] if f32 else t.text
            if dtype is None:
                dtype = DType.float32 if f32 else DType.float64
            elif f32:
                raise self.error(f"a {dtype.name} literal has no 'f' suffix", t)
            return self.typed(float(sign + text), dtype, t)
        if t.kind == "name" and t.text in ("true", "false") and not negative:
            self.next()
            return self.typed(t.text == "true", dtype or DType.bool, t)
        return None

    def typed(self, value, dtype: DType, tok: _Tok) -> Expr:
        if isinstance(value, float) and not dtype.is_float:
            raise self.error(f"a {dtype.name} literal must be an integer", tok)
        if isinstance(value, bool) != (dtype is DType.bool):
            raise self.error(f"a {dtype.name} literal cannot be {tok.text}", tok)
        return const(value, dtype)

    def args(self) -> list:
        self.expect("(")
        out = []
        while not self.accept(")"):
            if out:
                self.expect(",", " or ')'")
            out.append(self.expr())
        return out

    def primary(self) -> Expr:
        t = self.peek()
        lit = self.literal()
        if lit is not None:
            return lit
        if t.kind == "op" and t.text == "(":
            self.next()
            e = self.expr()
            self.expect(")")
            return e
        if t.kind not in ("name", "str"):
            raise self.error(f"expected an expression, found {t!r}")
        name = self.name()
        nxt = self.peek()
        if nxt.kind == "op" and nxt.text == "[":
            buf = self.lookup(name, t, S.Buffer)
            self.next()
            idx = []
            while not self.accept("]"):
                if idx:
                    self.expect(",", " or ']'")
                idx.append(self.expr())
            if len(idx) != len(buf.shape):
                raise self.error(f"buffer {name!r} has rank {len(buf.shape)}, indexed with {len(idx)} indices", t)
            return Expr("load", buf.dtype, tuple(idx), buf)
        if nxt.kind == "op" and nxt.text in ("(", "<") and t.kind == "name":
            if nxt.text == "<" and name != "cast":
                return self.lookup(name, t, Expr)
            return self.function(name, t)
        return self.lookup(name, t, Expr)

    def function(self, name: str, t: _Tok) -> Expr:
        try:
            return self._function(name, t)
        except KilnError as e:
            if e.stage == "parse":
                raise
            raise self.error(f"{name}: {e.raw_message}", t) from None

    def _function(self, name: str, t: _Tok) -> Expr:
        if name in _DTYPES:
            dt = _DTYPES[name]
            save = self.pos
            self.expect("(")
            neg = self.accept("-")
            try:
                lit = self.literal(negative=neg, dtype=dt)
            except KilnError:     # int32(1.5f): a cast of a literal of another type
                lit = None
            if lit is not None and self.accept(")"):
                return lit
            self.seek(save)
            (a,) = self.nargs(name, 1)
            return a if a.dtype is dt else Expr("cast", dt, (a,))
        if name == "cast":
            self.expect("<")
            dt = self.dtype()
            mode = self.name("a conversion mode") if self.accept(",") else None
            self.expect(">")
            (a,) = self.nargs(name, 1)
            return Expr("cast", dt, (a,), mode)
        if name in REDUCERS:
            return self.reduce(name, t)
        if name in ("truncdiv", "truncmod"):
            return binary(name, *self.nargs(name, 2))
        if name == "select":
            return select(*self.nargs(name, 3))
        if name == "check":
            self.expect("(")
            v = self.expr()
            self.expect(",")
            ok = self.expr()
            self.expect(",")
            rep = self.expr()
            self.expect(",")
            if self.peek().kind != "str":
                raise self.error(f"expected the check's message (a string), found {self.peek()!r}")
            msg = json.loads(self.next().text)
            self.expect(")")
            if ok.dtype is not DType.bool or rep.dtype is not INDEX:
                raise self.error("check(value, ok, reported, message) needs a bool ok and an int64 reported", t)
            return Expr("check", v.dtype, (v, ok, rep), msg)
        if name in UNARY_INTRIN or name in BINARY_INTRIN:
            return call(name, *self.args())
        if name in PREFETCHES.values():
            (ld,) = self.nargs(name, 1)
            if ld.op != "load":
                raise self.error(f"{name} takes a load of a buffer element", t)
            return prefetch(ld, next(level for level, n in PREFETCHES.items() if n == name))
        raise self.error(f"unknown function {name!r} (intrinsics, min/max, select, check, casts, reductions, "
                         "prefetch)", t)

    def nargs(self, name: str, n: int) -> list:
        t = self.peek()
        out = self.args()
        if len(out) != n:
            raise self.error(f"{name} takes {n} argument(s), got {len(out)}", t)
        return out

    def reduce(self, name: str, t: _Tok) -> Expr:
        self.expect("(")
        value = self.expr()
        self.expect(",")
        if name in ("min", "max") and not self.at("axis"):
            other = self.expr()
            self.expect(")")
            return binary(name, value, other)
        self.expect("axis")
        self.expect("=")
        self.expect("[")
        axes = []
        while not self.accept("]"):
            if axes:
                self.expect(",", " or ']'")
            at = self.peek()
            axes.append(self.lookup(self.name("a reduction axis"), at, Expr))
        self.expect(")")
        if name in ("sum", "prod") and not axes:
            raise self.error(f"{name} needs at least one reduction axis", t)
        return Expr("reduce", value.dtype, (value,), (name, tuple(axes)))

    # -- statements ------------------------------------------------------------------------
    def decl(self) -> tuple:
        """`dtype name[dims] [scope]` -> (name, dtype, shape, scope, token)."""
        dt = self.dtype()
        t = self.peek()
        name = self.name("a buffer name")
        self.expect("[")
        dims = []
        while not self.accept("]"):
            if dims:
                self.expect(",", " or ']'")
            d = self.expr()
            dims.append(int(d.arg) if d.op == "const" and d.dtype is INDEX else d)
        scope = self.name() if self.peek().kind in ("name", "str") else "global"
        return name, dt, tuple(dims), scope, t

    def block(self) -> list:
        """Statements up to (not including) the closing '}'; a `let ...;` takes the rest."""
        items = []
        while not self.at("}") and self.peek().kind != "eof":
            if self.at("let"):
                let, took_rest = self.let()
                items.append(let)
                if took_rest:
                    break
            else:
                items.append(self.stmt())
        return items

    @staticmethod
    def one(items: list) -> S.Stmt:
        return items[0] if len(items) == 1 else S.Seq(tuple(items))

    def body(self) -> S.Stmt:
        self.expect("{")
        out = self.one(self.block())
        self.expect("}", " closing the block")
        return out

    def scoped(self, name: str, obj, fn):
        self.scopes.append({name: obj})
        try:
            return fn()
        finally:
            self.scopes.pop()

    def let(self) -> tuple:
        """`let [dtype] x = v;` (its body: the rest of the block) or `let x = v { body }`;
        returns (Let, whether it took the rest of the block)."""
        self.expect("let")
        dt = self.dtype() if self.peek().kind == "name" and self.peek().text in _DTYPES else None
        nt = self.peek()
        name = self.name("the let's variable")
        self.expect("=")
        value = self.expr()
        v = self.bind(name, dt or value.dtype, nt)
        if self.at("{"):
            return S.Let(v, value, self.scoped(name, v, self.body)), False
        self.expect(";", " or '{' after the let's value")
        return S.Let(v, value, self.scoped(name, v, lambda: self.one(self.block()))), True

    def stmt(self) -> S.Stmt:
        t = self.peek()
        if t.kind == "op" and t.text == "{":
            self.next()
            items = self.block()
            self.expect("}", " closing the block")
            return S.Seq(tuple(items))
        if t.kind == "name":
            if t.text in _LOOP_KINDS or t.text == "for":
                return self.for_()
            if t.text == "if":
                return self.if_()
            if t.text == "allocate":
                return self.allocate()
            if t.text == "call":
                return self.call_()
        store = self.store()
        if store is not None:
            return store
        e = self.expr()
        self.expect(";", " after an expression statement")
        return S.Evaluate(e)

    def for_(self) -> S.For:
        kind = "serial"
        if self.peek().text in _LOOP_KINDS:
            kind = self.next().text
        self.expect("for")
        self.expect("(")
        dt = self.dtype() if self.peek().kind == "name" and self.peek().text in _DTYPES else INDEX
        nt = self.peek()
        name = self.name("the loop variable")
        self.expect("=")
        lo = self.expr()
        self.expect(";")
        t = self.peek()
        if self.name("the loop variable") != name:
            raise self.error(f"expected the loop variable {name!r} in the loop's condition", t)
        self.expect("<")
        v = self.bind(name, dt, nt)
        end = self.scoped(name, v, self.expr)
        self.expect(";")
        self.expect("++")
        t = self.peek()
        if self.name("the loop variable") != name:
            raise self.error(f"expected ++{name}", t)
        self.expect(")")
        if lo.op == "const" and lo.arg == 0:
            extent = end
        elif end.op == "add" and end.args[0] is lo:
            extent = end.args[1]
        else:
            raise self.error(f"a loop from {lo} runs while {name} < {lo} + extent", t)
        body = self.scoped(name, v, self.body)
        return S.For(v, lo, extent, kind, body)

    def if_(self) -> S.IfThenElse:
        self.expect("if")
        self.expect("(")
        c = self.expr()
        self.expect(")")
        then = self.body()
        return S.IfThenElse(c, then, self.body() if self.accept("else") else None)

    def allocate(self) -> S.Allocate:
        self.expect("allocate")
        name, dt, shape, scope, t = self.decl()
        self.expect("(")
        where = self.name("an allocation scope (stack, heap or auto)")
        self.expect(")")
        b = self.buffer(name, dt, shape, scope, t)
        return S.Allocate(b, self.scoped(name, b, self.body), where)

    def call_(self) -> S.Call:
        self.expect("call")
        func = self.name("a function name")
        self.expect("(")
        args = []
        while not self.accept(")"):
            if args:
                self.expect(",", " or ')'")
            t = self.peek()
            b = self.lookup(self.name("a buffer"), t, S.Buffer)
            if self.accept("+"):
                off = self.peek()
                if off.kind != "int":
                    raise self.error("expected a byte offset (like 128B)")
                self.next()
                self.expect("B", " after the byte offset")
                b = S.View(b, int(off.text))
            args.append(b)
        self.expect(";")
        return S.Call(func, tuple(args))

    def store(self) -> S.Store | None:
        """`buf[i, ...] = value;`, or None (and nothing consumed) when the statement is not one."""
        t = self.peek()
        if t.kind not in ("name", "str"):
            return None
        save = self.pos
        name = self.name()
        if not self.accept("["):
            self.seek(save)
            return None
        idx = []
        while not self.accept("]"):
            if idx:
                self.expect(",", " or ']'")
            idx.append(self.expr())
        if not self.at("="):
            self.seek(save)
            return None
        self.next()
        buf = self.lookup(name, t, S.Buffer)
        if len(idx) != len(buf.shape):
            raise self.error(f"buffer {name!r} has rank {len(buf.shape)}, stored with {len(idx)} indices", t)
        value = self.expr()
        self.expect(";", " after a store")
        return S.Store(buf, tuple(idx), value)

    # -- functions and modules ------------------------------------------------------------
    def params(self) -> tuple:
        self.expect("(")
        out = []
        self.free_dims = True
        while not self.accept(")"):
            if out:
                self.expect(",", " or ')'")
            name, dt, shape, scope, t = self.decl()
            b = self.buffer(name, dt, shape, scope, t)
            self.scopes[0][name] = b
            out.append(b)
        self.free_dims = False
        return tuple(out)

    def func(self):
        self.scopes, self.objects = [dict(self.env)], dict(self.env)
        if self.accept("extern"):
            return self.extern()
        self.expect("func", " (a function: 'func NAME(...) {' or 'extern func NAME(...) {')")
        name = self.name("the function's name")
        params = self.params()
        noalias = not self.accept("may_alias")
        body = self.body()
        return S.PrimFunc(name, params, body, noalias)

    def extern(self) -> S.ExternFunc:
        self.expect("func")
        name = self.name("the function's name")
        params = self.params()
        dynamic = self.accept("dynamic")
        meta = {"libs": (), "errors": ()}
        while self.at("libs", "errors"):
            key = self.next().text
            self.expect("=")
            value = self.json_value()
            if not isinstance(value, list) or not all(isinstance(x, list) for x in value):
                raise self.error(f"extern {key} is a list of lists")
            meta[key] = tuple(tuple(x) for x in value)
        body = self.raw_block()
        preamble = self.raw_block() if self.accept("preamble") else ""
        return S.ExternFunc(name, params, body, dynamic, preamble, meta["libs"], meta["errors"])

    def module(self) -> S.LoopModule:
        funcs, entry, interface = [], None, ""
        while self.peek().kind != "eof":
            if self.accept("entry"):
                entry = self.name("the entry function's name")
            elif self.accept("interface"):
                if self.peek().kind != "str":
                    raise self.error("expected the interface text (a string)")
                interface = json.loads(self.next().text)
            else:
                funcs.append(self.func())
        try:
            return S.LoopModule(funcs, entry, interface)
        except KilnError as e:
            raise KilnError(f"loop IR text: {e.raw_message}", stage="parse") from None

    def done(self, what):
        if self.peek().kind != "eof":
            raise self.error(f"expected the end of the {what}, found {self.peek()!r}")


def parse_module(text: str) -> S.LoopModule:
    """A LoopModule from its printed form (`str(module)`)."""
    return _Parser(text).module()


def parse_func(text: str) -> S.PrimFunc | S.ExternFunc:
    """One function (`str(func)`)."""
    p = _Parser(text)
    f = p.func()
    p.done("function")
    return f


def parse_stmt(text: str, env: dict | None = None) -> S.Stmt:
    """A statement or block; `env` maps the names of its free variables and buffers to them."""
    p = _Parser(text, env)
    s = p.one(p.block())
    p.done("statement")
    return s


def parse_expr(text: str, env: dict | None = None) -> Expr:
    """An expression; `env` maps the names of its variables and buffers to them."""
    p = _Parser(text, env)
    e = p.expr()
    p.done("expression")
    return e
