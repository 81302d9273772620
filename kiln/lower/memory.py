"""Static memory planning: place every intermediate tensor in one arena.

Buffers whose lifetimes do not overlap may share bytes. Placement is the
greedy-by-size heuristic (largest first, lowest offset that does not collide
with any already placed buffer alive at the same time), which is what TFLite
and TVM's static planners use: simple, and typically within a few percent of
the live-bytes lower bound.

In-place execution (kiln.lower.inplace) enters as `share` pairs: a buffer
written by the step that last reads another of the same size takes that
buffer's bytes; the two are planned as one buffer spanning both lifetimes.
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
    inplace: tuple = ()  # (input key, output key): the output was written over the input
    buffers: tuple = ()  # the lifetimes planned (before in-place merging)

    def __str__(self) -> str:
        return (f"arena {self.total} B (live peak {self.lower_bound} B, "
                f"{self.unshared} B without reuse, {len(self.offsets)} buffers, "
                f"{len(self.inplace)} in place)")


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def peak_live_bytes(buffers: list[Lifetime], align: int = 1) -> int:
    if not buffers:
        return 0
    steps = sorted({b.first for b in buffers})
    return max(sum(_align(b.size, align) for b in buffers if b.first <= s <= b.last) for s in steps)


def _merge_inplace(buffers: list[Lifetime], share, align: int):
    """Fold each accepted (src, dst) pair into one buffer: dst is written at the step
    that last reads src, and has its aligned size. Returns the planning buffers, the
    key each original buffer is placed under, and the accepted pairs."""
    by_key = {b.key: b for b in buffers}
    root = {b.key: b.key for b in buffers}
    span = {b.key: b for b in buffers}      # root key -> merged lifetime

    def find(k):
        while root[k] != k:
            k = root[k]
        return k
    accepted = []
    for src, dst in share:
        a, b = by_key.get(src), by_key.get(dst)
        if a is None or b is None or src == dst:
            continue
        ra, rb = find(src), find(dst)
        if ra == rb or rb != dst:           # dst already takes another buffer's bytes
            continue
        merged = span[ra]
        if merged.last != b.first or _align(merged.size, align) != _align(b.size, align) \
                or a.last != b.first:
            continue
        root[dst] = ra
        span[ra] = Lifetime(ra, max(merged.size, b.size), merged.first, b.last)
        del span[dst]
        accepted.append((src, dst))
    return list(span.values()), {k: find(k) for k in root}, tuple(accepted)


def largest_live_pair(buffers: list[Lifetime]) -> int:
    """The most bytes two buffers alive at the same step take together (one buffer's
    size if never two are live): the yardstick the arena is held to."""
    best = 0
    for s in sorted({b.first for b in buffers}):
        live = sorted((b.size for b in buffers if b.first <= s <= b.last), reverse=True)
        best = max(best, sum(live[:2]))
    return best


def plan_arena(buffers: list[Lifetime], align: int = 64, share=()) -> ArenaPlan:
    """Assign each buffer a byte offset (multiple of `align`) so that no two
    buffers alive at the same step overlap in memory.

    `share`: (src key, dst key) pairs where dst may be written over src (in-place
    execution); a pair is taken when src's last step is dst's first and the sizes
    match, else ignored."""
    for b in buffers:
        if b.size < 0 or b.last < b.first:
            raise KilnError(f"bad buffer lifetime {b}", stage="memory plan")
    given = tuple(buffers)
    unshared = sum(_align(max(b.size, 1), align) for b in buffers)
    buffers, placed_as, inplace = _merge_inplace(buffers, share, align)
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
    offsets = {k: offsets[r] for k, r in placed_as.items()}
    return ArenaPlan(offsets, total, peak_live_bytes(buffers, align), unshared, inplace, given)
