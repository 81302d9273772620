"""The C header of an artifact, so a C or C++ program can link the model's library directly.

It declares the entry exactly as the generated source defines it, a typed
wrapper `<prefix>_run(inputs.., outputs.., weights, workspace)`, and macros
`<PREFIX>_*` for every size a caller must allocate. User strings (tensor names) appear only
as escaped string literals, never in comments or identifiers. Its fixed text (the
preamble, the string type, the release and run declarations, the epilogue) is
kiln/codegen/c_src/model_header_*.h, with `${name}` where this module fills a name in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kiln.codegen.csource import c_source
from kiln.dtypes import DType
from kiln.errors import KilnError


@dataclass(frozen=True)
class Port:
    """One input or output of the entry: its name, element type and concrete shape."""
    name: str
    dtype: DType
    shape: tuple[int, ...]


def entry_prototype(source: str, symbol: str) -> str:
    """The entry's declaration as the C source writes it (const-ness included)."""
    m = re.search(rf"^int32_t {re.escape(symbol)}\((.*?)\)\s*[;{{]", source, re.M)
    if m is None:
        raise KilnError(f"entry {symbol!r} not found in the generated C source", stage="codegen")
    return f"int32_t {symbol}({m.group(1)});"


def emit_header(source: str, symbol: str, inputs: list[Port], outputs: list[Port],
                weights_bytes: int, workspace_bytes: int, prefix: str = "kiln", align: int = 64,
                weights_offset: int = 0) -> str:
    """Header text for a library whose entry `symbol` takes (inputs.., outputs.., weights, workspace).

    Everything it defines is named after `prefix` (a C identifier): the typed wrapper
    `<prefix>_run`, the macros `<PREFIX>_*` and the include guard, so the headers of
    several artifacts can be included in one program. `weights_offset`: where the raw
    weights start in the artifact's weights.npy (after NumPy's header).
    """
    up = prefix.upper()
    ports = [("INPUT", k, p) for k, p in enumerate(inputs)] + [("OUTPUT", k, p) for k, p in enumerate(outputs)]
    lines = [_fill(c_source("model_header_begin.h"), prefix=prefix, PREFIX=up, entry=symbol) + "\n",
             f"#define {up}_ALIGN {align}",
             f"#define {up}_WEIGHTS_BYTES {weights_bytes}",
             f"#define {up}_WEIGHTS_OFFSET {weights_offset}",
             f"#define {up}_WORKSPACE_BYTES {workspace_bytes}",
             f"#define {up}_NUM_INPUTS {len(inputs)}",
             f"#define {up}_NUM_OUTPUTS {len(outputs)}", ""]
    # strings: the kiln_str type when a port holds them; the arena's release when the
    # library makes strings (then it defines <symbol prefix>_strings_release)
    if any(p.dtype is DType.string for _, _, p in ports):
        lines += [_fill(c_source("model_header_strings.h")), ""]
    if re.search(rf"\b{re.escape(symbol[:-len('main')])}strings_release\(", source):
        lines += [_fill(c_source("model_header_release.h"), symbol=symbol[:-len("main")] + "strings_release"), ""]
    for kind, k, p in ports:
        elems = 1
        for d in p.shape:
            elems *= d
        pre = f"{up}_{kind}_{k}"
        lines += [f"#define {pre}_NAME {_c_string(p.name)}",
                  f"#define {pre}_DTYPE {_c_string(p.dtype.name)}",
                  f"#define {pre}_RANK {len(p.shape)}"]
        if p.shape:  # a scalar has no dims (and C has no empty initializer list)
            lines.append(f"#define {pre}_SHAPE {{{', '.join(map(str, p.shape))}}}")
        lines += [f"#define {pre}_ELEMENTS {elems}",
                  f"#define {pre}_BYTES {elems * p.dtype.itemsize}", ""]
    lines += ["/* The entry as the library defines it. */", entry_prototype(source, symbol), ""]
    if symbol.endswith("_main") and re.search(rf"^int32_t {re.escape(symbol[:-4])}interface\(", source, re.M):
        lines += ["/* Points *out at the library's static description, JSON: its inputs' and outputs'",
                  " * [dtype, shape], workspace_bytes, weights_bytes and weights_sha256 (what kiln.load",
                  " * checks). */",
                  entry_prototype(source, symbol[:-4] + "interface"), ""]
    params = [f"const {_ctype(p)}* in_{k}" for k, p in enumerate(inputs)]
    params += [f"{_ctype(p)}* out_{k}" for k, p in enumerate(outputs)]
    params += ["const uint8_t* weights", "uint8_t* workspace"]
    args = [f"({_ctype(p)}*)in_{k}" for k, p in enumerate(inputs)]
    args += [f"out_{k}" for k in range(len(outputs))] + ["(uint8_t*)weights", "workspace"]
    lines += [_fill(c_source("model_header_run.h")),
              f"static inline int32_t {prefix}_run({', '.join(params)}) {{",
              f"    return {symbol}({', '.join(args)});", "}", "", _fill(c_source("model_header_end.h"), PREFIX=up) + "\n"]
    return "\n".join(lines)


def _ctype(p: Port) -> str:
    """The C type of the tensor's bytes: narrow floats (bfloat16, float8, ...) are the
    unsigned integers NumPy/ml_dtypes store them as (bfloat16: uint16_t bits)."""
    if p.dtype.c_storage is None:
        raise KilnError(f"tensor {p.name!r} has dtype {p.dtype.name}, which C cannot express",
                        stage="codegen")
    return p.dtype.c_storage


def _c_string(s: str) -> str:
    """A C string literal of `s` (UTF-8, every non-printable or special byte escaped in octal)."""
    out = []
    for b in s.encode():
        ch = chr(b)
        out.append(ch if 32 <= b < 127 and ch not in '"\\?' else f"\\{b:03o}")
    return '"' + "".join(out) + '"'


def _fill(text: str, **names: str) -> str:
    """A fixed part of the header (its last newline dropped) with each `${key}` replaced by names[key]."""
    text = text.removesuffix("\n")
    for key, value in names.items():
        text = text.replace("${" + key + "}", value)
    return text
