"""A parallel loop's body as a function of its own, for kiln's thread pool (KILN_THREADS_IMPL=pool).

kiln_pool_for (kiln/codegen/c_src/kiln_pool.h) runs `fn(ctx, lo, hi)` over chunks of a
loop's iterations, so the C emitter (kiln.codegen.c) moves each parallel loop into a static
function: its free variables go into a context struct, and the function re-declares them as
locals, pointers `restrict` where the enclosing function's were (so the body vectorises as it
did inline). The status locals the body may set (kiln_failed for a failed allocation,
kiln_status/kiln_bad for a failed run-time check) are the chunk's own, merged into the
caller's as the chunk ends (the first failure reported wins, as with OpenMP's threads).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_STATUS = {"kiln_failed": "int32_t", "kiln_status": "int32_t", "kiln_bad": "int64_t"}


@dataclass(frozen=True)
class Outlined:
    definition: list[str]   # the context struct and the static function (C lines)
    struct: str             # the context's C type
    init: str               # its initializer at the loop's place: `{ .b0 = b0, ... }`


def outline(fn: str, body: list[str], scope: dict) -> Outlined:
    """`body` (C lines running iterations kiln_lo..kiln_hi) as static function `fn`; `scope`:
    the C names visible at the loop -> (C type, how: "value", "array", "restrict", "pointer")."""
    text = "\n".join(body)
    uses = lambda name: re.search(rf"\b{re.escape(name)}\b", text) is not None  # noqa: E731
    status = [k for k in _STATUS if uses(k)]
    if "kiln_status" in status or "kiln_bad" in status:   # kiln_fail takes both
        status = [k for k in _STATUS if k in status or k != "kiln_failed"]
    members, locals_, init = [], [], []
    for k in (k for k in scope if uses(k)):
        t, how = scope[k]
        members.append(f"{t} {k};")
        init.append(f".{k} = {k}")
        if how == "value":
            locals_.append(f"  const {t} {k} = kiln_c->{k};")
        else:
            locals_.append(f"  {t}{' restrict' if how in ('array', 'restrict') else ''} {k} = kiln_c->{k};")
    for k in status:
        members.append(f"{_STATUS[k]}* {k};")
        init.append(f".{k} = &{k}")
        locals_.append(f"  {_STATUS[k]} {k} = 0;")
    tail = []
    if "kiln_failed" in status:
        tail.append("  if (kiln_failed) __atomic_store_n(kiln_c->kiln_failed, kiln_failed, __ATOMIC_RELAXED);")
    if "kiln_status" in status:
        tail.append("  if (kiln_status) kiln_fail(kiln_c->kiln_status, kiln_c->kiln_bad, kiln_status, kiln_bad);")
    struct = f"struct {fn}_ctx"
    definition = [f"{struct} {{ {' '.join(members) or 'char none_;'} }};",
                  f"static void {fn}(void* kiln_ctx, int64_t kiln_lo, int64_t kiln_hi) {{",
                  f"  const {struct}* kiln_c = (const {struct}*)kiln_ctx;",
                  "  (void)kiln_c;", *locals_, *body, *tail, "}", ""]
    return Outlined(definition, struct, f"{{ {', '.join(init)} }}")
