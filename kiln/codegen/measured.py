"""Where kiln keeps what it measured of this machine (kiln.codegen.fork_cost, stream_cost), how
the timing loops are built and their results stored, and how an environment variable overrides
a measurement."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from kiln.codegen.cachedir import check_private, private_dir, write_atomic
from kiln.errors import KilnError


def store_dir(kind: str) -> Path:
    """Where measurements of `kind` are kept: beside kiln's default cache (~/.cache/kiln/<kind>)
    whatever KILN_CACHE_DIR says, since they describe the machine, not a compile (a new, empty
    cache directory, as a cold-compile benchmark makes, does not measure again); under
    KILN_CACHE_DIR when that one cannot be made or is not this user's alone."""
    d = Path.home() / ".cache" / "kiln" / kind
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        check_private(d)
        return d
    except (OSError, KilnError):
        return private_dir(kind)


def busy(cores: int) -> bool:
    """Whether the machine has more runnable threads than cores (a measurement would time waits
    for the CPU, not what it measures)."""
    try:
        return os.getloadavg()[0] >= cores
    except OSError:
        return False


def stored(path: Path, field: str) -> float | None:
    """The positive number `field` of the measurement stored at `path`, or None (none stored,
    or damaged)."""
    try:
        with open(path) as f:
            v = json.load(f)[field]
        return float(v) if isinstance(v, (int, float)) and v > 0 else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def env_override(name: str, what: str) -> float | str | None:
    """A measurement's override in environment variable `name`: a positive number (of `what`),
    "table", or None (unset: measure); anything else a KilnError naming it."""
    v = os.environ.get(name, "").strip().lower()
    if not v:
        return None
    if v == "table":
        return "table"
    try:
        n = float(v)
    except ValueError:
        n = -1.0
    if not n > 0:
        raise KilnError(f"{name}={v!r}: give {what} (a positive number) or 'table'")
    return n


def build_loop(directory: str, name: str, source: str, flags: list[str], what: str,
               cc: list[str] | None = None) -> str:
    """Compile a timing loop's C `source` into `directory` as `name` with `flags` (after the
    source: libraries among them link); returns the executable's path, or a KilnError naming
    `what` did not compile."""
    from kiln.codegen.build import _cc  # noqa: PLC0415
    src, exe = os.path.join(directory, f"{name}.c"), os.path.join(directory, name)
    with open(src, "w") as f:
        f.write(source)
    r = subprocess.run([*(cc or _cc(None)), "-O2", src, "-o", exe, *flags], capture_output=True, text=True)
    if r.returncode != 0:
        raise KilnError(f"the {what} loop did not compile: {r.stderr.strip()[:500]}", stage="codegen")
    return exe


def measure_and_store(path: Path, field: str, measure, record: dict) -> float | None:
    """`measure()` now, kept at `path` as `field` beside `record` and when, how long and at what
    load it was taken; None (nothing kept) where it could not run (no C compiler, a loop that
    failed) or gave no positive number: the table's figure then stands."""
    t = time.perf_counter()
    try:
        v = measure()
    except (KilnError, OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None
    if not v > 0:
        return None
    write_atomic(path, json.dumps({
        field: v, **record, "load": os.getloadavg()[0], "measured_s": round(time.perf_counter() - t, 3),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }).encode())
    return v
