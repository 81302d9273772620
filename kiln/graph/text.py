"""Text form of a Graph that prints and parses back.

    graph "main" (%x: float32[1,"n"]) -> (%y)
      opsets {"": 21}
    {
      const %w: float32[2] = tensor<float32[2]>("AACAPwAAAEA=")
      %t: float32[1,"n"] = Mul(%x, %w) name "mul0"
      %y: float32[1,"n"] = Relu(%t) name "relu0"
    }

Constants (with their data, base64 of the raw little-endian bytes) are printed
once, at the top level, and may be read by nested graphs. Attributes are
`{name = value, ...}`: ints, floats, strings, lists, tensors, graphs, types.
"""

from __future__ import annotations

import base64
import json
import math
import re

import numpy as np

from kiln.dtypes import DType
from kiln.errors import KilnError
from kiln.graph.ir import Graph, Node, Value, register_printer
from kiln.graph.types import OptionalType, SequenceType, TensorType, Type

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\Z")


def _name(s: str) -> str:
    return s if _IDENT.match(s) else json.dumps(s)


def print_type(t: Type | None) -> str:
    if t is None:
        return "none"
    if isinstance(t, SequenceType):
        return f"seq<{print_type(t.elem)}>"
    if isinstance(t, OptionalType):
        return f"opt<{print_type(t.elem)}>"
    if t.shape is None:
        return f"{t.dtype.name}[*]"
    return f"{t.dtype.name}[{','.join(str(d) if isinstance(d, int) else _name(d) for d in t.shape)}]"


def _tensor_lit(a: np.ndarray) -> str:
    t = TensorType(DType.from_numpy(a.dtype), tuple(a.shape))
    if t.dtype is DType.string:
        payload = json.dumps([str(x) for x in a.reshape(-1)])
    else:
        payload = base64.b64encode(np.ascontiguousarray(a).tobytes()).decode()
    return f"tensor<{print_type(t)}>({json.dumps(payload)})"


def _attr(v, indent: str) -> str:
    if isinstance(v, bool):
        return str(int(v))
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf"))
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, np.ndarray):
        return _tensor_lit(v)
    if isinstance(v, Graph):
        return _graph(v, indent, top=False)
    if isinstance(v, (TensorType, SequenceType, OptionalType)):
        return f"type {print_type(v)}"
    if isinstance(v, list):
        return "[" + ", ".join(_attr(x, indent) for x in v) + "]"
    raise KilnError(f"cannot print attribute value of type {type(v).__name__}")


def _graph(g: Graph, indent: str, top: bool) -> str:
    inner = indent + "  "
    params = ", ".join(f"%{_name(v.name)}: {print_type(v.type)}" for v in g.inputs)
    outs = ", ".join(f"%{_name(v.name)}" for v in g.outputs)
    lines = [f"graph {json.dumps(g.name)} ({params}) -> ({outs})"]
    if top:
        ops = ", ".join(f"{json.dumps(k)}: {v}" for k, v in sorted(g.opsets.items()))
        lines.append(f"{inner}opsets {{{ops}}}")
    lines.append(indent + "{")
    if top:
        for c in g.constants():
            lines.append(f"{inner}const %{_name(c.name)}: {print_type(c.type)} = {_tensor_lit(c.const)}")
    for n in g.nodes:
        lines.append(inner + _node(n, inner))
    lines.append(indent + "}")
    return "\n".join(lines)


def _node(n: Node, indent: str) -> str:
    outs = ", ".join("_" if v is None else f"%{_name(v.name)}: {print_type(v.type)}" for v in n.outputs)
    ins = ", ".join("_" if v is None else f"%{_name(v.name)}" for v in n.inputs)
    op = f"{json.dumps(n.domain)}::{n.op}" if n.domain else n.op
    s = f"{outs or '()'} = {op}({ins})"
    if n.attrs:
        s += " {" + ", ".join(f"{k} = {_attr(v, indent)}" for k, v in n.attrs.items()) + "}"
    return s + f" name {json.dumps(n.name)}"


def print_graph(g: Graph) -> str:
    return _graph(g, "", top=True) + "\n"


register_printer(print_graph)   # str(graph) (the IR does not import its printer)


# ---------------------------------------------------------------- parsing

_TOKEN = re.compile(r"""
    (?P<ws>\s+|\#[^\n]*) |
    (?P<str>"(?:[^"\\]|\\.)*") |
    (?P<num>-?\d+(?:\.\d*)?(?:[eE][+-]?\d+)?) |
    (?P<neginf>-inf\b) |
    (?P<id>[A-Za-z_][A-Za-z0-9_.]*) |
    (?P<p>->|::|[()\[\]{}<>,:=%_*])
""", re.X)


