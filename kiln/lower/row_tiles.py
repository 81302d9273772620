"""Register tiles picked per call by a GEMM's run-time row count (shape-generic modules).

A GEMM whose row count R is symbolic (a transformer's batch x seq rows) is tiled for
R's hint (kiln.loops.symbols): 6 rows of 4 vectors at the AVX-512 Zen 4's 32 registers.
At small R that pads: 16 rows run as 3 tiles of 6 (18 rows of FMAs), where the module
specialised to 16 rows takes 2 tiles of 8, and 10 rows as 2 x 6 instead of 2 x 5. So
the generic module (kiln.lower.generic) also builds the GEMM's kernel with a few other
row tiles, each lowered as if R were the most rows it serves (its loop order and fork
decisions follow), and its entry picks one per call by the same cost choose_tile
minimises: row blocks x (tile rows + 1), x SPILL_COST for a tile past the register
budget, in integers (x20 / x21) so Python and C agree exactly. No new compile: every
variant is in the one module.

Which tiles: the ones a module specialised to R rows would take, for R from half the
hint's tile up to ROW_TILE_ROWS (past it the hint's tile pads under 3%), greedily by the
relative cost they save summed over those R, at most ROW_TILE_VARIANTS of them (each a
copy of the kernel for the C compiler) and each saving at least ROW_TILE_MIN_GAIN; plus the hint's own tile lowered for at most ROW_TILE_ROWS rows
where that gives other code (the loop over the weight's panels outside the row blocks).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from dataclasses import dataclass
from typing import Callable

ROW_TILE_ROWS = 256      # row counts the variants are chosen for (and picked at, at run time)
ROW_TILE_VARIANTS = 3    # other tiles than the hint's, at most, per GEMM kernel
ROW_TILE_MIN_GAIN = 0.5  # a tile's saving summed over 1..ROW_TILE_ROWS rows (fractions of the cost)
SPILL_WEIGHT = (20, 21)  # choose_tile's SPILL_COST (1.05) as integer weights: within / past the budget


def tile_cost(rows, mr: int, spill: int):
    """What `rows` rows cost tiled `mr` at a time: row blocks x (mr + 1), weighted x21 past the
    register budget `spill`, else x20. `rows` an int or an index Expr (the run-time choice)."""
    return (rows + (mr - 1)) // mr * ((mr + 1) * SPILL_WEIGHT[mr > spill])


def best_tile(rows: int, tiles, spill: int) -> int:
    """The tile of `tiles` that costs least at `rows` (ties: the larger, as choose_tile)."""
    return min(tiles, key=lambda m: (tile_cost(rows, m, spill), -m))


@dataclass(frozen=True)
class RowTiles:
    """A GEMM over the symbolic row count `rows` (an Expr over symbol vars), tiled `mr` rows
    at a time at its hint, and the variants worth building: `tiles`, ((mr, rows it is
    lowered for), ...), chosen among `choice` (mr included) by `tile_cost` at run time."""
    rows: object
    mr: int
    spill: int
    choice: tuple
    tiles: tuple

    def condition(self, m: int):
        """The run-time condition (a bool Expr over the symbol vars) under which tile `m` is
        the one taken: it costs least of `choice` at the run-time row count."""
        from kiln.loops.expr import as_expr  # noqa: PLC0415
        rows = as_expr(self.rows)
        cond = rows <= ROW_TILE_ROWS
        mine = tile_cost(rows, m, self.spill)
        for j in self.choice:
            if j != m:
                other = tile_cost(rows, j, self.spill)
                cond = cond & ((mine <= other) if m > j else (mine < other))
        return cond


def plan_row_tiles(rows, mr: int, spill: int, pick: Callable[[int], int]) -> RowTiles | None:
    """The RowTiles of a GEMM over symbolic `rows` tiled `mr` at its hint, `pick(r)` being the
    tile a module specialised to r rows takes; None when no other tile is worth a variant.
    Row counts under half the hint's tile are left to it: there the GEMM streams its weight
    once for a few rows (memory-bound), so the padded rows' FMAs cost little."""
    span = range(mr // 2 + 1, ROW_TILE_ROWS + 1)
    plan = _plan(mr, spill, tuple(pick(r) for r in span))
    return None if plan is None else RowTiles(rows, mr, spill, *plan)


@functools.lru_cache(maxsize=256)
def _plan(mr: int, spill: int, picks: tuple) -> tuple | None:
    """(choice, tiles) of `plan_row_tiles` for the tiles `picks` a specialised module takes at
    mr // 2 + 1, mr // 2 + 2, ... rows."""
    span = range(mr // 2 + 1, mr // 2 + 1 + len(picks))
    cost = {m: [tile_cost(r, m, spill) for r in span] for m in {mr, *picks}}
    chosen, now = [mr], cost[mr]
    for _ in range(ROW_TILE_VARIANTS):
        gains = {m: sum(1 - min(a, b) / a for a, b in zip(now, cost[m])) for m in cost if m not in chosen}
        m = max(gains, key=lambda m: (gains[m], m), default=None)
        if m is None or gains[m] < ROW_TILE_MIN_GAIN:
            break
        chosen.append(m)
        now = [min(a, b) for a, b in zip(now, cost[m])]
    if len(chosen) == 1:
        return None
    serves: dict = {}
    for r in span:    # each tile lowered for the most rows it serves (its other decisions then fit)
        serves[best_tile(r, chosen, spill)] = r
    return tuple(chosen), tuple((m, serves[m]) for m in chosen[1:] + chosen[:1] if m in serves)


# (forced: (mr, rows) for every GEMM over a symbolic row count, or None; log: a list the
# GEMMs over symbolic rows append their RowTiles to, or None)
_STATE = contextvars.ContextVar("kiln_row_tiles", default=(None, None))


@contextlib.contextmanager
def row_tiles(force: tuple[int, int] | None = None, log: list | None = None):
    """Inside the block, GEMMs over a symbolic row count take tile `force` = (mr, rows lowered
    for) instead of their hint's, or (`log`) append the RowTiles they would build to `log`."""
    token = _STATE.set((force, log))
    try:
        yield
    finally:
        _STATE.reset(token)


def row_tile_state() -> tuple:
    """(force, log) in effect (see `row_tiles`)."""
    return _STATE.get()
