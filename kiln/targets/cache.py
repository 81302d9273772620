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

A model whose input sizes are all static is also found before any pass runs: its
`compile_key` hashes the graph as given (initializers included) with everything else
that steers the passes and lowering, and its entry (`store_whole`) keeps, beside the
module's manifest, the model's input and output specs and the weights blob itself, in
its final (packed, transformed) layout, in `KEY.weights`. A warm compile then reads the
blob and loads the library (`load_whole`): no pass, no lowering, no C compiler.
"""

from __future__ import annotations

import functools
import json
import os
import re
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kiln.codegen.cachedir import file_identity, source_digest, unchanged_since, write_atomic
from kiln.errors import KilnError
from kiln.graph.deferred import byte_parts, settle_in
from kiln.graph.canonical import digest
from kiln.graph.ir import Graph
from kiln.runtime.schema import (SHA256, SchemaError, integer, list_of, mapping, pair, record, string,
                                 validate)
from kiln.targets.target import Target

KEY_VERSION = "kiln-module-key 4"
COMPILE_KEY_VERSION = "kiln-compile-key 1"
FILE_KEY_VERSION = "kiln-file-key 1"
# environment variables that do not change what a compile makes (every other KILN_ one
# may: KILN_NCHWC, KILN_CONV_ALGO steer passes; KILN_CC, KILN_CFLAGS, KILN_SANITIZE the build)
_NOT_IN_KEY = ("KILN_CACHE_DIR", "KILN_TIER")   # (KILN_TIER: the cache keeps the -O3 build only)
# read by a loaded module's thread pool as it starts (kiln/codegen/c_src/kiln_pool.h), never by a
# build: an A/B of the pool's settings runs one module, not a rebuild per setting
_RUNTIME_PREFIX = "KILN_POOL_"


@functools.lru_cache(maxsize=1)
def _kiln_source_digest() -> str:
    """sha256 of kiln's source: the Python and the hand-written C it pastes into modules
    (kiln/codegen/c_src: a kernel's or the thread pool's text changes what a cached module's
    library holds)."""
    return source_digest(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), name="kiln-source")


def graph_key(graph: Graph, known: dict, target: Target, decisions: dict | None = None) -> str:
    """sha256 of everything lowering reads from a specialised graph: its canonical form
    (every constant's and tensor attribute's bytes, subgraphs, names, types, opsets),
    the compile-time known values, kiln's source, the target (features, cores, caches,
    wait policy: lowerings decide from them), the C toolchain and the schedule decisions
    asked for (kiln.lower.decisions: the values chosen are a function of these overrides
    and the rest of the key, so a tuned build is never served an untuned module), and every
    KILN_ environment variable but the cache dir, as compile_key (a shape-generic or per-shape
    module built under another KILN_ setting is never served)."""
    asked = json.dumps(decisions or {}, sort_keys=True, default=repr)
    return digest(KEY_VERSION, _toolchain(target), asked, _kiln_env(), graph, known=known)


def _toolchain(target: Target, probe: bool = True) -> tuple:
    """kiln's source, the C compiler, its flags and version banner, and the target.
    `probe=False`: the flags without the libmvec probe's answer (kiln.codegen.build._flags)."""
    from kiln.codegen.toolchain import _cc, _flags, compiler_version
    cc, flags = _cc(None), _flags(None, target, probe=probe)
    return (_kiln_source_digest(), cc, flags, compiler_version(tuple(cc)), target.key())


def compile_key(graph: Graph, level: int | None, target: Target, decisions: dict | None, limits) -> str:
    """sha256 of everything a compile of `graph` (every input size static) depends on, known
    before any pass runs: the graph as given (canonical form: every initializer's bytes),
    the -O level (None: the default, which kiln's source says), the decision overrides, the limits, kiln's source, the target, the C
    toolchain and every KILN_ environment variable but the cache dir. Tuning records are
    not in it: a compile with a tuning database does not use this key. Nor is the libmvec
    probe's answer (a function of the toolchain and the machine's libraries: a library
    built with it that no longer loads is refused and built again), so a cold compile
    probes while its passes run (kiln.codegen.build.start_probes)."""
    return digest(COMPILE_KEY_VERSION, *_settings(level, target, decisions, limits), graph)


