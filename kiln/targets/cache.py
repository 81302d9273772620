"""A persistent cache of whole compiled modules, keyed by what determines them.

Lowering a model in Python costs seconds; a warm compile should not. The key is a
sha256 of the specialised graph's canonical form (kiln.graph.canonical: structure,
types, names, opsets, every byte of every constant and tensor attribute, subgraphs
included), the compile-time known values, kiln's own source (a changed lowering
invalidates), the Target (kiln.targets.target), the schedule decision overrides asked for
(kiln.lower.decisions; tuning records enter as such overrides) and the C toolchain
settings. An entry is a JSON manifest naming the C build cache's library by its key and sha256 (never by a path), the entry symbol,
output types, arena size, call descriptions and where each constant goes in the
weights blob (rebuilt from the graph on load). An entry that is unreadable, fails
its schema or whose library fails its hash is built again, never trusted.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from pathlib import Path

from kiln.codegen.cachedir import write_atomic
from kiln.errors import KilnError
from kiln.graph.canonical import digest
from kiln.graph.ir import Graph
from kiln.runtime.schema import (SHA256, SchemaError, integer, list_of, mapping, pair, record, string,
                                 validate)
from kiln.targets.target import Target

KEY_VERSION = "kiln-module-key 4"


@functools.lru_cache(maxsize=1)
def _kiln_source_digest() -> str:
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(str(p.relative_to(root)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def graph_key(graph: Graph, known: dict, target: Target, decisions: dict | None = None) -> str:
    """sha256 of everything lowering reads from a specialised graph: its canonical form
    (every constant's and tensor attribute's bytes, subgraphs, names, types, opsets),
    the compile-time known values, kiln's source, the target (features, cores, caches,
    wait policy: lowerings decide from them), the C toolchain and the schedule decisions
    asked for (kiln.lower.decisions: the values chosen are a function of these overrides
    and the rest of the key, so a tuned build is never served an untuned module)."""
    from kiln.codegen.build import _cc, _flags, compiler_version
    cc, flags = _cc(None), _flags(None, target)
    toolchain = (_kiln_source_digest(), cc, flags, compiler_version(tuple(cc)), target.key())
    asked = json.dumps(decisions or {}, sort_keys=True, default=repr)
    return digest(KEY_VERSION, toolchain, asked, graph, known=known)


def _decision_value(v, path) -> None:
    if type(v) not in (int, str, bool) or (type(v) is str and len(v) > 256):
        raise SchemaError(f"field {path}: expected a decision's value (an integer, a short string or "
                          f"a bool), found {v!r:.60}")


# what an entry must look like before any of it is used (kiln.runtime.schema)
MODULE_ENTRY = record({
    "library_key": string(r"[0-9a-f]{40}"),           # the C build cache's key: the library's path
    "library_sha256": string(SHA256),
    "entry": string(r"kiln_[A-Za-z0-9_]+"),
    "outputs": list_of(pair(list_of(integer(), 64), string(r"[a-z0-9_]+"))),
    "weights_bytes": integer(),
    "weights": list_of(pair(integer(), integer())),
    "workspace_bytes": integer(),
    "calls": list_of(string(max_len=1 << 20)),
    "errors": list_of(list_of(pair(integer(-(1 << 31), 1 << 31), string(max_len=1 << 16)))),
    "kernels": integer(),
    "arena": string(max_len=1 << 20),
    "arena_bytes": integer(), "arena_peak_live_bytes": integer(), "intermediate_bytes": integer(),
    "inplace_kernels": integer(),
    "why_not_fused": list_of(string(max_len=1 << 20)),
    "call_args": list_of(pair(string(r"kiln_[A-Za-z0-9_]+"),
                              list_of(pair(string(r"in[0-9]+|out[0-9]+|weights|workspace"), integer())))),
    # kernel -> the schedule decisions its template took (kiln.lower.decisions)
    "decisions": mapping(string(max_len=256), mapping(string(max_len=256), _decision_value), 1 << 20),
})


def _path(key: str) -> Path:
    from kiln.codegen.cachedir import private_dir
    if not re.fullmatch(r"[0-9a-f]{64}", key):
        raise KilnError(f"not a module cache key: {key!r}", stage="cache")
    return private_dir("modules") / f"{key}.json"


def library_path(manifest: dict) -> Path:
    """Where an entry's library is: made from its (checked) build key, never read as a path."""
    from kiln.codegen.cachedir import private_dir
    return private_dir("c") / f"{manifest['library_key']}.so"


def load(key: str) -> dict | None:
    """The entry stored under `key`, or None when there is none or it is damaged (then the
    caller builds it again). Its library is verified by hash when it is loaded."""
    try:
        manifest = json.loads(_path(key).read_bytes())
        validate(manifest, MODULE_ENTRY, f"module cache entry {key}")
    except (OSError, ValueError, SchemaError):
        return None
    return manifest


def store(key: str, manifest: dict) -> None:
    validate(manifest, MODULE_ENTRY, "new module cache entry")
    write_atomic(_path(key), json.dumps(manifest).encode())
