"""Resource limits: how much memory and how many loop iterations a model may ask for.

An ONNX file is untrusted input: 104 bytes can ask for a 4 GiB constant, a
TiB-scale Expand, or a Loop of 10^12 iterations. kiln checks such requests
*before* doing the work, against a `Limits`:

    max_constant_bytes  any one constant: an initializer, a tensor attribute, or a
                        result constant folding would compute (estimated from its
                        inferred type before anything is computed)
    max_memory_bytes    the total memory one compiled module plans (weights +
                        workspace arena + outputs), and any one tensor the
                        interpreter or the runtime (control flow) would make
    max_trip_count      iterations of one Loop or Scan

Defaults: half the physical RAM for memory, a quarter for one constant, and
10,000,000 iterations. Each may be overridden per compile
(`kiln.compile(m, limits=Limits(...))` or a dict of the same names), by the
environment (KILN_MAX_MEMORY, KILN_MAX_CONSTANT, KILN_MAX_TRIP_COUNT; sizes
accept K/M/G/T suffixes) or by the CLI (`kiln --max-memory 8G ...`).

A violation raises `KilnResourceError` naming the node and the size; a
MemoryError is never let out as itself (`resource_guard` wraps it at the API
boundaries). The limits in force are a context variable: `compile()` sets the
model's limits while it compiles and every run of the compiled model sets them
again, so the same checks hold at run time (Loop trip counts, interpreter sizes).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
import re
from dataclasses import dataclass, fields, replace

from kiln.errors import KilnError

DEFAULT_TRIP_COUNT = 10_000_000
_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_ENV = {"max_memory_bytes": "KILN_MAX_MEMORY", "max_constant_bytes": "KILN_MAX_CONSTANT",
        "max_trip_count": "KILN_MAX_TRIP_COUNT"}


class KilnResourceError(KilnError):
    """A model asked for more memory or iterations than the limits in force allow."""


def physical_memory() -> int:
    """Bytes of physical RAM (os.sysconf); 8 GiB where the system does not say."""
    try:
        n = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        if n > 0:
            return int(n)
    except (ValueError, OSError, AttributeError):
        pass
    return 8 << 30


def parse_size(text: str | int, what: str = "size") -> int:
    """'8G', '512M', '1000' -> bytes (binary suffixes, optional trailing 'B' or 'iB')."""
    if isinstance(text, int) and not isinstance(text, bool):
        n = text
    else:
        m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*", str(text), re.IGNORECASE)
        if not m:
            raise KilnError(f"{what}: {text!r} is not a size (e.g. 1000000, 512M, 8G)")
        n = int(m.group(1)) * _SUFFIX[m.group(2).upper()]
    if n <= 0:
        raise KilnError(f"{what}: must be positive, got {text!r}")
    return n


@dataclass(frozen=True)
class Limits:
    max_memory_bytes: int
    max_constant_bytes: int
    max_trip_count: int

    @classmethod
    def default(cls) -> "Limits":
        """Limits from the environment, else from the machine's RAM."""
        ram = physical_memory()
        base = {"max_memory_bytes": ram // 2, "max_constant_bytes": ram // 4,
                "max_trip_count": DEFAULT_TRIP_COUNT}
        for name, var in _ENV.items():
            if os.environ.get(var):
                base[name] = parse_size(os.environ[var], var)
        return cls(**base)

    @classmethod
    def of(cls, given) -> "Limits":
        """None (defaults), a Limits, or a dict overriding some fields of the defaults."""
        if given is None:
            return _DEFAULT[0] or cls.default()
        if isinstance(given, Limits):
            return given
        if isinstance(given, dict):
            known = {f.name for f in fields(cls)}
            unknown = sorted(set(given) - known)
            if unknown:
                raise KilnError(f"unknown limit(s) {unknown}; known: {sorted(known)}")
            return replace(cls.of(None), **{k: parse_size(v, k) for k, v in given.items()})
        raise KilnError(f"limits must be a kiln.limits.Limits or a dict, got {type(given).__name__}")


_CURRENT: contextvars.ContextVar[Limits | None] = contextvars.ContextVar("kiln_limits", default=None)
_DEFAULT: list[Limits | None] = [None]   # process-wide (every thread): set_default


def current() -> Limits:
    """The limits in force (those of the compile or run under way, else the defaults)."""
    return _CURRENT.get() or Limits.of(None)