def _settings(level: int | None, target: Target, decisions: dict | None, limits) -> tuple:
    """What a compile depends on besides the model: the toolchain (kiln's source, compiler,
    flags, target), the decision overrides, the -O level, the limits and the KILN_ variables."""
    asked = json.dumps(decisions or {}, sort_keys=True, default=repr)
    return _toolchain(target, probe=False), asked, repr(level), repr(limits), _kiln_env()


def _kiln_env() -> tuple:
    """The KILN_ environment variables a build may read, sorted (not the cache dir's)."""
    return tuple(sorted((k, v) for k, v in os.environ.items()
                        if k.startswith("KILN_") and k not in _NOT_IN_KEY and not k.startswith(_RUNTIME_PREFIX)))


# -- model files: their compile key found from the file's identity, without reading it --------

@dataclass(frozen=True)
class ModelFile:
    """A model given as a path, found again by the file's identity (`file_identity`, as
    CPython's .pyc and ccache's direct mode do) without reading it: under `key` (the
    identity and the settings its `compile_key` hashes beside the graph) the compile key
    of its graph is remembered once known. `read_at`: time.time_ns() before the identity."""
    key: str
    identity: list
    read_at: int

    @staticmethod
    def of(path, level: int | None, target: Target, decisions: dict | None, limits) -> "ModelFile | None":
        read_at = time.time_ns()
        identity = file_identity(path)
        if identity is None:
            return None   # (no such file: the frontend says so)
        return ModelFile(digest(FILE_KEY_VERSION, *_settings(level, target, decisions, limits), tuple(identity)),
                         identity, read_at)

    def compile_key(self) -> str | None:
        """The compile key remembered for this file, or None: none, a damaged entry, or an
        external data file changed since (then the model is read again)."""
        try:
            entry = json.loads(_path(self.key, "files").read_bytes())
            validate(entry, FILE_ENTRY, f"model file entry {self.key}")
        except (OSError, ValueError, SchemaError):
            return None
        if entry["file"] != self.identity or any(file_identity(d[0]) != d for d in entry["data"]):
            return None
        return entry["compile_key"]

    def unchanged(self, path):
        """`path`, this file, if it is still as it was (else a KilnError: a model loaded by its
        file's identity reads the file only when asked for its graph)."""
        if file_identity(path) != self.identity:
            raise KilnError(f"model file {path} changed after it was compiled (its module was loaded "
                            "from the cache); compile it again")
        return path

    def remember(self, data_files, compile_key: str) -> bool:
        """Remember that this file, read with the external data files `data_files` (paths),
        compiles under `compile_key`. Not done (False) where a file is not as it was when
        read, or had changed less than RACY_NS before (kiln.codegen.cachedir.unchanged_since):
        its next compile then reads it again."""
        data = [file_identity(p) for p in data_files]
        if None in data or not all(unchanged_since(i, self.read_at) for i in (self.identity, *data)):
            return False
        entry = {"compile_key": compile_key, "file": self.identity, "data": data}
        validate(entry, FILE_ENTRY, "new model file entry")
        write_atomic(_path(self.key, "files"), json.dumps(entry).encode())
        return True


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


def _spec(v, path) -> None:
    """A model input's or output's spec: [name, dtype, shape (ints, symbol names) or null, kind]."""
    if not (isinstance(v, list) and len(v) == 4 and isinstance(v[0], str) and isinstance(v[1], str)
            and isinstance(v[3], str) and (v[2] is None or (isinstance(v[2], list) and all(
                type(d) in (int, str) for d in v[2])))):
        raise SchemaError(f"field {path}: expected [name, dtype, shape or null, kind], found {v!r:.80}")


