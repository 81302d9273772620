"""Tiered builds: a module compiled quickly now, its optimised build in the background.

Most of a cold compile is the C compiler at -O3 (ResNet-18 on the 2-core Sapphire Rapids VM:
3.5 s of compiler CPU beside 1.1 s of Python). Built at -Og, the same C takes 1.1 s, and its
kernels run 8x slower (ResNet-18 one thread: 227 ms against 27; -O1: 2.1 s of compiler CPU,
74 ms a run; -O0: 0.7 s, 600 ms a run). A first result comes soonest at -Og: the quick tier.
So, as language VMs run a generic version now and swap in an optimised one when it is ready,
kiln.compiler.native builds a module whose -O3 build is guessed to cost at least MIN_SECONDS
of compiler CPU twice (`QuickTier`): at -Og, returned at once, and at -O3 in a thread whose
compiler processes run at low priority (`background`); the runtime swaps the -O3 module in
between two runs (kiln.targets.tiered). Only the -O3 module is kept in the module cache, so a
warm compile loads it directly.

No quick tier where the user chose the flags ($KILN_CFLAGS) or sanitizers ($KILN_SANITIZE),
or with tier="full" (kiln.compile's option, default $KILN_TIER, else "auto").
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import shutil
from dataclasses import dataclass

from kiln.errors import KilnError

TIERS = ("auto", "full")
QUICK_LEVEL = "-Og"
# what a module's -O3 build must be guessed to cost (compiler CPU seconds, the units not in
# the object cache) before a quick build pays: below it, two builds cost more than they save
MIN_SECONDS = 0.5
# kiln.codegen.compile_cost's statements in -O3 compiler seconds (fitted there: 0.47 ms)
SECONDS_PER_STATEMENT = 0.47e-3
NICE = 10   # the background build's compiler processes: niceness added

_BACKGROUND: contextvars.ContextVar[bool] = contextvars.ContextVar("kiln_background_build", default=False)


def tier_of(tier: str | None) -> str:
    """The tier asked for: `tier`, else $KILN_TIER, else "auto"."""
    tier = tier or os.environ.get("KILN_TIER", "").strip() or "auto"
    if tier not in TIERS:
        raise KilnError(f"unknown tier={tier!r} (or $KILN_TIER); choose one of {list(TIERS)}")
    return tier


@dataclass(frozen=True)
class QuickTier:
    """The quick build's flags, and the final (-O3) build's, whose shared-kernel objects
    (kept per machine) serve the quick build where they are cached already."""
    flags: list
    final: list


def quick_tier(tier: str, target) -> QuickTier | None:
    """The quick tier's flags for `target`, or None where builds go straight to -O3."""
    from kiln.codegen.toolchain import _cc, _flags, sanitizer_flags  # noqa: PLC0415
    if tier != "auto" or os.environ.get("KILN_CFLAGS") or sanitizer_flags():
        return None
    final = _flags(None, target, _cc(None))
    if "-O3" not in final:
        return None
    return QuickTier([QUICK_LEVEL if f == "-O3" else f for f in final], final)


def worth(units: list[str], final_missing) -> bool:
    """Whether a quick build pays for translation units `units`: their -O3 compile guessed
    at MIN_SECONDS or more, counting a shared unit only if `final_missing(unit)` (its -O3
    object is neither cached nor being compiled)."""
    from kiln.codegen.c import compile_cost, is_shared_unit  # noqa: PLC0415
    statements = sum(compile_cost(u) for u in units if not is_shared_unit(u) or final_missing(u))
    return statements * SECONDS_PER_STATEMENT >= MIN_SECONDS


@contextlib.contextmanager
def background():
    """Compiler processes started in this block (this thread's) run at low priority and are
    counted as background runs (kiln.codegen.build.compiler_runs)."""
    token = _BACKGROUND.set(True)
    try:
        yield
    finally:
        _BACKGROUND.reset(token)


def in_background() -> bool:
    return _BACKGROUND.get()


def niced(argv: list) -> list:
    """`argv` run at NICE more niceness when in a background build (where `nice` exists)."""
    if not _BACKGROUND.get():
        return argv
    nice = shutil.which("nice")
    return [nice, "-n", str(NICE), *argv] if nice else argv
