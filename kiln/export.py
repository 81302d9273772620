"""Ahead-of-time export: a cpu-target CompiledModel → a `.kiln` artifact.

The compiler side of AOT (the artifact's format and loader live in
`kiln.runtime.artifact`). An artifact holds one native module, so every
symbolic dim must be bound (`dims={"batch": 1}`) and no size may depend on
input values. Its library's symbols carry the artifact's name (`resnet18_main`,
`resnet18_k0_Conv`, ...) so several artifacts link into one C program.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import numpy as np

import kiln
from kiln.codegen.build import cached_source, compile_c, default_cflags
from kiln.codegen.c import (DEFAULT_PREFIX, c_identifier, single_unit, split_units, with_interface_fields,
                            with_prefix)
from kiln.codegen.header import Port, emit_header
from kiln.dtypes import DType
from kiln.errors import KilnError
from kiln.runtime import artifact
from kiln.runtime.inputs import bind_dims, concrete_shape
from kiln.runtime.model import CompiledModel
from kiln.runtime.native import NativeModule
from kiln.targets.target import Target


def bind_shapes(model: CompiledModel, dims: dict[str, int] | None) -> list[tuple[int, ...]]:
    """Each input's concrete shape, symbols replaced from `dims`; a KilnError names what is missing."""
    bound = bind_dims(model.inputs, {}, dict(dims or {}))
    return [concrete_shape(s, bound) for s in model.inputs]


def native_module(model: CompiledModel, shapes: list[tuple[int, ...]]) -> NativeModule:
    """The one native module `model` runs for inputs of `shapes` (built now if it is not yet)."""
    program = getattr(model, "program", None)
    if model.target != "cpu" or program is None:
        raise KilnError(f"only target 'cpu' makes a deployable artifact; this model is target "
                        f"{model.target!r}")
    breaks = [str(b) for b in program.pipeline.specialize(list(shapes)).breaks if b.origin]
    if breaks:
        more = f" and {len(breaks) - 4} more" if len(breaks) > 4 else ""
        raise KilnError(f"cannot save an artifact: it holds one native module of fixed sizes, but "
                        f"{'; '.join(breaks[:4])}{more}; run the .onnx instead (kiln run, kiln.compile)",
                        stage="export")
    zeros = [np.zeros(shape, DType.from_name(s.dtype).np) for s, shape in zip(model.inputs, shapes)]
    runner = program.runner_for(zeros)
    if not isinstance(runner, NativeModule):
        raise KilnError("cannot save an artifact: this model does not compile to one native module "
                        "for these shapes (it runs in stages)", stage="export")
    return runner


def c_source_of(native: NativeModule) -> str:
    """The C source `native` was built from (the build cache keeps it beside the library,
    with its sha256)."""
    source = cached_source(Path(native.library_path))
    if source is None or not split_units(source):
        raise KilnError(f"the C source of {native.library_path} is gone from the build cache or "
                        "damaged; compile again", stage="export")
    return source


def symbol_prefix(name: str | None, source=None) -> str:
    """The artifact's C symbol prefix: `name` (must be a C identifier), else the source
    file's stem made one (`resnet-18.onnx` -> `resnet_18`), else `model`."""
    if name is not None:
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name):
            raise KilnError(f"artifact name {name!r} must be a C identifier (a letter, then letters, "
                            "digits or _): it prefixes the library's symbols")
        return name
    if isinstance(source, (str, os.PathLike)):
        return c_identifier(Path(source).stem)
    return "model"


def renamed(native: NativeModule, prefix: str, target: Target, **interface: str) -> tuple[str, Path, str]:
    """(C source as one unit, library, entry symbol) of `native` with its symbols
    prefixed `prefix`_ and `interface` fields added to what `prefix`_interface reports:
    rebuilt for `target` from the renamed source (cached by content hash)."""
    units = [with_interface_fields(with_prefix(u, prefix), prefix, **interface)
             for u in split_units(c_source_of(native))]
    library = compile_c(units, target)
    entry = prefix + native.entry.__name__.removeprefix(DEFAULT_PREFIX)
    return single_unit("".join(units)), library, entry