def _identity(v, path) -> None:
    """A `file_identity`: [path, device, inode, size, mtime_ns, ctime_ns]."""
    if not (isinstance(v, list) and len(v) == 6 and isinstance(v[0], str)
            and all(type(x) is int for x in v[1:])):
        raise SchemaError(f"field {path}: expected [path, device, inode, size, mtime_ns, ctime_ns], "
                          f"found {v!r:.80}")


# a whole static model's entry (`store_whole`): its module's, and what compile() returns
WHOLE_ENTRY = record({
    "module": MODULE_ENTRY,
    "inputs": list_of(_spec, 1 << 16),
    "outputs": list_of(_spec, 1 << 16),
    "weights_sum": integer(0, (1 << 64) - 1),   # `checksum` of KEY.weights
})

# a model file's entry (`ModelFile.remember`): the compile key it was found to have
FILE_ENTRY = record({
    "compile_key": string(SHA256),
    "file": _identity,              # the model file, as when its compile key was taken
    "data": list_of(_identity),     # the external-data files its tensors were read from
})


def checksum(blob: np.ndarray) -> int:
    """A check of a weights blob against damage (a lost or zeroed page, a flipped bit): the
    sum of its 64-bit words mod 2^64, at memory speed (sha256 took 0.15 s on ResNet-18's
    160 MB of transformed weights, this about 0.02). Not against tampering: as for the
    libraries, whoever can write the private cache directory can run code as you."""
    return _word_sum(blob, 0)


def _word_sum(part: np.ndarray, at: int) -> int:
    """What uint8 array `part`, at byte `at` of a blob, adds to the blob's `checksum` (mod 2^64):
    a sum of words is a sum over bytes (each weighted by its place in its word), so the
    writer sums the parts it writes instead of reading the file back."""
    lead = at % 8
    head = np.concatenate([np.zeros(lead, np.uint8), part[:8 - lead]]) if lead else part[:0]
    body = part[len(head) - lead if lead else 0:]
    whole = body.size - body.size % 8
    tail = body[whole:]
    total = int(np.add.reduce(body[:whole].view(np.uint64), dtype=np.uint64))
    for word in (head, tail):
        if word.size:
            total += int(np.concatenate([word, np.zeros(8 - word.size, np.uint8)]).view(np.uint64)[0])
    return total % 2 ** 64


