"""Ahead-of-time export: a cpu-target CompiledModel → a `.kiln` artifact.

The compiler side of AOT (the artifact's format and loader live in
`kiln.runtime.artifact`). An artifact holds one native module, so every
symbolic dim must be bound (`dims={"batch": 1}`) and no size may depend on
input values.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

import kiln
from kiln.codegen.build import DEFAULT_CFLAGS
from kiln.codegen.header import Port, emit_header
from kiln.dtypes import DType
from kiln.errors import KilnError
from kiln.runtime import artifact
from kiln.runtime.cpu import cpu_features, machine
from kiln.runtime.inputs import bind_dims, concrete_shape
from kiln.runtime.model import CompiledModel
from kiln.runtime.native import NativeModule


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
    zeros = [np.zeros(shape, DType.from_name(s.dtype).np) for s, shape in zip(model.inputs, shapes)]
    runner = program.runner_for(zeros)
    if program.value_inputs.get(tuple(shapes)) or not isinstance(runner, NativeModule):
        raise KilnError("some sizes in this model depend on input values (data-dependent shapes); "
                        "an artifact holds one native module of fixed sizes, so it cannot be saved")
    return runner


def c_source_of(native: NativeModule) -> str:
    """The C source `native` was built from (the build cache keeps it beside the library)."""
    c_path = Path(native.library_path).with_suffix(".c")
    if not c_path.exists():
        raise KilnError(f"the C source of {native.library_path} is gone from the build cache; "
                        "compile again", stage="export")
    return c_path.read_text()


def save(model: CompiledModel, path: str | os.PathLike, *, dims: dict[str, int] | None = None,
         source=None) -> dict:
    """Write `model` (target 'cpu') to `path` as a `.kiln` artifact; returns its manifest.

    `source` (the .onnx path, bytes or ModelProto it came from) is hashed into the manifest.
    """
    shapes = bind_shapes(model, dims)
    native = native_module(model, shapes)
    c_source = c_source_of(native)
    weights = native.weights.tobytes()
    ins = [Port(s.name, DType.from_name(s.dtype), shape) for s, shape in zip(model.inputs, shapes)]
    outs = [Port(s.name, DType.from_numpy(dt), shape)
            for s, (shape, dt) in zip(model.outputs, native.output_types)]
    workspace = native.workspace_bytes
    cflags = os.environ.get("KILN_CFLAGS") or DEFAULT_CFLAGS
    manifest = {
        "format": artifact.FORMAT,
        "format_version": artifact.FORMAT_VERSION,
        "kiln_version": kiln.__version__,
        "source": _source_info(source),
        "target": {"name": "cpu", "arch": machine(), "cflags": cflags,
                   "features": sorted(cpu_features()) if "native" in cflags else []},
        "entry": native.entry.__name__,
        "files": {"library": artifact.LIBRARY, "header": artifact.HEADER, "source": artifact.SOURCE,
                  "weights": artifact.WEIGHTS},
        "inputs": [_port_json(p) for p in ins],
        "outputs": [_port_json(p) for p in outs],
        "dims": dict(dims or {}),
        "weights_bytes": len(weights),
        "weights_sha256": hashlib.sha256(weights).hexdigest(),
        "workspace_bytes": workspace,
        "kernels": list(native.call_nodes),
    }
    header = emit_header(c_source, manifest["entry"], ins, outs, len(weights), workspace)
    artifact.write_artifact(path, manifest, {
        artifact.LIBRARY: Path(native.library_path).read_bytes(),
        artifact.HEADER: header.encode(),
        artifact.SOURCE: c_source.encode(),
        artifact.WEIGHTS: weights,
    })
    return manifest


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
