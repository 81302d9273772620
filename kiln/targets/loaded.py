"""Cached modules loaded as the runtime's NativeModules (kiln.compiler's stage "load"): a module
cache entry over the weights placed from its graph (`load`), a whole static model's entry over
the weights blob it keeps (`cached_whole`), or a module whose optimised build is under way in
this process, served at its quick tier (kiln.targets.tiered)."""

from __future__ import annotations

import numpy as np

from kiln.errors import KilnError
from kiln.graph.ir import Graph
from kiln.limits import check_planned
from kiln.runtime.pages import zeroed
from kiln.timing import stage


def load(graph: Graph, manifest: dict):
    """Stage "load": a (schema-checked) module cache entry as the runtime's NativeModule,
    the weights placed in a blob and the library verified."""
    with stage("load"):
        return _load(graph, manifest)


def _load(graph: Graph, manifest: dict):
    consts = graph.constants()
    # string constants are not in the blob (a kernel of the library writes them)
    raws = [np.zeros(0, np.uint8) if c.const.dtype == object else
            np.ascontiguousarray(c.const).view(np.uint8).reshape(-1) for c in consts]
    size = manifest["weights_bytes"]
    if size > sum(r.size + 64 for r in raws) + 64:
        raise KilnError(f"weights blob of {size} bytes for {len(consts)} constants", stage="cache")
    blob = zeroed(size)     # in huge pages where the kernel offers them (kiln.runtime.pages says why)
    for index, offset in manifest["weights"]:
        if index >= len(raws) or offset + raws[index].size > size:
            raise KilnError(f"constant {index} at offset {offset} lies outside the weights", stage="cache")
        blob[offset:offset + raws[index].size] = raws[index]
    return native_module(manifest, [(v.type.shape, v.type.dtype.name) for v in graph.inputs], blob)


def native_module(manifest: dict, inputs: list, blob: np.ndarray):
    """The runtime's NativeModule of a built module (kiln.compiler.Built.manifest()) over weights `blob`."""
    from kiln.runtime.native import NativeModule  # noqa: PLC0415
    from kiln.targets.cache import library_path  # noqa: PLC0415
    module = NativeModule(str(library_path(manifest)), manifest["library_sha256"], manifest["entry"], inputs,
                          [(tuple(s), d) for s, d in manifest["outputs"]], blob,
                          manifest["workspace_bytes"], manifest["calls"], manifest.get("errors"))
    module.info = manifest  # what was built: kernels, fused groups, arena (for reports)
    return module


def _under_way(key: str):
    """The module under `key` whose optimised build runs in this process (served at its quick
    tier meanwhile: kiln.targets.tiered), or None."""
    from kiln.targets.tiered import pending  # noqa: PLC0415
    return pending(key)


def cached(graph: Graph, key: str):
    """The module cache's entry `key` loaded (or its build under way in this process: served
    at its quick tier), or None (none, or damaged: build it again)."""
    from kiln.targets import cache  # noqa: PLC0415
    if (under_way := _under_way(key)) is not None:
        return under_way
    with stage("cache load"):
        manifest = cache.load(key)
    if manifest is None:
        return None
    check_planned(manifest["weights_bytes"], manifest["workspace_bytes"],
                  [(s, d) for s, d in manifest["outputs"]])   # a limit, not damage: raised as is
    try:
        return load(graph, manifest)
    except KilnError:
        return None   # a truncated, garbage or inconsistent entry: build it again


def cached_whole(key: str):
    """The native module cached whole under compile key `key` (kiln.compiler.whole_key), its weights
    blob as built (or its build under way in this process: served at its quick tier), or None
    (none, or damaged: build it again)."""
    from kiln.targets import cache  # noqa: PLC0415
    if (under_way := _under_way(key)) is not None:
        return under_way
    with stage("cache load"):
        found = cache.load_whole(key)
    if found is None:
        return None
    entry, blob = found
    manifest = entry["module"]
    check_planned(manifest["weights_bytes"], manifest["workspace_bytes"], [(s, d) for s, d in manifest["outputs"]])
    try:
        with stage("load"):
            module = native_module(manifest, [(tuple(s), d) for _, d, s, _ in entry["inputs"]], blob)
    except KilnError:
        return None   # a library damaged or gone: build it again
    module.specs = entry["inputs"], entry["outputs"]
    return module