class WeightsFile:
    """The weights blob of the model compiled under `key`, made in the cache's file
    (KEY.weights). `place(nbytes, pieces)` (kiln.lower.module.weights_blob's) makes a new file
    beside the entry for the constants and returns it mapped copy-on-write; `start()` starts
    writing them into it, in a thread; their bytes are all there once `written()` has returned
    (which starts the writing if nothing did). `keep()` puts the file in place (before
    `store_whole` makes the entry); a block left without `keep()` removes it. The blob is never
    made in memory: ResNet-18's 160 MB of transformed weights, written through a writable
    mapping of the file, took 0.2-0.9 s of page faults on the compile's path, and made in
    memory, 0.1-0.35 s (a new process's first large allocation); written, 0.14 s of CPU in a
    thread. The compiler starts it once the C is generated (kiln.compiler.native): the thread's
    Python holds the GIL half the time, so started at `place`, it ran beside code generation
    and doubled that stage's wall time (ResNet-18: 121 ms for 61 ms of CPU), on the compile's
    critical path; started later, it runs beside the C compiler, whose processes need no GIL."""

    def __init__(self, key: str):
        self.path, self.tmp = _path(key).with_suffix(".weights"), None
        self._writer: threading.Thread | None = None
        self._result: list = []

    def place(self, nbytes: int, pieces: list) -> np.ndarray:
        """The blob of `nbytes`: `pieces` ([(offset, uint8 array)], in offset order, not
        overlapping) at their offsets, zeros elsewhere; being written until `written()`."""
        at = 0
        for offset, b in pieces:
            if offset < at or offset + b.nbytes > nbytes:
                raise KilnError(f"weights piece at {offset} ({b.nbytes} bytes) overlaps the one before or lies "
                                f"outside the {nbytes}-byte blob", stage="cache")
            at = offset + b.nbytes
        fd, self.tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            os.ftruncate(fd, nbytes)    # (the gaps between pieces: zeros, never written)
        finally:
            os.close(fd)
        blob = np.memmap(self.tmp, dtype=np.uint8, mode="c", shape=(nbytes,))
        self._writer = threading.Thread(target=self._write, args=(self.tmp, nbytes, pieces, blob),
                                        name="kiln-weights-write", daemon=True)
        return blob

    def start(self) -> None:
        """Start writing the placed constants into the file (in a thread; once)."""
        if self._writer is None:
            raise KilnError("no weights blob was placed in the cache's file", stage="cache")
        if self._writer.ident is None:
            self._writer.start()

    def _write(self, path: str, nbytes: int, pieces: list, blob: np.ndarray) -> None:
        try:
            fd, total = os.open(path, os.O_WRONLY), 0
            try:
                for offset, b in pieces:   # (a Deferred piece is made here, part by part)
                    for at, part in byte_parts(b):
                        view, done = memoryview(part), 0
                        while done < part.size:
                            done += os.pwrite(fd, view[done:], offset + at + done)
                        total += _word_sum(part, offset + at)
            finally:
                os.close(fd)
            for offset, b in pieces:
                settle_in(b, blob, offset)
            self._result.append(total % 2 ** 64)
        except BaseException as e:  # noqa: BLE001 (raised by written())
            self._result.append(e)

    def written(self) -> int:
        """Wait for the blob's bytes to be written; their `checksum`."""
        self.start()
        self._writer.join()
        result = self._result[0]
        if isinstance(result, BaseException):
            raise KilnError(f"writing the weights blob to {self.tmp}: {result}", stage="cache") from result
        return result

    def keep(self) -> None:
        if self.tmp is not None:
            os.replace(self.tmp, self.path)
            self.tmp = None

    def __enter__(self) -> "WeightsFile":
        return self

    def __exit__(self, *exc) -> None:
        if self._writer is not None and self._writer.ident is not None:
            self._writer.join()
        if self.tmp is not None:
            Path(self.tmp).unlink(missing_ok=True)


def store_whole(key: str, manifest: dict, inputs: list, outputs: list, weights_sum: int) -> None:
    """Keep a whole static model's module under its `compile_key`: the module's manifest,
    the model's input and output specs ([name, dtype, shape, kind] lists) and the `checksum`
    of its weights blob, which a `WeightsFile` put in place."""
    entry = {"module": manifest, "inputs": inputs, "outputs": outputs, "weights_sum": weights_sum}
    validate(entry, WHOLE_ENTRY, "new compiled model entry")
    write_atomic(_path(key), json.dumps(entry).encode())


def load_whole(key: str) -> tuple[dict, np.ndarray] | None:
    """(entry, weights blob) stored under compile key `key`, or None when there is none or
    it is damaged (then the caller compiles it again). The blob is mapped copy-on-write from
    the file (its pages are the page cache's: nothing copied) and checked."""
    path = _path(key)
    try:
        entry = json.loads(path.read_bytes())
        validate(entry, WHOLE_ENTRY, f"compiled model entry {key}")
        size = entry["module"]["weights_bytes"]
        wpath = path.with_suffix(".weights")
        if not size or os.path.getsize(wpath) != size:
            return None
        blob = np.memmap(wpath, dtype=np.uint8, mode="c", shape=(size,))
    except (OSError, ValueError, SchemaError):
        return None
    if checksum(blob) != entry["weights_sum"]:
        return None
    return entry, blob


def _path(key: str, kind: str = "modules") -> Path:
    from kiln.codegen.cachedir import private_dir
    if not re.fullmatch(r"[0-9a-f]{64}", key):
        raise KilnError(f"not a module cache key: {key!r}", stage="cache")
    return private_dir(kind) / f"{key}.json"


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
