"""Schedule decisions as data: what a schedule template chooses, by name.

A template declares each decision it makes once, at module level: a name, the
domain of legal values and a default computed from the target (None: the host)::

    PARALLEL_MIN_WORK = declare("parallel_min_work", Ints(0), lambda target: 1 << 15,
                                "work (points x reduction) below which a kernel runs serially")
    if work >= PARALLEL_MIN_WORK.value():
        stage.parallel(outer)

A heuristic that depends on the shapes passes its own choice:
`TILE.value(heuristic=best_tile)`. While a kernel is lowered (kiln.lower.kernel:
`choosing`), every value taken is recorded; the kernel keeps them beside its
schedule trace (`Kernel.decisions`, `Kernel.trace.decisions`), the module cache key
includes the overrides asked for (kiln.targets.cache), and a tuner or a test
overrides them per kernel or for all kernels (`kiln.compile(..., decisions=...)`):

    {"parallel_min_work": 1 << 20}              # every kernel that makes this decision
    {"k3_Conv": {"conv.oct": 4}}                # one kernel, by its name in the module

An override outside the domain is a KilnError naming the decision; so is one naming
a decision nobody declared, or a kernel that does not make it.
"""

from __future__ import annotations

import contextvars
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable

from kiln.errors import KilnError

# Below this much work (points x reduction size) a kernel runs serially: an OpenMP fork
# and join costs a few microseconds with spinning threads (more when they sleep), more
# than a few thousand multiply-adds take. The one threshold every template shares.
from kiln.loops.symbols import SERIAL_WORK  # noqa: E402  (one threshold for compile and run time)


@dataclass(frozen=True)
class Ints:
    """Integers in [lo, hi] (hi None: unbounded)."""
    lo: int = 0
    hi: int | None = None

    def __contains__(self, v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= self.lo and (self.hi is None or v <= self.hi)

    def __str__(self) -> str:
        return f"an integer >= {self.lo}" if self.hi is None else f"an integer in [{self.lo}, {self.hi}]"


@dataclass(frozen=True)
class OneOf:
    """One of a few values."""
    values: tuple

    def __contains__(self, v) -> bool:
        return any(v == x and type(v) is type(x) for x in self.values)

    def __str__(self) -> str:
        return f"one of {list(self.values)}"


@dataclass(frozen=True)
class Decision:
    name: str
    domain: Any                                # supports `in` and str()
    default: Callable[[Any], Any]              # target (None: the host) -> value
    doc: str = ""

    def value(self, heuristic=None):
        """The value for the kernel being lowered: its override if one was asked for,
        else `heuristic` (a template's shape-aware choice), else the target's default."""
        rec = _current.get()
        v = self.asked()
        if v is None:
            v = heuristic if heuristic is not None else self.default(rec.target if rec else None)
        if rec is not None:
            rec.chosen[self.name] = v
        return v

    def asked(self):
        """The override asked for this decision in the kernel being lowered (checked against
        the domain), or None: for a heuristic that searches around a fixed value."""
        rec = _current.get()
        if rec is None or self.name not in rec.overrides:
            return None
        v = rec.overrides[self.name]
        if v not in self.domain:
            raise KilnError(f"illegal value {v!r} for decision {self.name!r}{rec.where()}: it must be "
                            f"{self.domain}", stage="schedule")
        return v

    def illegal(self, value, why: str) -> KilnError:
        """The error for a value inside the domain that this kernel cannot take."""
        rec = _current.get()
        return KilnError(f"illegal value {value!r} for decision {self.name!r}{rec.where() if rec else ''}: "
                         f"{why}", stage="schedule")


DECISIONS: dict[str, Decision] = {}


def declare(name: str, domain, default: Callable[[Any], Any], doc: str = "") -> Decision:
    """Declare a decision (once per name: a template's module does it at import)."""
    d = Decision(name, domain, default, doc)
    if DECISIONS.setdefault(name, d) is not d:
        raise KilnError(f"decision {name!r} is declared twice")
    return d


PARALLEL_MIN_WORK = declare("parallel_min_work", Ints(0), lambda target: SERIAL_WORK,
                            "work (points x reduction size) below which a kernel runs serially")


@dataclass
class _Record:
    kernel: str
    target: Any
    overrides: dict
    chosen: dict = field(default_factory=dict)

    def where(self) -> str:
        return f" in kernel {self.kernel!r}" if self.kernel else ""


_current: contextvars.ContextVar[_Record | None] = contextvars.ContextVar("kiln_decisions", default=None)


def normalize(decisions: dict | None) -> dict:
    """Check an overrides dict's form: {decision: value} for every kernel, {kernel: {decision:
    value}} for one. Decision names must be declared (templates are imported first)."""
    import kiln.ops  # noqa: F401,PLC0415  the templates declare their decisions at import
    out = {}
    for key, v in (decisions or {}).items():
        if not isinstance(key, str):
            raise KilnError(f"decisions are keyed by name, got {key!r}")
        if isinstance(v, dict):
            for name in v:
                if not (isinstance(name, str) and name.startswith("#")):   # "#record": a note
                    _known(name)
            out[key] = dict(v)
        else:
            _known(key)
            out[key] = v
    return out


def _known(name) -> None:
    if name not in DECISIONS:
        raise KilnError(f"unknown schedule decision {name!r}; declared: {sorted(DECISIONS)}")


def for_kernel(decisions: dict, kernel: str) -> dict:
    """The overrides that apply to `kernel`: the global ones, then its own."""
    out = {k: v for k, v in decisions.items() if not isinstance(v, dict)}
    out.update(decisions.get(kernel, {}))
    return out


@contextmanager
def choosing(kernel: str, overrides: dict, target=None):
    """Record the decisions taken while lowering `kernel` (yields the record's `chosen` dict)."""
    rec = _Record(kernel, target, dict(overrides))
    token = _current.set(rec)
    try:
        yield rec.chosen
    finally:
        _current.reset(token)


def check_used(kernel: str, own: dict, chosen: dict) -> None:
    """A kernel's own override for a decision it did not make is a mistake, not a no-op."""
    unused = sorted(set(own) - set(chosen))
    if unused:
        raise KilnError(f"kernel {kernel!r} makes no decision {', '.join(map(repr, unused))}; "
                        f"it decides {sorted(chosen) or 'nothing'}", stage="schedule")


def check_kernels(decisions: dict, kernels: list[str]) -> None:
    """Overrides keyed by a kernel the module does not have are a mistake (a stale tuning record)."""
    missing = sorted(k for k, v in decisions.items() if isinstance(v, dict) and k not in kernels
                     and not k.startswith("@"))   # "@<workload>": a tuning record's (kiln.tune.apply)
    if missing:
        raise KilnError(f"decisions for kernel(s) {', '.join(map(repr, missing))}, which this module does "
                        f"not have; its kernels: {kernels}", stage="schedule")


def parallel_min_work() -> int:
    """The serial-work threshold for the kernel being lowered (a recorded decision)."""
    return PARALLEL_MIN_WORK.value()
