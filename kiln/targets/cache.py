"""A persistent cache of whole compiled modules, keyed by what determines them.

Lowering a model in Python costs seconds; a warm compile should not. The key is a
sha256 of the specialised graph's canonical form (kiln.graph.canonical: structure,
types, names, opsets, every byte of every constant and tensor attribute, subgraphs
included), the compile-time known values, kiln's own source (a changed lowering
invalidates) and the C toolchain settings. An entry is a JSON manifest beside the cached
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

from kiln.graph.canonical import digest
from kiln.graph.ir import Graph

KEY_VERSION = "kiln-module-key 2"


@functools.lru_cache(maxsize=1)
def _kiln_source_digest() -> str:
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(str(p.relative_to(root)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def graph_key(graph: Graph, known: dict) -> str:
    """sha256 of everything lowering reads from a specialised graph: its canonical form
    (every constant's and tensor attribute's bytes, subgraphs, names, types, opsets),
    the compile-time known values, kiln's source and the C toolchain."""
    from kiln.codegen.build import _cc, _flags, compiler_version
    from kiln.codegen.cpu import cpu_features
    cc, flags = _cc(None), _flags(None)
    toolchain = (_kiln_source_digest(), cc, flags, compiler_version(tuple(cc)), sorted(cpu_features()),
                 # lowerings read these to decide when forking threads pays (kiln/ops/nn.py)
                 os.environ.get("OMP_WAIT_POLICY", ""), os.environ.get("GOMP_SPINCOUNT", ""))
    return digest(KEY_VERSION, toolchain, graph, known=known)


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
