"""The C header of an artifact, so a C or C++ program can link the model's library directly.

It declares the entry exactly as the generated source defines it, a typed
wrapper `<prefix>_run(inputs.., outputs.., weights, workspace)`, and macros
`<PREFIX>_*` for every size a caller must allocate. User strings (tensor names) appear only
as escaped string literals, never in comments or identifiers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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
    lines = [_PREAMBLE.format(prefix=prefix, PREFIX=up, entry=symbol),
             f"#define {up}_ALIGN {align}",
             f"#define {up}_WEIGHTS_BYTES {weights_bytes}",
             f"#define {up}_WEIGHTS_OFFSET {weights_offset}",
             f"#define {up}_WORKSPACE_BYTES {workspace_bytes}",
             f"#define {up}_NUM_INPUTS {len(inputs)}",
             f"#define {up}_NUM_OUTPUTS {len(outputs)}", ""]
    # strings: the kiln_str type when a port holds them; the arena's release when the
    # library makes strings (then it defines <symbol prefix>_strings_release)
    if any(p.dtype is DType.string for _, _, p in ports):
        lines += [_STRINGS, ""]
    if re.search(rf"\b{re.escape(symbol[:-len('main')])}strings_release\(", source):
        lines += [_RELEASE.format(symbol=symbol[:-len("main")] + "strings_release"), ""]
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
    lines += [_RUN_DOC,
              f"static inline int32_t {prefix}_run({', '.join(params)}) {{",
              f"    return {symbol}({', '.join(args)});", "}", "", _EPILOGUE.format(PREFIX=up)]
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


_PREAMBLE = """\
/* Generated by kiln: the C interface of this artifact's library (model.so), whose
 * exported symbols all start with {prefix}_ (entry: {entry}).
 *
 * Build:  cc app.c ./model.so -Wl,-rpath,'$ORIGIN' -o app
 * Memory: weights ({PREFIX}_WEIGHTS_BYTES bytes: the artifact's weights.npy from byte
 *         {PREFIX}_WEIGHTS_OFFSET on, i.e. after NumPy's header; read or mmap them as is)
 *         and a workspace of {PREFIX}_WORKSPACE_BYTES bytes, both aligned to {PREFIX}_ALIGN;
 *         inputs and outputs are dense row-major arrays of {PREFIX}_<INPUT|OUTPUT>_k_SHAPE.
 *         Narrow float types (bfloat16, float8, ...) are passed as their raw bits.
 * Calls sharing one workspace must not overlap; each thread needs its own workspace.
 */
#ifndef {PREFIX}_MODEL_H
#define {PREFIX}_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {{
#endif
"""

_STRINGS = """\
/* String tensors are arrays of kiln_str: UTF-8 bytes (not NUL-terminated) and their length. */
#ifndef KILN_STR_DEFINED
#define KILN_STR_DEFINED
typedef struct { const char* ptr; int64_t len; } kiln_str;
#endif"""

_RELEASE = """\
/* Strings the model makes live in a per-thread arena of the library; output strings may
 * point there (or into the inputs, or into the library): read (copy) them, then call
 * {symbol}() from the same thread, which frees that arena. */
int32_t {symbol}(void);"""

_RUN_DOC = """\
/* Runs the model once. Returns 0 on success, -1 when native code could not allocate
 * memory, else -s where s & 0xFFFFF is k+2 for the failing call k (the artifact manifest's
 * "kernels"[k] names its nodes) and s >> 20 that kernel's status: an input value it rejected
 * (an index out of range, integer division by zero; "kernel_errors"[k] says which), or 1023
 * for memory. kiln_error_value(&v) then gives the value it rejected (per thread). */
int32_t kiln_error_value(int64_t* out);"""

_EPILOGUE = """\
#ifdef __cplusplus
}}
#endif

#endif /* {PREFIX}_MODEL_H */
"""
