"""Canonical bytes of graphs and attribute values: an unambiguous form to hash.

A cache key must change whenever anything lowering reads changes. `repr()` does
not promise that: NumPy abbreviates arrays above 1,000 elements with `...`, so two
models whose large constant differs in one element shared a compiled module. Here
every item is a one-byte type tag, then its length, then its payload, so two
different values never serialise alike: arrays give their dtype, shape and every
byte (object and string arrays every element), subgraphs their whole structure
(nodes, attributes, constants), and a type this module does not know is an error,
never a guess.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import struct
from typing import Iterator

import numpy as np

from kiln.errors import KilnError
from kiln.graph.ir import Graph, Node, Value


def _n(k: int) -> bytes:
    return struct.pack("<Q", k)


def _flat_list(xs: list) -> bytes | None:
    """The very bytes `Encoder.item` gives a list of only floats, ints or strs, made in one
    go (None for any other list): attribute lists such as a tree ensemble's node values run
    to 100,000s of items, which one generator step each took seconds to encode."""
    if len(xs) < 16:
        return None
    kinds = set(map(type, xs))
    if kinds == {float}:
        rec = np.empty((len(xs), 9), np.uint8)
        rec[:, 0] = ord("f")
        rec[:, 1:] = np.asarray(xs, "<f8").view(np.uint8).reshape(-1, 8)
        return b"l" + _n(len(xs)) + rec.tobytes()
    if kinds == {int}:
        return b"l" + _n(len(xs)) + b"".join(_text(b"i", str(x)) for x in xs)
    if kinds == {str}:
        return b"l" + _n(len(xs)) + b"".join(_text(b"s", x) for x in xs)
    return None


def _text(tag: bytes, s: str) -> bytes:
    data = s.encode("utf-8", "surrogatepass")
    return tag + _n(len(data)) + data


class Encoder:
    """Streams the canonical form of values and graphs. Values are numbered in order of
    first appearance (a later mention is its number), so shared values and subgraphs'
    reads of outer values are encoded exactly; `known` adds a value's compile-time data."""

    def __init__(self, known: dict | None = None):
        self.known = known or {}
        self.values: dict[int, int] = {}

    def item(self, obj) -> Iterator[bytes]:
        if obj is None:
            yield b"N"
        elif obj is True or obj is False:
            yield b"T" if obj else b"F"
        elif isinstance(obj, int) and not isinstance(obj, enum.Enum):
            yield _text(b"i", str(int(obj)))
        elif isinstance(obj, float):
            yield b"f" + struct.pack("<d", obj)
        elif isinstance(obj, str):
            yield _text(b"s", obj)
        elif isinstance(obj, (bytes, bytearray, memoryview)):
            data = bytes(obj)
            yield b"b" + _n(len(data)) + data
        elif isinstance(obj, (np.ndarray, np.generic)):
            yield from self.array(np.asarray(obj))
        elif isinstance(obj, list) and (packed := _flat_list(obj)) is not None:
            yield packed
        elif isinstance(obj, (list, tuple)):
            yield (b"l" if isinstance(obj, list) else b"t") + _n(len(obj))
            for x in obj:
                yield from self.item(x)
        elif isinstance(obj, dict):
            pairs = sorted((canonical_bytes(k), v) for k, v in obj.items())
            yield b"d" + _n(len(pairs))
            for k, v in pairs:
                yield b"b" + _n(len(k)) + k
                yield from self.item(v)
        elif isinstance(obj, Graph):
            yield from self.graph(obj)
        elif isinstance(obj, Value):
            yield from self.value(obj)
        elif isinstance(obj, Node):
            yield from self.node(obj)
        elif isinstance(obj, enum.Enum):
            yield _text(b"e", f"{type(obj).__module__}.{type(obj).__qualname__}.{obj.name}")
        elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            fields = dataclasses.fields(obj)
            yield _text(b"c", f"{type(obj).__module__}.{type(obj).__qualname__}") + _n(len(fields))
            for f in fields:
                yield _text(b"s", f.name)
                yield from self.item(getattr(obj, f.name))
        else:
            raise KilnError(f"cannot serialise a {type(obj).__module__}.{type(obj).__qualname__} "
                            "for a cache key (kiln.graph.canonical knows no canonical form for it)",
                            stage="cache")

    def array(self, a: np.ndarray) -> Iterator[bytes]:
        yield _text(b"a", a.dtype.str) + _text(b"s", a.dtype.name) + _n(a.ndim)
        yield b"".join(_n(d) for d in a.shape)
        if a.dtype.hasobject:
            yield b"o"
            for x in a.ravel(order="C").tolist():
                yield from self.item(x)
        else:
            a = np.ascontiguousarray(a)
            yield b"r" + _n(a.nbytes)
            yield a.reshape(-1).view(np.uint8).data if a.size and a.dtype.itemsize else b""

    def value(self, v: Value | None) -> Iterator[bytes]:
        if v is None:
            yield b"N"
            return
        k = self.values.get(v.id)
        if k is not None:
            yield b"v" + _n(k)
            return
        self.values[v.id] = k = len(self.values)
        yield b"V" + _n(k)
        yield _text(b"s", v.name)
        yield from self.item(v.type)
        yield from self.item(v.const)
        known = self.known.get(v.id) if v.const is None else None
        yield from self.item(None if known is None else np.asarray(known))

    def node(self, n: Node) -> Iterator[bytes]:
        yield _text(b"n", n.domain) + _text(b"s", n.op) + _text(b"s", n.name)
        yield b"l" + _n(len(n.inputs))
        for v in n.inputs:
            yield from self.value(v)
        yield b"l" + _n(len(n.outputs))
        for v in n.outputs:
            yield from self.value(v)
        yield from self.item(n.attrs)

    def graph(self, g: Graph) -> Iterator[bytes]:
        yield _text(b"g", g.name)
        yield from self.item(g.opsets)
        for part in (g.inputs, g.nodes, g.outputs):
            yield b"l" + _n(len(part))
            for x in part:
                yield from (self.node(x) if isinstance(x, Node) else self.value(x))


def canonical_bytes(obj, known: dict | None = None) -> bytes:
    """The canonical serialised form of `obj` (a graph, value, array, attribute, ...)."""
    return b"".join(Encoder(known).item(obj))


def digest(*objs, known: dict | None = None) -> str:
    """sha256 (hex) of the canonical form of `objs`, streamed (weights are not copied)."""
    h = hashlib.sha256()
    enc = Encoder(known)
    for chunk in enc.item(tuple(objs)):
        h.update(chunk)
    return h.hexdigest()
