"""The first lines of every C translation unit kiln writes: the C headers, glibc's vector
math declarations and kiln's runtime (kiln_runtime.h). Apart from kiln.codegen.c so that the
toolchain's probe (kiln.codegen.toolchain), which compiles them, needs no code generator: a
compile starts it before anything else, and a warm one finds its answer without importing one."""

from __future__ import annotations

from kiln.codegen.csource import c_source

# glibc's vector math (libmvec): declared `simd` so `#pragma omp simd` loops call the
# 4/8/16-lane variants (<= 4 ulp) instead of one scalar call per element; only when
# the build found libmvec (kiln.codegen.build adds -DKILN_MVEC -lmvec).
MVEC_FUNCS = ("exp log sin cos tan pow tanh erf erfc expm1 log1p exp2 log2 log10 asin acos atan "
              "sinh cosh asinh acosh atanh atan2").split()
MVEC_DECLS = "".join(
    f"#pragma omp declare simd notinbranch\n{t} {f}{sfx}({', '.join([t] * (2 if f in ('pow', 'atan2') else 1))});\n"
    for f in MVEC_FUNCS for t, sfx in (("float", "f"), ("double", "")))

UNIT_START = "/* kiln: C translation unit */"   # first line of every unit emit_c(_units) writes
FUNCTIONS = "/* kiln: functions */"           # after the unit's shared declarations

# a unit's first lines (declaring kiln's runtime); PRELUDE, with its definitions: one unit a library
UNIT_PRELUDE = (UNIT_START + """
#include <stdint.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#ifdef KILN_MVEC
""" + MVEC_DECLS + "#endif\n" + c_source("kiln_runtime.h"))
PRELUDE = UNIT_PRELUDE + c_source("kiln_runtime_defs.h")
