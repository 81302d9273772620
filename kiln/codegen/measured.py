"""Where kiln keeps what it measured of this machine (kiln.codegen.fork_cost, stream_cost), and
how an environment variable overrides a measurement."""

from __future__ import annotations

import json
import os
from pathlib import Path

from kiln.codegen.cachedir import check_private, private_dir
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
