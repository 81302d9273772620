"""C for string kernels: the `kiln_str` helpers and safe literals of user strings.

A string tensor's element is `kiln_str` {const char* ptr; int64_t len}; it and the
per-thread arena that kernels making new strings allocate from (`kiln_str_alloc`) are
declared in the C prelude (kiln.codegen.c), which also gives every module its exported
`<prefix>_strings_gather` / `<prefix>_strings_release` (see kiln.runtime.strings for the
NumPy side). String kernels are single-threaded, so the arena is always the calling
thread's.

`HELPERS` is guarded, so every string kernel may list it in its preamble: a module
holds one copy per translation unit.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from kiln.codegen.csource import c_instance, c_source

if TYPE_CHECKING:
    from kiln.loops.stmt import ExternFunc

HELPERS = "\n" + c_source("kiln_strings.h")

# what the kernels' non-zero statuses mean (LowerCtx.extern's `errors`)
ERRORS = {1: "out of memory for the strings it makes",
          2: "a string has a negative length or no bytes (a malformed kiln_str input)"}


def c_bytes(data: bytes) -> str:
    """A C string literal of `data`: every byte that is not a letter, digit or space is an
    octal escape, so no user string can end the literal or form a trigraph or comment."""
    return '"' + "".join(chr(b) if chr(b).isalnum() and b < 128 or b == 32 else f"\\{b:03o}"
                         for b in data) + '"'


def c_str(s: str | bytes) -> str:
    """A `kiln_str` initializer of a Python string: {"utf-8 bytes", length}."""
    data = s if isinstance(s, bytes) else s.encode("utf-8", "surrogateescape")
    return f"{{{c_bytes(data)}, {len(data)}}}"


def str_table(name: str, items: list) -> str:
    """`static const kiln_str name[]` holding `items` (one empty string when there are none)."""
    body = ", ".join(c_str(s) for s in items) or '{"", 0}'
    return f"  static const kiln_str {name}[{max(len(items), 1)}] = {{{body}}};\n"


def utf8_key(s) -> bytes:
    """The bytes kiln_str_cmp orders by: sort tables with this before baking them."""
    return s if isinstance(s, bytes) else str(s).encode("utf-8", "surrogateescape")


# code points where cased letters and case-ignorable marks occur (planes 0-1, tags and
# variation selectors); CJK planes 2-3 hold neither
_CASE_RANGES = ((0, 0x20000), (0xE0000, 0xE1000))


def _code_points():
    for lo, hi in _CASE_RANGES:
        for c in range(lo, hi):
            if not 0xD800 <= c < 0xE000:
                yield c


def _ranges(points: list[int]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for c in points:
        if out and out[-1][1] == c - 1:
            out[-1][1] = c
        else:
            out.append([c, c])
    return [(a, b) for a, b in out]


def _int_array(name: str, ctype: str, values) -> str:
    values = list(values) or [0]
    return f"static const {ctype} {name}[{len(values)}] = {{{', '.join(map(str, values))}}};\n"


@functools.lru_cache(maxsize=None)
def case_helpers(kind: str) -> str:
    """C defining `int kiln_str_<kind>(kiln_str s, kiln_str* out)` (kind "lower" or "upper"):
    Python's str.lower()/str.upper() of s, in the arena. The mapping tables are Python's
    own (full case mappings: "ß".upper() is "SS"), taken from this interpreter's Unicode
    database at compile time, so results never depend on the machine's C locale. lower()
    also follows Python's Final_Sigma rule for U+03A3 (cased and case-ignorable sets
    derived from Python's own behaviour)."""
    change = str.lower if kind == "lower" else str.upper
    cps, offs, blob, ratio = [], [0], bytearray(), 1
    for c in _code_points():
        if c == 0x3A3 and kind == "lower":
            continue  # context-dependent: kiln_final_sigma
        m = change(chr(c))
        if m != chr(c):
            b = m.encode()
            cps.append(c)
            blob += b
            offs.append(len(blob))
            ratio = max(ratio, -(-len(b) // len(chr(c).encode())))
    k = kind
    out = [f"#ifndef KILN_CASE_{k.upper()}\n#define KILN_CASE_{k.upper()}\n",
           _int_array(f"kiln_{k}_cp", "int32_t", cps), _int_array(f"kiln_{k}_off", "int32_t", offs),
           f"static const char kiln_{k}_bytes[] = {c_bytes(bytes(blob))};\n"]
    if kind == "lower":
        out.append(_sigma_helpers())
    ascii_change = "(b) >= 'A' && (b) <= 'Z' ? (b) + 32" if kind == "lower" else "(b) >= 'a' && (b) <= 'z' ? (b) - 32"
    macros = {"KILN_CASE_FN": f"kiln_str_{k}", "KILN_CASE_CP": f"kiln_{k}_cp", "KILN_CASE_OFF": f"kiln_{k}_off",
              "KILN_CASE_BYTES": f"kiln_{k}_bytes", "KILN_CASE_N": str(len(cps)), "KILN_CASE_RATIO": str(ratio),
              "KILN_CASE_ASCII(b)": f"({ascii_change} : (b))", "KILN_CASE_SIGMA": str(int(kind == "lower"))}
    out.append(c_instance("str_case.c", macros, f"KILN_CASE_FN_{k.upper()}") + "#endif\n")
    return "".join(out)


def _sigma_helpers() -> str:
    cased, ignorable = [], []
    for c in _code_points():
        x = chr(c)
        alone = (x + "\u03a3").lower()[-1] == "\u03c2"        # x is cased and not case-ignorable
        between = ("A" + x + "\u03a3").lower()[-1] == "\u03c2"  # x is cased or case-ignorable
        if alone:
            cased.append(c)
        elif between:
            ignorable.append(c)
    parts = []
    for name, pts in (("cased", cased), ("ignorable", ignorable)):
        rs = _ranges(pts)
        macros = {"KILN_RANGES_FN": f"kiln_is_{name}", "KILN_RANGES_LO": f"kiln_{name}_lo",
                  "KILN_RANGES_HI": f"kiln_{name}_hi", "KILN_RANGES_N": str(len(rs))}
        parts += [_int_array(f"kiln_{name}_lo", "int32_t", [a for a, _ in rs]),
                  _int_array(f"kiln_{name}_hi", "int32_t", [b for _, b in rs]),
                  c_instance("code_point_ranges.c", macros, f"KILN_IS_{name.upper()}")]
    parts.append(c_source("final_sigma.c"))
    return "".join(parts)


def constant_kernel(name: str, data) -> "ExternFunc":
    """A kernel writing a string constant's `kiln_str` views into its one output (out0);
    the bytes are literals in the library itself. String constants cannot live in the
    weights blob, which holds bytes only (a pointer there would need fixing up at load)."""
    import numpy as np

    from kiln.dtypes import DType
    from kiln.loops.stmt import Buffer, ExternFunc
    data = np.asarray(data, dtype=object)
    n = int(data.size)
    body = (str_table("k", list(data.reshape(-1))) +
            f"  memcpy(out0, k, {n}ULL * sizeof(kiln_str));\n  return 0;") if n else "  return 0;"
    return ExternFunc(name, (Buffer("out0", DType.string, tuple(data.shape)),), body)