def save(model: CompiledModel, path: str | os.PathLike, *, dims: dict[str, int] | None = None,
         source=None, name: str | None = None) -> dict:
    """Write `model` (target 'cpu') to `path` as a `.kiln` artifact; returns its manifest.

    `source` (the .onnx path, bytes or ModelProto it came from) is hashed into the manifest.
    `name` (a C identifier; default: the source file's stem) prefixes every symbol of the
    artifact's library and header: `<name>_main`, `<name>_run`, `<NAME>_WEIGHTS_BYTES`...
    """
    if getattr(model, "shapes", None) == "tiered":    # its specialised modules are the artifact's
        model = model.special
    elif getattr(model, "shapes", None) == "generic":
        raise KilnError("a shapes='generic' model is not saved as an artifact yet (its arena is planned "
                        "per shape by the compiler); compile with shapes='specialize' and save that")
    prefix = symbol_prefix(name, source)
    shapes = bind_shapes(model, dims)
    native = native_module(model, shapes)
    weights = native.weights.tobytes()
    # the library reports its weights' hash: other weights under a rewritten manifest are refused
    target = model.program.target   # the CPU its code was generated for
    c_source, library, entry = renamed(native, prefix, target, weights_sha256=hashlib.sha256(weights).hexdigest())
    ins = [Port(s.name, DType.from_name(s.dtype), shape) for s, shape in zip(model.inputs, shapes)]
    outs = [Port(s.name, DType.from_numpy(dt), shape)
            for s, (shape, dt) in zip(model.outputs, native.output_types)]
    workspace = native.workspace_bytes
    cflags = os.environ.get("KILN_CFLAGS") or default_cflags(target)
    manifest = {
        "format": artifact.FORMAT,
        "format_version": artifact.FORMAT_VERSION,
        "kiln_version": kiln.__version__,
        "source": _source_info(source),
        "target": target_json(target, cflags),
        "name": prefix,
        "entry": entry,
        "files": {"library": artifact.LIBRARY, "header": artifact.HEADER, "source": artifact.SOURCE,
                  "weights": artifact.WEIGHTS},
        "inputs": [_port_json(p) for p in ins],
        "outputs": [_port_json(p) for p in outs],
        "dims": dict(dims or {}),
        "weights_bytes": len(weights),
        "weights_sha256": hashlib.sha256(weights).hexdigest(),
        "workspace_bytes": workspace,
        "kernels": list(native.call_nodes),
        "kernel_errors": [sorted([c, m] for c, m in e.items()) for e in native.call_errors],
    }
    tuned = {k: d["#record"] for k, d in (getattr(native, "info", None) or {}).get("decisions", {}).items()
             if "#record" in d}
    if tuned:   # built with tuning records (kiln.compile(tuning=...)): which ones
        manifest["tuning_records"] = tuned
    weights_file, weights_offset = artifact.weights_npy(weights)
    manifest["weights_offset"] = weights_offset
    header = emit_header(c_source, entry, ins, outs, len(weights), workspace, prefix,
                         weights_offset=weights_offset)
    artifact.write_artifact(path, manifest, {
        artifact.LIBRARY: library.read_bytes(),
        artifact.HEADER: header.encode(),
        artifact.SOURCE: c_source.encode(),
        artifact.WEIGHTS: weights_file,
    })
    return manifest


def target_json(target: Target, cflags: str) -> dict:
    """The manifest's `target`: what the library was built for, and the CPU features the
    loader requires (the target's own unless $KILN_CFLAGS picked no -march: then none)."""
    return {"name": "cpu", "arch": target.arch, "cflags": cflags,
            "features": sorted(target.features) if "-march=" in cflags else [],
            "cpu": target.name, "key": target.key()}


def _port_json(p: Port) -> dict:
    return {"name": p.name, "dtype": p.dtype.name, "shape": list(p.shape)}


def _source_info(source) -> dict:
    """Name and sha256 of the model the artifact was compiled from (bytes as given)."""
    if source is None:
        return {"file": None, "sha256": None}
    if isinstance(source, (str, os.PathLike)):
        return {"file": os.path.basename(os.fspath(source)),
                "sha256": hashlib.sha256(Path(source).read_bytes()).hexdigest()}
    data = source if isinstance(source, bytes) else source.SerializeToString()
    return {"file": None, "sha256": hashlib.sha256(data).hexdigest()}
