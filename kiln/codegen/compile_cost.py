"""How long the C compiler is guessed to take over a function (kiln.codegen.c balances a
module's translation units by it)."""

from __future__ import annotations

import math
import re

_UNROLL = re.compile(r"#pragma GCC unroll (\d+)")
_FOR = re.compile(r"\bfor\s*\(")
# a C function's definition: its head at the start of a line, its body opened on that line
_DEFINITION = re.compile(r"^[A-Za-z_][^;\n]*\)\s*\{\s*$", re.M)
# what GCC takes over a function however small, in statements' worth (fitted below)
PER_FUNCTION = 24


def compile_cost(body: str) -> float:
    """A guess at how long the C compiler takes over a function (or a text of several: its
    outlined parallel loops), in statements: its statements once the `#pragma GCC unroll`
    loops are unrolled, plus PER_FUNCTION for each function it defines. Fitted to the -O3
    CPU time of the benchmark models' 76 kernels (1-108 ms each; about 11 ms a function and
    0.47 ms a statement): off by 11 ms on average, where memory references to the power 1.5
    (the guess before) were off by 16 and split ResNet-18 into units of 0.34 and 0.47 s (now
    0.38 and 0.42 s), and text length by 39. Unrolling is what it must see: MobileNetV2's 2 KB
    depthwise kernels unrolled 126 ways took 0.8-1.8 s each, its 2 KB pointwise ones 0.1 s."""
    stack: list[int] = []
    pending, stmts = 1, 0
    for line in body.split("\n"):
        m = _UNROLL.search(line)
        if m:
            pending = int(m.group(1))
            continue
        stmts += max(0, line.count(";") - 2 * len(_FOR.findall(line))) * math.prod(stack)
        for _ in range(line.count("}")):
            if stack:
                stack.pop()
        for _ in range(line.count("{")):
            stack.append(pending)
            pending = 1
    return stmts + PER_FUNCTION * len(_DEFINITION.findall(body))
