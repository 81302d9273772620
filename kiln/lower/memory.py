"""Static memory planning: place every intermediate tensor in one arena.

Buffers whose lifetimes do not overlap may share bytes. Placement is the
greedy-by-size heuristic (largest first, lowest offset that does not collide
with any already placed buffer alive at the same time), which is what TFLite
and TVM's static planners use: simple, and typically within a few percent of
the live-bytes lower bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable

from kiln.errors import KilnError


@dataclass(frozen=True)
class Lifetime:
    """A buffer of `size` bytes written at step `first` and last read at step `last`."""
    key: Hashable
    size: int
    first: int
    last: int

    def overlaps(self, other: "Lifetime") -> bool:
        return self.first <= other.last and other.first <= self.last


@dataclass(frozen=True)
class ArenaPlan:
    offsets: dict
    total: int
    lower_bound: int  # peak bytes simultaneously live: no plan can be smaller
    unshared: int     # bytes if every buffer had its own space

    def __str__(self) -> str:
        return (f"arena {self.total} B (live peak {self.lower_bound} B, "
                f"{self.unshared} B without reuse, {len(self.offsets)} buffers)")


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def peak_live_bytes(buffers: list[Lifetime], align: int = 1) -> int:
    if not buffers:
        return 0
    steps = sorted({b.first for b in buffers})
    return max(sum(_align(b.size, align) for b in buffers if b.first <= s <= b.last) for s in steps)


def plan_arena(buffers: list[Lifetime], align: int = 64) -> ArenaPlan:
    """Assign each buffer a byte offset (multiple of `align`) so that no two
    buffers alive at the same step overlap in memory."""
    for b in buffers:
        if b.size < 0 or b.last < b.first:
            raise KilnError(f"bad buffer lifetime {b}", stage="memory plan")
    placed: list[tuple[int, int, Lifetime]] = []  # (offset, end, buffer)
    offsets = {}
    for b in sorted(buffers, key=lambda b: (-b.size, b.first, str(b.key))):
        size = _align(max(b.size, 1), align)
        busy = sorted((o, e) for o, e, other in placed if other.overlaps(b))
        offset = 0
        for o, e in busy:
            if offset + size <= o:
                break
            offset = max(offset, e)
        placed.append((offset, offset + size, b))
        offsets[b.key] = offset
    total = max((e for _, e, _ in placed), default=0)
    return ArenaPlan(offsets, total, peak_live_bytes(buffers, align),
                     sum(_align(max(b.size, 1), align) for b in buffers))
