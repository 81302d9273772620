"""The machine signature a tuning record is valid for: what makes a schedule's speed differ.

The host's kiln.targets.Target key (architecture, -march, ISA features, cores, cache
sizes, OpenMP wait policy: everything code generation reads) plus the C compiler with
its version and the flags kiln builds with. A record measured under another signature
is never applied as the best (kiln.tune.apply) but may seed a search (kiln.tune.search).
"""

from __future__ import annotations

import functools
import hashlib
import json


@functools.lru_cache(maxsize=1)
def machine() -> dict:
    """The signature's fields (JSON-able)."""
    from kiln.codegen.build import _cc, _flags, compiler_version  # noqa: PLC0415
    from kiln.targets.target import Target  # noqa: PLC0415
    t = Target.host()
    cc = _cc(None)
    return {"target": t.key(), "cores": t.cores, "caches": [t.l1d_bytes, t.l2_bytes, t.l3_bytes],
            "compiler": compiler_version(tuple(cc)).splitlines()[0] if cc else "",
            "cflags": " ".join(_flags(None, t))}


def signature(info: dict | None = None, clock: str = "wall") -> str:
    """A short stable hash of `info` (default: this machine); records timed on one thread by
    thread CPU time (`kiln tune --clock cpu`) carry the suffix "-cpu1": their times are not the
    model's (one thread) and they leave the thread decisions at their defaults, so kiln.tune.apply
    uses them only for a workload without a record timed on the model's threads."""
    sig = hashlib.sha256(json.dumps(info or machine(), sort_keys=True).encode()).hexdigest()[:16]
    return sig if clock == "wall" else f"{sig}-{clock}1"
