"""Hand-written C as C files: every whole kernel or helper kiln pastes into generated code.

The sources live in kiln/codegen/c_src/ (shipped as package data, see pyproject.toml):
the runtime prelude every unit starts with, the `kiln_str` helpers, and the hand-written
kernels of ops that are unnatural as computes (ImageDecoder, the tree-ensemble walk,
NonMaxSuppression, ...). `c_source(name)` reads one; the module's build compiles it with
the rest of the unit (same compiler and flags, so a kernel is inlined and specialised
like generated code). What is generated per node (tables, shapes baked in as constants,
the call into a kernel) stays in Python.
"""

from __future__ import annotations

import functools
from pathlib import Path

from kiln.errors import KilnError

C_SRC = Path(__file__).with_name("c_src")


@functools.cache
def c_source(name: str) -> str:
    """The text of kiln/codegen/c_src/`name`."""
    try:
        return (C_SRC / name).read_text()
    except FileNotFoundError:
        raise KilnError(f"kiln's C source {name!r} is missing from {C_SRC} (an incomplete install: "
                        "the package data under kiln/codegen/c_src was not shipped)", stage="codegen") from None


def c_instance(name: str, macros: dict[str, str], guard: str) -> str:
    """kiln/codegen/c_src/`name`, a kernel written against macros (its element types, its
    function's name; a key `F(v)` defines a function-like macro), instantiated: `macros` defined before the file and undefined after,
    behind the include guard `guard` (so a unit holding several such nodes compiles one
    copy; preambles are deduplicated by text)."""
    return (f"#ifndef {guard}\n#define {guard}\n" + "".join(f"#define {k} {v}\n" for k, v in macros.items())
            + c_source(name) + "".join(f"#undef {k.split('(')[0]}\n" for k in macros) + "#endif\n")