def set_default(limits: Limits | dict | None) -> None:
    """Process-wide defaults (the CLI's --max-* flags); None goes back to env/RAM defaults."""
    _DEFAULT[0] = None if limits is None else Limits.of(limits)


class use:
    """`with use(limits):` makes `limits` the ones in force, and turns a MemoryError into a
    KilnResourceError. A class, not a generator: every model run enters it, and a generator
    context manager cost several µs of a tiny model's call."""
    __slots__ = ("limits", "token")

    def __init__(self, limits: Limits | None):
        self.limits = limits

    def __enter__(self) -> None:
        self.token = _CURRENT.set(self.limits or current())

    def __exit__(self, kind, exc, tb) -> None:
        _CURRENT.reset(self.token)
        if kind is not None and issubclass(kind, MemoryError):
            raise _out_of_memory(exc, None) from None


@contextlib.contextmanager
def resource_guard(stage: str | None = None):
    """At an API boundary: a MemoryError leaves as a KilnResourceError saying what to do."""
    try:
        yield
    except MemoryError as e:
        raise _out_of_memory(e, stage) from None


def _out_of_memory(e: MemoryError, stage: str | None) -> KilnResourceError:
    return KilnResourceError(f"out of memory ({e or 'MemoryError'}); the model asks for more "
                             "memory than this machine has: lower the limits "
                             "(KILN_MAX_MEMORY) or use smaller inputs", stage=stage)


def nbytes(shape, itemsize: int) -> int | None:
    """Bytes of a tensor of static `shape` (None if some dim is symbolic)."""
    if shape is None or any(not isinstance(d, int) for d in shape):
        return None
    return math.prod(max(int(d), 0) for d in shape) * int(itemsize)


def fmt(n: int) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit} ({n:,} bytes)"
    return f"{n} bytes"


def check_constant(size: int, what: str, *, node: str | None = None, op: str | None = None,
                   stage: str | None = None) -> None:
    """Refuse one constant of `size` bytes above the constant cap."""
    _check(size, current().max_constant_bytes, f"{what} would hold", "the limit on one constant",
           "max_constant_bytes", node, op, stage)


def check_memory(size: int, what: str, *, node: str | None = None, op: str | None = None,
                 stage: str | None = None) -> None:
    """Refuse a request for `size` bytes above the memory cap."""
    _check(size, current().max_memory_bytes, f"{what} would take", "the memory limit",
           "max_memory_bytes", node, op, stage)


def _check(size, cap, what, limit, name, node, op, stage) -> None:
    if size > cap:
        raise KilnResourceError(f"{what} {fmt(size)}, above {limit} of {fmt(cap)} (raise it with "
                                f"{_ENV[name]} or limits={{'{name}': ...}})", node=node, op=op, stage=stage)


def check_trips(count: int, what: str, *, node: str | None = None, op: str | None = None) -> None:
    """Refuse a Loop/Scan that reaches `count` iterations above the trip-count cap."""
    cap = current().max_trip_count
    if count > cap:
        raise KilnResourceError(f"{what}: {count:,} iterations, above the limit of {cap:,} "
                                f"(raise it with KILN_MAX_TRIP_COUNT or "
                                f"limits={{'max_trip_count': ...}})", node=node, op=op, stage="run")


def check_planned(weights: int, workspace: int, outputs: list, graph=None,
                  arena=None) -> None:
    """Before building or loading a module: weights + workspace arena + outputs within the
    memory limit (the error names the largest output or arena buffer, when known)."""
    from kiln.dtypes import DType  # noqa: PLC0415
    sizes = [nbytes(tuple(s), DType.from_name(d).itemsize) or 0 for s, d in outputs]
    where = {}
    if graph is not None:
        made = {v.id: (n, v) for n in graph.nodes for v in n.outputs if v is not None}
        big = [(size, graph.outputs[k].id) for k, size in enumerate(sizes)]
        big += [(b.size, b.key) for b in (arena.buffers if arena is not None else ())]
        if big:
            size, key = max(big, key=lambda sk: sk[0])
            if key in made:
                n, v = made[key]
                where = dict(node=n.name, op=n.op)
    check_memory(int(weights) + int(workspace) + sum(sizes),
                 f"the compiled module's planned memory (weights {int(weights):,} + workspace "
                 f"{int(workspace):,} + outputs {sum(sizes):,} bytes)", stage="lower", **where)
