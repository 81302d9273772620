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
    SHA256SUMS      the sha256 of every other member, as `sha256sum` writes them
                    (`unzip model.kiln -d m && cd m && sha256sum -c SHA256SUMS` checks them)

An artifact is native code: loading one runs its library in this process, so load
only artifacts from sources you trust, and compare the file's sha256 (`sha256sum
model.kiln`, also shown by `kiln inspect model.kiln`) with the one its publisher gives.
What loading checks, before anything of the library runs but its loader: the members
are exactly these, each matches its SHA256SUMS line, the manifest matches its schema
(every field: type, range, pattern), the entry is `NAME_main` of the artifact's own
NAME, the weights hash to `weights_sha256`, and the architecture and CPU features
match this machine. After dlopen, before the first call: the library's own
`NAME_interface()` (input/output dtypes and shapes, workspace and weights sizes, and
the weights' sha256) must equal the manifest's, so a manifest that asks for smaller
buffers, or other weights under a rewritten manifest, is refused.

This module reads and writes the container and loads it; `kiln.export` makes
one from a compiled model. It imports nothing of the compiler.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import struct
import tempfile
import zipfile
import zlib
from pathlib import Path

import numpy as np

from kiln.dtypes import DType
from kiln.errors import KilnError
from kiln.runtime import schema as S
from kiln.runtime.cpu import machine, missing_features
from kiln.runtime.model import CompiledModel, TensorSpec
from kiln.runtime.native import LibraryLoadError, NativeModule
from kiln.runtime.pages import zeroed

FORMAT = "kiln-artifact"
FORMAT_VERSION = 3  # 3: SHA256SUMS, a strict manifest, the library's interface(); 2: weights.npy
MANIFEST = "manifest.json"
LIBRARY, HEADER, SOURCE, WEIGHTS = "model.so", "model.h", "model.c", "weights.npy"
SUMS = "SHA256SUMS"
MEMBERS = (MANIFEST, LIBRARY, HEADER, SOURCE, WEIGHTS, SUMS)
MAX_MANIFEST_BYTES = 64 << 20
# what reading a damaged zip raises (zipfile, zlib, struct, and EOF inside a member)
_ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, OSError, EOFError, ValueError, NotImplementedError,
               RuntimeError, struct.error, OverflowError)
_CHUNK = 1 << 20

_PORT = S.record({"name": S.string(max_len=4096),
                  "dtype": S.one_of(*(d.name for d in DType)),
                  "shape": S.list_of(S.integer(0, 1 << 40), max_len=64)})
MANIFEST_SCHEMA = S.record({
    "format": S.const(FORMAT),
    "format_version": S.const(FORMAT_VERSION),
    "kiln_version": S.string(r"[A-Za-z0-9.+_-]+", max_len=64),
    "source": S.record({"file": S.nullable(S.string(max_len=4096)), "sha256": S.nullable(S.string(S.SHA256))}),
    "target": S.record({"name": S.const("cpu"), "arch": S.string(r"[A-Za-z0-9_.-]+", max_len=64),
                        "cflags": S.string(max_len=4096),
                        "features": S.list_of(S.string(r"[A-Za-z0-9_.]+", max_len=64), max_len=1024),
                        # the CPU it was compiled for (kiln.targets.Target: its name and key)
                        "cpu": S.string(r"[A-Za-z0-9_.-]+", max_len=64), "key": S.string(max_len=4096)},
                       optional=("cpu", "key")),
    "name": S.string(S.C_IDENTIFIER, max_len=128),
    "entry": S.string(S.C_IDENTIFIER, max_len=160),
    "files": S.record({"library": S.const(LIBRARY), "header": S.const(HEADER), "source": S.const(SOURCE),
                       "weights": S.const(WEIGHTS)}),
    "inputs": S.list_of(_PORT, max_len=1 << 16),
    "outputs": S.list_of(_PORT, max_len=1 << 16, min_len=1),
    "dims": S.mapping(S.string(max_len=4096), S.integer(0, 1 << 40)),
    "weights_bytes": S.integer(),
    "weights_sha256": S.string(S.SHA256),
    "weights_offset": S.integer(0, 1 << 20),
    "workspace_bytes": S.integer(),
    "kernels": S.list_of(S.string(max_len=1 << 20)),
    "kernel_errors": S.list_of(S.list_of(S.pair(S.integer(-(1 << 31), 1 << 31), S.string(max_len=1 << 16)))),
    # kernel -> the tuning record (kiln.tune.records id) whose decisions built it
    "tuning_records": S.mapping(S.string(max_len=256), S.integer()),
}, optional=("tuning_records",))


def weights_npy(blob: bytes) -> tuple[bytes, int]:
    """The weights blob as a .npy file (1-D uint8) and the offset of its first data byte
    (the header is padded to 64 bytes, so the data stays aligned in a mapped file)."""
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.frombuffer(blob, dtype=np.uint8), version=(1, 0),
                              allow_pickle=False)
    data = buf.getvalue()
    return data, len(data) - len(blob)


def npy_header(n: int) -> bytes:
    """The exact .npy header (format 1.0, 64-byte aligned) of a 1-D uint8 array of `n` bytes."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "|u1", "fortran_order": False, "shape": (n,)})
    return buf.getvalue()


def read_weights_npy(data: bytes, n: int, where) -> np.ndarray:
    """The `n` weight bytes of a weights.npy, whose header must be exactly the one kiln
    writes for them: nothing of an untrusted header is parsed (no pickle, no eval)."""
    head = npy_header(n)
    if len(data) != len(head) + n or data[:len(head)] != head:
        raise KilnError(f"{where}: {WEIGHTS} is not the .npy file of {n} weight bytes kiln writes "
                        f"(a 1-D uint8 array, header of {len(head)} bytes)")
    weights = zeroed(n)     # in huge pages where the kernel offers them (kiln.runtime.pages)
    weights[:] = np.frombuffer(data, dtype=np.uint8, offset=len(head))
    return weights


def write_artifact(path: str | os.PathLike, manifest: dict, files: dict[str, bytes]) -> None:
    """Write the zip, manifest first and SHA256SUMS last, byte-reproducibly (fixed entry
    times); written to a temp name and renamed into place, so a reader never sees a
    half-written artifact."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    entries = {MANIFEST: (json.dumps(manifest, indent=2) + "\n").encode(),
               **{name: data for name, data in files.items() if name not in (MANIFEST, SUMS)}}
    entries[SUMS] = "".join(f"{hashlib.sha256(data).hexdigest()}  {name}\n"
                            for name, data in entries.items()).encode()
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


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 of the whole artifact file, as `sha256sum` prints it: compare it with its publisher's."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def read_manifest(path: str | os.PathLike) -> dict:
    """The manifest of a `.kiln` file, checked: its schema, and every member against
    SHA256SUMS (no native code is loaded)."""
    with _open(path) as z:
        manifest, sums = _checked_manifest(z, path)
        for name in (LIBRARY, HEADER, SOURCE, WEIGHTS):
            _hash_member(z, name, sums, path)
    return manifest


def load(path: str | os.PathLike) -> "ArtifactModel":
    """Load a `.kiln` artifact as a runnable CompiledModel (numpy and ctypes only).

    An artifact is native code: load only artifacts you trust (see the module's
    docstring for what is checked). Fails with a KilnError, before the library is
    loaded, when a member fails its hash, the manifest its schema, or this machine's
    architecture or CPU features differ from what the library was built for; and after
    loading it, before any call, when the library's interface disagrees with the manifest.
    """
    with _open(path) as z:
        manifest, sums = _checked_manifest(z, path)
        check_target(manifest, path)
        for name in (HEADER, SOURCE):
            _hash_member(z, name, sums, path)
        weights = _weights(z, manifest, sums, path)
        fd, so = tempfile.mkstemp(suffix=".so", prefix="kiln-artifact-")
        try:
            with os.fdopen(fd, "wb") as f:
                digest = _hash_member(z, LIBRARY, sums, path, f)
            native = _dlopen(so, digest, weights, manifest, path)
        finally:
            os.unlink(so)    # the mapping stays
    return ArtifactModel(os.fspath(path), manifest, native)


def check_target(manifest: dict, path) -> None:
    """Refuse a library built for another architecture or for CPU features this CPU lacks."""
    target = manifest["target"]
    if target.get("arch") and target["arch"] != machine():
        raise KilnError(f"{path} was built for {target['arch']}, this machine is {machine()}; "
                        "compile the model here (kiln compile) or rebuild its model.c")
    lacking = missing_features(target.get("features", []))
    if lacking:
        built_for = f" ({target['cpu']})" if target.get("cpu") else ""
        raise KilnError(f"{path} was built for a CPU{built_for} with {', '.join(lacking)}, which this CPU "
                        "lacks (running it would crash with an illegal instruction); compile the model "
                        "on this machine (kiln compile), for a CPU level it has (kiln compile --cpu "
                        "x86-64-v3), or rebuild its model.c without -march=native")


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
        z = zipfile.ZipFile(path)
    except _ZIP_ERRORS as e:
        raise KilnError(f"{path} is not a kiln artifact (not a zip file: {e})") from None
    names = z.namelist()
    if MANIFEST not in names:
        z.close()
        raise KilnError(f"{path} is not a kiln artifact (no {MANIFEST})")
    return z


def _checked_manifest(z: zipfile.ZipFile, path) -> tuple[dict, dict[str, str]]:
    """(manifest, SHA256SUMS as {member: sha256}), every check that needs no other member done."""
    raw = _read(z, MANIFEST, MAX_MANIFEST_BYTES, path)
    try:
        m = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise KilnError(f"{path}: unreadable {MANIFEST} ({e})") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise KilnError(f"{path} is not a kiln artifact (format {m.get('format') if isinstance(m, dict) else m!r:.40})")
    if m.get("format_version") != FORMAT_VERSION:
        raise KilnError(f"{path} has artifact format version {m.get('format_version')!r:.20}; this kiln "
                        f"reads version {FORMAT_VERSION} (recompile the model with this kiln)")
    names = z.namelist()
    if sorted(names) != sorted(MEMBERS):
        missing = sorted(set(MEMBERS) - set(names))
        odd = sorted({n for n in names if n not in MEMBERS or names.count(n) > 1})
        raise KilnError(f"{path}: damaged kiln artifact: its members must be exactly {', '.join(MEMBERS)} "
                        f"(missing: {', '.join(missing) or '-'}; unexpected or repeated: "
                        f"{', '.join(map(repr, odd)) or '-'})")
    S.validate(m, MANIFEST_SCHEMA, f"{path}: {MANIFEST}")
    if m["entry"] != f"{m['name']}_main":
        raise KilnError(f"{path}: entry {m['entry']!r} is not this artifact's own entry {m['name'] + '_main'!r}")
    for kind in ("inputs", "outputs"):
        seen = [p["name"] for p in m[kind]]
        if len(set(seen)) != len(seen):
            raise KilnError(f"{path}: {MANIFEST} names two {kind} alike")
    sums = _sums(_read(z, SUMS, 1 << 16, path), path)
    if hashlib.sha256(raw).hexdigest() != sums[MANIFEST]:
        raise KilnError(f"{path}: {MANIFEST} does not match its SHA256SUMS line (damaged or edited)")
    return m, sums


def _sums(raw: bytes, path) -> dict[str, str]:
    sums = {}
    for line in raw.decode("ascii", "replace").splitlines():
        m = re.fullmatch(r"([0-9a-f]{64})  (\S+)", line)
        if m is None or m.group(2) in sums or m.group(2) not in MEMBERS or m.group(2) == SUMS:
            raise KilnError(f"{path}: {SUMS} has a bad line {line[:80]!r}")
        sums[m.group(2)] = m.group(1)
    missing = [n for n in MEMBERS if n != SUMS and n not in sums]
    if missing:
        raise KilnError(f"{path}: {SUMS} lists no hash for {', '.join(missing)}")
    return sums


def _read(z: zipfile.ZipFile, name: str, limit: int, path) -> bytes:
    info = z.getinfo(name)
    if info.file_size > limit:
        raise KilnError(f"{path}: member {name} is {info.file_size} bytes, more than the {limit} allowed")
    try:
        with z.open(info) as f:
            return f.read(limit + 1)[:limit + 1]
    except _ZIP_ERRORS as e:
        raise KilnError(f"{path}: damaged kiln artifact: cannot read {name} ({e})") from None


def _hash_member(z: zipfile.ZipFile, name: str, sums: dict, path, sink=None) -> str:
    """Stream member `name` (into `sink` if given) and check it against its SHA256SUMS line."""
    h = hashlib.sha256()
    try:
        with z.open(name) as f:
            for block in iter(lambda: f.read(_CHUNK), b""):
                h.update(block)
                if sink is not None:
                    sink.write(block)
    except _ZIP_ERRORS as e:
        raise KilnError(f"{path}: damaged kiln artifact: cannot read {name} ({e})") from None
    if h.hexdigest() != sums[name]:
        raise KilnError(f"{path}: {name} does not match its SHA256SUMS line (damaged or replaced)")
    return h.hexdigest()


def _weights(z: zipfile.ZipFile, m: dict, sums: dict, path) -> np.ndarray:
    if m["weights_offset"] != len(npy_header(m["weights_bytes"])):
        raise KilnError(f"{path}: weights_offset {m['weights_offset']} is not where the raw bytes of a "
                        f"{m['weights_bytes']}-byte weights.npy start ({len(npy_header(m['weights_bytes']))})")
    expected = m["weights_offset"] + m["weights_bytes"]
    if z.getinfo(WEIGHTS).file_size != expected:
        raise KilnError(f"{path}: {WEIGHTS} is {z.getinfo(WEIGHTS).file_size} bytes; the manifest's "
                        f"weights_offset + weights_bytes say {expected}")
    data = _read(z, WEIGHTS, expected, path)
    if hashlib.sha256(data).hexdigest() != sums[WEIGHTS]:
        raise KilnError(f"{path}: {WEIGHTS} does not match its SHA256SUMS line (damaged or replaced)")
    weights = read_weights_npy(data, m["weights_bytes"], path)
    if hashlib.sha256(weights.tobytes()).hexdigest() != m["weights_sha256"]:
        raise KilnError(f"{path}: the weights do not hash to the manifest's weights_sha256")
    return weights


def _dlopen(so: str, digest: str, weights: np.ndarray, manifest: dict, path) -> NativeModule:
    """Load the verified library from its private temp copy; its interface must match the manifest."""
    ports = [[(tuple(d["shape"]), d["dtype"]) for d in manifest[k]] for k in ("inputs", "outputs")]
    try:
        return NativeModule(so, digest, manifest["entry"], ports[0], ports[1], weights,
                            manifest["workspace_bytes"], manifest["kernels"], manifest["kernel_errors"],
                            where=path, interface={"weights_sha256": manifest["weights_sha256"]})
    except LibraryLoadError as e:
        raise KilnError(f"{path}: cannot load its native library ({e}); if {tempfile.gettempdir()} "
                        "does not allow executables (noexec), set TMPDIR to a folder that does") from None
