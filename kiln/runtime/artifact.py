"""Deployable artifacts: one `.kiln` file that runs with numpy and ctypes alone.

A `.kiln` file is a zip archive (`unzip model.kiln -d model/` opens it):

    manifest.json   what is inside: format version, kiln version, source model hash,
                    target (arch, CPU features the library needs, C flags), name (the
                    C symbol prefix), entry symbol, inputs/outputs (name, dtype, shape),
                    weights and workspace sizes
    model.so        the native module: every kernel (`NAME_k0_Conv`, ...) and the entry
                    `NAME_main`, NAME being the artifact's name (`kiln compile --name`)
    model.h         C header declaring the entry, a typed `NAME_run` and `NAME_*` size macros
    model.c         the C source the library was built from, one translation unit
                    (rebuild it elsewhere: cc -O3 -fopenmp -shared -fPIC model.c -lm)
    weights.npy     every constant, one 1-D uint8 array in NumPy's .npy format (no pickle);
                    its raw bytes start at manifest["weights_offset"] (C: NAME_WEIGHTS_OFFSET)

This module reads and writes the container and loads it; `kiln.export` makes
one from a compiled model. It imports nothing of the compiler.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from kiln.errors import KilnError
from kiln.runtime.cpu import machine, missing_features
from kiln.runtime.model import CompiledModel, TensorSpec
from kiln.runtime.native import NativeModule

FORMAT = "kiln-artifact"
FORMAT_VERSION = 2  # 2: weights as weights.npy (1: a raw weights.bin)
MANIFEST = "manifest.json"
LIBRARY, HEADER, SOURCE, WEIGHTS = "model.so", "model.h", "model.c", "weights.npy"


def weights_npy(blob: bytes) -> tuple[bytes, int]:
    """The weights blob as a .npy file (1-D uint8) and the offset of its first data byte
    (the header is padded to 64 bytes, so the data stays aligned in a mapped file)."""
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.frombuffer(blob, dtype=np.uint8), version=(1, 0),
                              allow_pickle=False)
    data = buf.getvalue()
    return data, len(data) - len(blob)


def read_weights_npy(data: bytes, where) -> np.ndarray:
    try:
        arr = np.lib.format.read_array(io.BytesIO(data), allow_pickle=False)
    except ValueError as e:
        raise KilnError(f"{where}: weights are not a readable .npy file ({e})") from None
    if arr.dtype != np.uint8 or arr.ndim != 1:
        raise KilnError(f"{where}: weights must be a 1-D uint8 array, found {arr.dtype}{list(arr.shape)}")
    return arr


def write_artifact(path: str | os.PathLike, manifest: dict, files: dict[str, bytes]) -> None:
    """Write the zip, manifest first, byte-reproducibly (fixed entry times); written to a
    temp name and renamed into place, so a reader never sees a half-written artifact."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    entries = {MANIFEST: (json.dumps(manifest, indent=2) + "\n").encode(), **files}
    try:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
            for name, data in entries.items():
                info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
                info.external_attr = 0o644 << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                z.writestr(info, data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_manifest(path: str | os.PathLike) -> dict:
    """The manifest of a `.kiln` file, checked to be one this kiln can read."""
    with _open(path) as z:
        return _manifest(z, path)


def is_artifact(path: str | os.PathLike) -> bool:
    """True if `path` is a zip holding a kiln manifest (what `kiln run` accepts besides ONNX)."""
    try:
        with zipfile.ZipFile(path) as z:
            return MANIFEST in z.namelist()
    except (OSError, zipfile.BadZipFile):
        return False


def load(path: str | os.PathLike) -> "ArtifactModel":
    """Load a `.kiln` artifact as a runnable CompiledModel (numpy and ctypes only).

    Fails with a KilnError, before any native code is loaded, when this machine's
    architecture or CPU features differ from what the library was built for.
    """
    with _open(path) as z:
        manifest = _manifest(z, path)
        check_target(manifest, path)
        try:
            lib = z.read(manifest["files"]["library"])
            weights = read_weights_npy(z.read(manifest["files"]["weights"]), path)
        except (KeyError, zipfile.BadZipFile) as e:
            raise KilnError(f"{path}: damaged kiln artifact ({e})") from None
    if weights.size != manifest["weights_bytes"]:
        raise KilnError(f"{path}: weights are {weights.size} bytes, the manifest says "
                        f"{manifest['weights_bytes']}")
    return ArtifactModel(os.fspath(path), manifest, _dlopen(lib, weights, manifest, path))


def check_target(manifest: dict, path) -> None:
    """Refuse a library built for another architecture or for CPU features this CPU lacks."""
    target = manifest["target"]
    if target.get("arch") and target["arch"] != machine():
        raise KilnError(f"{path} was built for {target['arch']}, this machine is {machine()}; "
                        "compile the model here (kiln compile) or rebuild its model.c")
    lacking = missing_features(target.get("features", []))
    if lacking:
        raise KilnError(f"{path} was built for a CPU with {', '.join(lacking)}, which this CPU lacks "
                        "(running it would crash with an illegal instruction); compile the model "
                        "on this machine (kiln compile) or rebuild its model.c without -march=native")


class ArtifactModel(CompiledModel):
    """A CompiledModel backed by an artifact's native module; `manifest` says what it is."""

    def __init__(self, path: str, manifest: dict, native: NativeModule):
        super().__init__([_spec(d) for d in manifest["inputs"]], [_spec(d) for d in manifest["outputs"]],
                         manifest["target"]["name"])
        self.path = path
        self.manifest = manifest
        self.native = native

    def _run(self, inputs: list) -> list:
        return self.native(inputs)


def _spec(d: dict) -> TensorSpec:
    return TensorSpec(d["name"], d["dtype"], tuple(d["shape"]))


def _open(path) -> zipfile.ZipFile:
    if not os.path.isfile(path):
        raise KilnError(f"artifact not found: {path}")
    try:
        return zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        raise KilnError(f"{path} is not a kiln artifact (not a zip file)") from None


def _manifest(z: zipfile.ZipFile, path) -> dict:
    try:
        m = json.loads(z.read(MANIFEST))
    except KeyError:
        raise KilnError(f"{path} is not a kiln artifact (no {MANIFEST})") from None
    except ValueError as e:
        raise KilnError(f"{path}: unreadable {MANIFEST} ({e})") from None
    if m.get("format") != FORMAT:
        raise KilnError(f"{path} is not a kiln artifact (format {m.get('format')!r})")
    if m.get("format_version") != FORMAT_VERSION:
        raise KilnError(f"{path} has artifact format version {m.get('format_version')}; this kiln "
                        f"reads version {FORMAT_VERSION} (recompile the model with this kiln)")
    return m


def _dlopen(lib: bytes, weights: np.ndarray, manifest: dict, path) -> NativeModule:
    """Load the library from a private temp copy, removed once loaded (the mapping stays)."""
    fd, so = tempfile.mkstemp(suffix=".so", prefix="kiln-artifact-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(lib)
        outs = [(tuple(d["shape"]), d["dtype"]) for d in manifest["outputs"]]
        return NativeModule(so, hashlib.sha256(lib).hexdigest(), manifest["entry"], outs, weights, manifest["workspace_bytes"],
                            manifest["kernels"], manifest.get("kernel_errors"))
    except (OSError, AttributeError, KilnError) as e:
        raise KilnError(f"{path}: cannot load its native library ({e}); if {tempfile.gettempdir()} "
                        "does not allow executables (noexec), set TMPDIR to a folder that does") from None
    finally:
        os.unlink(so)
