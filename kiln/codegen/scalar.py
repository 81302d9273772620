"""The scalar helper functions kiln.codegen.c emits into a module on demand (max / min, sigmoid,
sign, abs), as C text, and the static variable that holds a max / min's constant."""

from __future__ import annotations

from kiln.codegen.csource import c_source


def helper_text(kind: str, name: str, t: str, is_float: bool) -> str:
    """The definition of helper `name` of `kind` over C type `t`. max / min keep a NaN of
    either operand; maxc / minc (b a constant not NaN: `opaque_text`) keep a NaN `a`, as
    `b > a ? b : a`, which GCC makes one maxps / minps."""
    if kind in ("max", "min", "maxc", "minc"):
        cmp = ">" if kind.startswith("max") else "<"
        nan = " || a != a" if is_float else ""
        body = f"return (b {cmp} a) ? b : a;" if kind.endswith("c") else f"return (a {cmp} b{nan}) ? a : b;"
        sig = f"{t} a, {t} b"
    elif kind == "sigmoid" and t == "float":    # inline and vectorized (the file says why)
        return c_source("kiln_sigmoid.h")
    elif kind == "sigmoid":
        f, w = ("exp", "double") if t == "double" else ("expf", "float")
        body, sig = f"return ({t})(({w})1 / (({w})1 + {f}(-({w})a)));", f"{t} a"
    elif kind == "sign":
        body, sig = f"return a > 0 ? ({t})1 : a < 0 ? ({t})-1 : a;", f"{t} a"
    elif kind == "abs":
        body, sig = f"return a < 0 ? ({t})-a : a;", f"{t} a"
    else:
        raise AssertionError(kind)
    return f"static inline {t} {name}({sig}) {{ {body} }}"


def opaque_text(name: str, t: str, literal: str) -> str:
    """A maxc / minc constant as a static variable GCC cannot fold (`used`: read by what it
    cannot see). `0 > a ? 0 : a` with a literal 0 vectorizes to a compare and a zero-masked
    move (with a literal 6 or 1: a compare and a blend), with a loop-invariant variable to one
    maxps / minps (GCC 12, AVX-512; Relu's 0, HardSwish's 0 and 1). The variable is loaded once
    outside the loop (the kernels store through `restrict` pointers)."""
    return f"static {t} {name} __attribute__((used)) = {literal};"
