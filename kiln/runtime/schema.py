"""Checking JSON read from disk (artifact and cache manifests) against a declared shape.

A manifest says which symbol to call and how big the buffers handed to native code
are, so every field is checked (type, range, pattern; no missing or unknown field)
before any of it is used: a bad one is a KilnError naming the field, never a
KeyError or a call with wrong sizes. Validators are plain functions
`(value, field path) -> None`, built by the constructors below.
"""

from __future__ import annotations

import re
from typing import Callable

from kiln.errors import KilnError

Validator = Callable[[object, str], None]
SHA256 = r"[0-9a-f]{64}"
C_IDENTIFIER = r"[A-Za-z][A-Za-z0-9_]*"
MAX_INT = 2 ** 62   # sizes and offsets beyond this are nonsense (and overflow C's int64 arithmetic)


class SchemaError(KilnError):
    """A manifest field is missing, unknown, of the wrong type or out of range."""


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _fail(path: str, expected: str, value) -> None:
    raise SchemaError(f"field {path or '(top level)'}: expected {expected}, found {_shown(value)}")


def integer(lo: int = 0, hi: int = MAX_INT) -> Validator:
    def check(v, path):
        if type(v) is not int or not lo <= v <= hi:
            _fail(path, f"an integer in [{lo}, {hi}]", v)
    return check


def string(pattern: str | None = None, max_len: int = 4096) -> Validator:
    def check(v, path):
        if not isinstance(v, str) or len(v) > max_len or (pattern and not re.fullmatch(pattern, v)):
            _fail(path, f"a string{f' matching {pattern}' if pattern else ''}", v)
    return check


def const(value) -> Validator:
    def check(v, path):
        if v != value or type(v) is not type(value):
            _fail(path, repr(value), v)
    return check


def one_of(*values) -> Validator:
    def check(v, path):
        if not any(v == x and type(v) is type(x) for x in values):
            _fail(path, f"one of {list(values)}", v)
    return check


def nullable(inner: Validator) -> Validator:
    def check(v, path):
        if v is not None:
            inner(v, path)
    return check


def list_of(item: Validator, max_len: int = 1 << 20, min_len: int = 0) -> Validator:
    def check(v, path):
        if not isinstance(v, list) or not min_len <= len(v) <= max_len:
            _fail(path, f"a list of {min_len} to {max_len} items", v)
        for k, x in enumerate(v):
            item(x, f"{path}[{k}]")
    return check


def pair(first: Validator, second: Validator) -> Validator:
    def check(v, path):
        if not isinstance(v, list) or len(v) != 2:
            _fail(path, "a list of 2 items", v)
        first(v[0], f"{path}[0]")
        second(v[1], f"{path}[1]")
    return check


def mapping(key: Validator, value: Validator, max_len: int = 4096) -> Validator:
    def check(v, path):
        if not isinstance(v, dict) or len(v) > max_len:
            _fail(path, "an object", v)
        for k, x in v.items():
            key(k, f"{path} key")
            value(x, f"{path}.{k}")
    return check


def record(fields: dict[str, Validator], optional: tuple = ()) -> Validator:
    """An object with exactly these fields (those in `optional` may be absent)."""
    def check(v, path):
        if not isinstance(v, dict):
            _fail(path, "an object", v)
        missing = [f for f in fields if f not in v and f not in optional]
        unknown = [f for f in v if f not in fields]
        if missing:
            raise SchemaError(f"field {path + '.' if path else ''}{missing[0]} is missing")
        if unknown:
            raise SchemaError(f"unknown field {path + '.' if path else ''}{_shown(unknown[0])}")
        for f, inner in fields.items():
            if f in v:
                inner(v[f], f"{path}.{f}" if path else f)
    return check


def validate(value, schema: Validator, where: str) -> None:
    """Check `value` against `schema`; a SchemaError names `where` and the field."""
    try:
        schema(value, "")
    except SchemaError as e:
        raise SchemaError(f"{where}: {e}") from None