class _Parser:
    def __init__(self, text: str):
        self.toks: list[tuple[str, str, int]] = []
        pos = 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if not m:
                raise KilnError(f"text IR: unexpected character {text[pos]!r} at offset {pos}")
            if m.lastgroup != "ws":
                self.toks.append((m.lastgroup, m.group(), pos))
            pos = m.end()
        self.i = 0
        self.consts: dict[str, Value] = {}

    def peek(self, k: int = 0) -> tuple[str, str, int]:
        j = self.i + k
        return self.toks[j] if j < len(self.toks) else ("eof", "", -1)

    def next(self) -> tuple[str, str, int]:
        t = self.peek()
        self.i += 1
        return t

    def expect(self, s: str) -> None:
        t = self.next()
        if t[1] != s:
            raise KilnError(f"text IR: expected {s!r} at offset {t[2]}, found {t[1]!r}")

    def accept(self, s: str) -> bool:
        if self.peek()[1] == s:
            self.i += 1
            return True
        return False

    def name(self) -> str:
        kind, s, pos = self.next()
        if kind == "str":
            return json.loads(s)
        if kind in ("id", "p") and (kind == "id" or s == "_"):
            return s
        raise KilnError(f"text IR: expected a name at offset {pos}, found {s!r}")

    def val_name(self) -> str:
        self.expect("%")
        return self.name()

    def type(self) -> Type | None:
        kind, s, pos = self.next()
        if s == "none":
            return None
        if s in ("seq", "opt"):
            self.expect("<")
            e = self.type()
            self.expect(">")
            return SequenceType(e) if s == "seq" else OptionalType(e)
        dtype = DType.from_name(s)
        self.expect("[")
        if self.accept("*"):
            self.expect("]")
            return TensorType(dtype, None)
        dims = []
        while not self.accept("]"):
            k, tok, _ = self.peek()
            dims.append(int(self.next()[1]) if k == "num" else self.name())
            self.accept(",")
        return TensorType(dtype, tuple(dims))

    def tensor(self) -> np.ndarray:
        self.expect("<")
        t = self.type()
        self.expect(">")
        self.expect("(")
        payload = json.loads(self.next()[1])
        self.expect(")")
        if t.dtype is DType.string:
            return np.array(json.loads(payload), dtype=object).reshape(t.shape)
        return np.frombuffer(base64.b64decode(payload), dtype=t.dtype.np).reshape(t.shape).copy()

    def attr(self, scope: dict):
        kind, s, pos = self.peek()
        if kind == "num":
            self.next()
            return float(s) if any(c in s for c in ".eE") else int(s)
        if s in ("inf", "nan") or kind == "neginf":
            self.next()
            return float(s)
        if kind == "str":
            self.next()
            return json.loads(s)
        if s == "[":
            self.next()
            out = []
            while not self.accept("]"):
                out.append(self.attr(scope))
                self.accept(",")
            return out
        if s == "tensor":
            self.next()
            return self.tensor()
        if s == "graph":
            return self.graph(scope, top=False)
        if s == "type":
            self.next()
            return self.type()
        raise KilnError(f"text IR: bad attribute value {s!r} at offset {pos}")

    def graph(self, outer: dict, top: bool) -> Graph:
        self.expect("graph")
        gname = json.loads(self.next()[1])
        scope = dict(outer)
        inputs = []
        self.expect("(")
        while not self.accept(")"):
            n = self.val_name()
            self.expect(":")
            v = Value(n, self.type())
            scope[n] = v
            inputs.append(v)
            self.accept(",")
        self.expect("->")
        self.expect("(")
        out_names = []
        while not self.accept(")"):
            out_names.append(self.val_name())
            self.accept(",")
        opsets = {}
        if self.accept("opsets"):
            self.expect("{")
            while not self.accept("}"):
                d = json.loads(self.next()[1])
                self.expect(":")
                opsets[d] = int(self.next()[1])
                self.accept(",")
        self.expect("{")
        nodes = []
        while not self.accept("}"):
            if self.accept("const"):
                n = self.val_name()
                self.expect(":")
                self.type()
                self.expect("=")
                self.expect("tensor")
                data = self.tensor()
                v = Value(n, TensorType(DType.from_numpy(data.dtype), data.shape), data)
                scope[n] = v
                continue
            nodes.append(self.node(scope))
        outputs = []
        for n in out_names:
            if n not in scope:
                raise KilnError(f"text IR: graph {gname!r} output %{n} is not defined")
            outputs.append(scope[n])
        return Graph(gname, inputs, outputs, nodes, opsets)

    def node(self, scope: dict) -> Node:
        outs = []
        if self.peek()[1] == "(" and self.peek(1)[1] == ")":
            self.i += 2
        else:
            while True:
                if self.accept("_"):
                    outs.append(None)
                else:
                    n = self.val_name()
                    self.expect(":")
                    outs.append(Value(n, self.type()))
                if not self.accept(","):
                    break
        self.expect("=")
        kind, s, pos = self.next()
        domain = ""
        if kind == "str":
            domain = json.loads(s)
            self.expect("::")
            s = self.next()[1]
        op = s
        ins = []
        self.expect("(")
        while not self.accept(")"):
            if self.accept("_"):
                ins.append(None)
            else:
                n = self.val_name()
                if n not in scope:
                    raise KilnError(f"text IR: %{n} used by {op} before it is defined")
                ins.append(scope[n])
            self.accept(",")
        attrs = {}
        if self.accept("{"):
            while not self.accept("}"):
                k = self.name()
                self.expect("=")
                attrs[k] = self.attr(scope)
                self.accept(",")
        self.expect("name")
        name = json.loads(self.next()[1])
        for v in outs:
            if v is not None:
                scope[v.name] = v
        return Node(op, ins, outs, attrs, name, domain)


def parse_graph(text: str) -> Graph:
    """Parse the text form printed by `print_graph` back into a Graph."""
    p = _Parser(text)
    g = p.graph({}, top=True)
    if p.peek()[0] != "eof":
        raise KilnError(f"text IR: trailing text at offset {p.peek()[2]}")
    return g
