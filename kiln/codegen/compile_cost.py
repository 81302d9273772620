"""How long the C compiler is guessed to take over a function (kiln.codegen.c balances a
module's translation units by it)."""

from __future__ import annotations

import math
import re

_UNROLL = re.compile(r"#pragma GCC unroll (\d+)")


def compile_cost(body: str) -> float:
    """A guess at how long the C compiler takes over a function: its memory references
    once the `#pragma GCC unroll` loops are unrolled, to the power 1.5 (GCC's alias
    queries grow faster than linearly in the references of one block). Text length was a
    poor guess: MobileNetV2's 2 KB depthwise kernels unroll 126 ways and took 0.8-1.8 s
    each at -O3, its 2 KB pointwise ones 0.1 s, so two units split by length compiled in
    3.6 and 6.8 s."""
    stack: list[int] = []
    pending, refs = 1, 0
    for line in body.split("\n"):
        m = _UNROLL.search(line)
        if m:
            pending = int(m.group(1))
            continue
        refs += line.count("[") * math.prod(stack)
        for _ in range(line.count("}")):
            if stack:
                stack.pop()
        for _ in range(line.count("{")):
            stack.append(pending)
            pending = 1
    return (1 + refs) ** 1.5 + len(body) / 100
