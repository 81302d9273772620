"""A persistent cache of whole compiled modules, keyed by what determines them.

Lowering a model in Python costs seconds; a warm compile should not. The key
hashes the specialised graph's structure and types, its constants' bytes, the
compile-time known values, kiln's own source (a changed lowering invalidates),
and the C toolchain settings. An entry is a JSON manifest beside the cached
shared library: entry symbol, output types, arena size, call descriptions and
where each constant goes in the weights blob (rebuilt from the graph on load).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path

import numpy as np

from kiln.graph.ir import Graph


@functools.lru_cache(maxsize=1)
def _kiln_source_digest() -> str:
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(str(p.relative_to(root)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def graph_key(graph: Graph, known: dict) -> str:
    """A digest of everything lowering reads from a specialised graph."""
    from kiln.codegen.build import _cc, _flags, compiler_version
    from kiln.codegen.cpu import cpu_features
    h = hashlib.sha256()
    cc, flags = _cc(None), _flags(None)
    for part in (_kiln_source_digest(), " ".join(cc), " ".join(flags), compiler_version(tuple(cc)),
                 ",".join(sorted(cpu_features())),
                 # lowerings read these to decide when forking threads pays (kiln/ops/nn.py)
                 os.environ.get("OMP_WAIT_POLICY", ""), os.environ.get("GOMP_SPINCOUNT", "")):
        h.update(part.encode() + b"\0")
    const_ids = {}
    for v in graph.constants():
        const_ids[v.id] = len(const_ids)
        h.update(f"c{v.type}".encode())
        h.update(np.ascontiguousarray(v.const).tobytes() if v.const.dtype != object else repr(v.const).encode())

    def ref(v):
        if v is None:
            return "_"
        if v.id in const_ids:
            return f"c{const_ids[v.id]}"
        return f"{v.name}:{v.type}"

    for v in graph.inputs:
        h.update(f"in {ref(v)}\n".encode())
    for _, n in graph.walk():
        h.update(f"{n.domain}::{n.op} {[ref(v) for v in n.inputs]} -> {[ref(v) for v in n.outputs]} "
                 f"{sorted((k, repr(a)) for k, a in n.attrs.items())}\n".encode())
        for v in n.inputs:
            if v is not None and v.id in known and v.const is None:
                h.update(np.ascontiguousarray(known[v.id]).tobytes())
    h.update(f"out {[ref(v) for v in graph.outputs]}".encode())
    return h.hexdigest()[:40]


def _path(key: str) -> Path:
    from kiln.codegen.build import cache_dir
    return cache_dir() / "modules" / f"{key}.json"


def load(key: str) -> dict | None:
    p = _path(key)
    try:
        manifest = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    return manifest if os.path.exists(manifest.get("library", "")) else None


def store(key: str, manifest: dict) -> None:
    p = _path(key)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{key}.", dir=p.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(manifest, f)
    os.replace(tmp, p)
