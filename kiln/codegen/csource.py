"""Hand-written C as C files: every whole kernel or helper kiln pastes into generated code.

The sources live in kiln/codegen/c_src/ (shipped as package data, see pyproject.toml):
the runtime prelude every unit starts with, the `kiln_str` helpers, and the hand-written
kernels of ops that are unnatural as computes (ImageDecoder, the tree-ensemble walk,
NonMaxSuppression, ...). `c_source(name)` reads one; the module's build compiles it with
the rest of the unit (same compiler and flags, so a kernel is inlined and specialised
like generated code). What is generated per node (tables, shapes baked in as constants,
the call into a kernel) stays in Python.

A kernel whose sizes are all arguments (the Winograd convolution) is *shared*: `c_shared`
marks its definition so that the C emitter compiles it in a translation unit of its own,
whose text is the same in every module that uses that instance, and the build keeps that
unit's object in a per-machine cache (kiln.codegen.build): every layer and every model with
the same instance links one object compiled once.
"""

from __future__ import annotations

import functools
from pathlib import Path

from kiln.errors import KilnError
from kiln.runtime.threads import IMPLS

C_SRC = Path(__file__).with_name("c_src")


@functools.cache
def c_source(name: str) -> str:
    """The text of kiln/codegen/c_src/`name`."""
    try:
        return (C_SRC / name).read_text()
    except FileNotFoundError:
        raise KilnError(f"kiln's C source {name!r} is missing from {C_SRC} (an incomplete install: "
                        "the package data under kiln/codegen/c_src was not shipped)", stage="codegen") from None


def c_parallel(threads_impl: str) -> str:
    """What a hand-written kernel includes to run its parallel loops with kiln_par_for
    (kiln/codegen/c_src/kiln_par.h) on the module's threads: kiln's pool (`threads_impl`
    "pool", Target.threads_impl) or OpenMP's team. For a shared kernel's `helpers`: its unit
    is compiled apart from the module's, and declares the pool (kiln_pool_decl.h), which is
    a shared unit of every pool module (kiln.codegen.c.pool_block)."""
    return (c_source("kiln_pool_decl.h") if threads_impl == "pool" else "") + c_source("kiln_par.h")


def threads_impl_of(threads_impl: str | None) -> str:
    """Who runs a module's parallel loops: `threads_impl` as the compile's Target says
    ("omp" or kiln's "pool"), None for a kernel built by hand: the host Target's. The
    Target is the one source (lowering forks hand-written kernels on it too, and its key
    names it), so a module's code and its report agree."""
    if threads_impl is None:
        from kiln.targets.target import Target  # noqa: PLC0415
        return Target.host().threads_impl
    if threads_impl not in IMPLS:
        raise KilnError(f"threads_impl={threads_impl!r}: choose one of {', '.join(IMPLS)}",
                        stage="codegen")
    return threads_impl


def c_par_job(tag: str, var: str, extent: str, loop: str, captures: list[tuple[str, str]],
              parallel: str) -> tuple[str, str]:
    """A loop of a generated hand-written kernel's body as a kiln_par_for job on the module's
    threads (instead of a `#pragma omp parallel for` forking OpenMP's own team beside the pool):
    (the preamble: kiln_par.h, a context struct of `captures` ((C type, name): the locals the
    loop reads) and the chunk function running iterations `var` in [first, last) of `loop`,
    named by a hash of their text; the statement that replaces the loop). `parallel`: a C
    condition (a chunk per thread or one call)."""
    import hashlib  # noqa: PLC0415
    fn = f"kiln_{tag}_{hashlib.sha256(repr((var, loop, captures)).encode()).hexdigest()[:16]}"
    fields = "".join(f"  {t} {n};\n" for t, n in captures)
    unpack = "".join(f"  {t} const {n} = c->{n};\n" for t, n in captures)
    pre = (c_source("kiln_par.h") + f"#ifndef {fn.upper()}\n#define {fn.upper()}\n"
           f"typedef struct {{\n{fields}}} {fn}_ctx;\n"
           f"static void {fn}(void* ctx, int64_t first, int64_t last) {{\n"
           f"  const {fn}_ctx* c = (const {fn}_ctx*)ctx;\n{unpack}"
           f"  for (int64_t {var} = first; {var} < last; ++{var}) {{\n{loop}  }}\n}}\n#endif\n")
    call = (f"  {{ const {fn}_ctx c = {{{', '.join(n for _, n in captures)}}};\n"
            f"    kiln_par_for({fn}, (void*)&c, 0, {extent}, {parallel}); }}\n")
    return pre, call


DEFINITION = "/* kiln: definition */\n"   # in a shared kernel's file: declarations above, definition below
SHARED_BEGIN = "/* kiln: shared unit */\n"
SHARED_END = "/* kiln: end of shared unit */\n"


def c_instance(name: str, macros: dict[str, str], guard: str) -> str:
    """kiln/codegen/c_src/`name`, a kernel written against macros (its element types, its
    function's name; a key `F(v)` defines a function-like macro), instantiated: `macros` defined before the file and undefined after,
    behind the include guard `guard` (so a unit holding several such nodes compiles one
    copy; preambles are deduplicated by text)."""
    return (f"#ifndef {guard}\n#define {guard}\n" + "".join(f"#define {k} {v}\n" for k, v in macros.items())
            + c_source(name) + "".join(f"#undef {k.split('(')[0]}\n" for k in macros) + "#endif\n")


def c_shared(name: str, macros: dict[str, str], guard: str, helpers: str = "", parts: int = 1) -> str:
    """A preamble for kiln/codegen/c_src/`name`, a kernel file whose declarations come before
    the line `/* kiln: definition */` and whose definition (non-static, weak and hidden, so
    any number of units and libraries may hold it) after: the declarations instantiated
    (as c_instance), then the whole file instantiated between SHARED_BEGIN and SHARED_END.
    The emitter moves that block into a translation unit of its own (kiln.codegen.c); in one
    whole-module text it stays where it is, still valid C. `helpers`: text the definition needs
    (an instantiated header's static inline functions), placed in that unit before it.
    `parts` > 1: one block (unit, compiled in parallel) per part k, with KILN_SHARED_PART
    defined to k; the file defines in each part what that part holds (and all of it when
    KILN_SHARED_PART is not defined)."""
    text = c_source(name)
    if DEFINITION not in text:
        raise KilnError(f"kiln's C source {name!r} has no {DEFINITION.strip()} line: not a shared kernel",
                        stage="codegen")
    defs = "".join(f"#define {k} {v}\n" for k, v in macros.items())
    undefs = "".join(f"#undef {k.split('(')[0]}\n" for k in macros)
    decl = text.split(DEFINITION, 1)[0]
    blocks = [f"{SHARED_BEGIN}#ifndef {guard}\n#define {guard}\n{helpers}{defs}{text}{undefs}#endif\n{SHARED_END}"]
    if parts > 1:
        blocks = [f"{SHARED_BEGIN}#ifndef {guard}_PART{k}\n#define {guard}_PART{k}\n{helpers}{defs}"
                  f"#define KILN_SHARED_PART {k}\n{text}#undef KILN_SHARED_PART\n{undefs}#endif\n{SHARED_END}"
                  for k in range(parts)]
    return f"#ifndef {guard}_DECL\n#define {guard}_DECL\n{defs}{decl}{undefs}#endif\n" + "".join(blocks)
