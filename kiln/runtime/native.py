"""Running a native module: one foreign call per inference over a preplanned arena.

Needs numpy and ctypes only (no compiler module): a saved artifact runs with this.
The weights blob is bound once at load; the workspace arena is allocated once and
reused by every call (calls on one model are therefore serialised by a lock).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import threading
import time

import numpy as np

from kiln.dtypes import DType
from kiln.errors import KilnError
from kiln.runtime import strings, threads
from kiln.runtime.elf import check_elf


# How OpenMP threads wait between kernels (they sleep: kiln.runtime.threads),
# set before libgomp starts (the first kernel library loaded); a user's choice wins.
threads.apply_defaults()


def _slow_pointer(a: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.ctypes.data)


def _data_offset() -> int | None:
    """Where an ndarray's data pointer lies in its object, if it can be read there directly.

    `a.ctypes.data` builds a helper object per call (about 1 µs, the largest part of a tiny
    model's call). On CPython an ndarray's data pointer is the first field after the object
    header (numpy's PyArrayObject_fields, stable ABI), so a c_void_p at `id(a) + header` reads it.
    The layout is verified here on arrays of several kinds (views with offsets, empty, strided);
    if any disagrees with `a.ctypes.data`, None: the slow way is used."""
    import sys
    if sys.implementation.name != "cpython":
        return None
    header = object.__basicsize__
    base = np.arange(64, dtype=np.float32)
    probes = [base, base[3:19], base.reshape(8, 8)[2:], base[::2], np.zeros(0), np.zeros((2, 0, 3)),
              np.empty((1, 16), np.int64), np.ones((), np.uint8)]
    for p in probes:
        if (ctypes.c_void_p.from_address(id(p) + header).value or 0) != p.ctypes.data:
            return None
    return header


_DATA_OFFSET = _data_offset()
_AT = ctypes.c_void_p.from_address


def data_pointers(arrays: list[np.ndarray]) -> list[ctypes.c_void_p]:
    """ctypes c_void_p arguments holding each array's data pointer; the arrays must be
    np.ndarray objects that outlive the call the pointers are passed to."""
    if _DATA_OFFSET is None:
        return [_slow_pointer(a) for a in arrays]
    at, off = _AT, _DATA_OFFSET
    return [at(id(a) + off) for a in arrays]


class LibraryMismatch(KilnError):
    """A library's bytes are not the ones recorded for it: truncated, damaged or replaced."""


class LibraryLoadError(KilnError):
    """The dynamic loader refused a (verified) library."""


def load_library(path: str | os.PathLike, sha256: str, where=None) -> ctypes.CDLL:
    """dlopen `path` once its bytes are checked to hash to `sha256` and to be a whole ELF
    shared object. Nothing unverified is mapped: a library cut short crashes the process
    (SIGBUS) at its first missing page, and a replaced one runs whatever it holds."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise LibraryMismatch(f"cannot read native library {path} ({e})") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise LibraryMismatch(f"native library {path} is not the one recorded for it (sha256 "
                              f"{digest}, expected {sha256}): truncated, damaged or replaced")
    check_elf(data, where or path)
    try:
        return ctypes.CDLL(os.fspath(path))
    except OSError as e:
        raise LibraryLoadError(f"cannot load native library {path} ({e})") from None


def interface_text(inputs, outputs, workspace_bytes: int, weights_bytes: int) -> str:
    """What a module's `interface()` reports: its entry's inputs and outputs as
    [dtype, shape] pairs, the workspace and weights sizes it was planned with (JSON)."""
    return json.dumps({"inputs": [[d, [_dim(x) for x in s]] for s, d in inputs],
                       "outputs": [[d, [_dim(x) for x in s]] for s, d in outputs],
                       "workspace_bytes": int(workspace_bytes), "weights_bytes": int(weights_bytes)},
                      separators=(",", ":"))


def _dim(x):
    """A dim in an interface: an int, or a symbol's name (a shape-generic module)."""
    return int(x) if isinstance(x, (int, np.integer)) else str(x)


def library_interface(lib: ctypes.CDLL, symbol: str, where) -> dict:
    """The static description a library reports through `symbol` (see interface_text)."""
    try:
        fn = getattr(lib, symbol)
    except AttributeError:
        raise KilnError(f"{where}: the library does not report its interface (no {symbol}); it was not "
                        "made by this kiln") from None
    fn.argtypes = [ctypes.POINTER(ctypes.c_char_p)]
    fn.restype = ctypes.c_int32
    out = ctypes.c_char_p()
    if fn(ctypes.byref(out)) != 0 or not out.value:
        raise KilnError(f"{where}: the library's {symbol} reports no interface")
    try:
        return json.loads(out.value[:1 << 20].decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise KilnError(f"{where}: the library's {symbol} reports an unreadable interface") from None


def interface_mismatch(reported: dict, expected: dict) -> str | None:
    """The first way `expected` (what the caller will pass) differs from what the library
    reports, in words; None if they agree."""
    if not isinstance(reported, dict):
        return "the library's interface is not a description"
    for kind in ("inputs", "outputs"):
        got, want = reported.get(kind), expected[kind]
        if not isinstance(got, list) or len(got) != len(want):
            return f"the library takes {len(got) if isinstance(got, list) else '?'} {kind}, " \
                   f"the manifest says {len(want)}"
        for k, (g, w) in enumerate(zip(got, want)):
            if g != w:
                return f"{kind[:-1]} {k}: the library's is {_port(g)}, the manifest says {_port(w)}"
    for key in [k for k in expected if k not in ("inputs", "outputs")]:
        if reported.get(key) != expected[key]:
            return f"{key}: the library was built for {reported.get(key)!r}, the manifest says {expected[key]}"
    return None


def _port(p) -> str:
    try:
        dtype, shape = p
        return f"{dtype}{list(shape)}"
    except (TypeError, ValueError):
        return repr(p)[:60]


def check_bound(inputs: list, outputs: list, types: list) -> None:
    """run_bound's arguments: C-contiguous arrays, the outputs writeable and of `types` exactly."""
    if len(outputs) != len(types):
        raise KilnError(f"run_bound: {len(outputs)} output buffers for {len(types)} outputs", stage="run")
    for k, (o, (shape, dt)) in enumerate(zip(outputs, types)):
        if type(o) is not np.ndarray or o.shape != tuple(shape) or o.dtype != dt or not o.flags.c_contiguous \
                or not o.flags.writeable:
            raise KilnError(f"run_bound: output {k} must be a writeable C-contiguous {np.dtype(dt)} array of "
                            f"shape {tuple(shape)}, given {getattr(o, 'dtype', type(o).__name__)} "
                            f"{getattr(o, 'shape', '')}", stage="run")
    if any(type(x) is not np.ndarray or not x.flags.c_contiguous for x in inputs):
        raise KilnError("run_bound: inputs must be C-contiguous numpy arrays", stage="run")


ARENA_GROWTH = 2.0   # a growing workspace (shape-generic modules) is made this much larger than asked


class NativeModule:
    """A loaded shared library whose entry takes (inputs.., outputs.., weights, workspace)."""

    def __init__(self, library_path: str, library_sha256: str, entry_symbol: str,
                 input_types: list[tuple[tuple, str]], output_types: list[tuple[tuple, str]],
                 weights: np.ndarray, workspace_bytes: int, call_nodes: list[str],
                 call_errors: list | None = None, where=None, interface: dict | None = None):
        """Loads the library (verified against `library_sha256`) and refuses it, before any
        call, unless the interface it reports is exactly `input_types`, `output_types`
        (shape, dtype name), `workspace_bytes` and the weights' size. `entry_symbol` is
        `<prefix>_main`; the interface is `<prefix>_interface`. `interface`: more fields it
        must report (an artifact's library reports its weights' sha256)."""
        self.library_path = library_path
        where = where or library_path
        if not entry_symbol.endswith("_main"):
            raise KilnError(f"{where}: entry {entry_symbol!r} is not a kiln entry (<prefix>_main)")
        self.lib = load_library(library_path, library_sha256, where)
        expected = {**json.loads(interface_text(input_types, output_types, workspace_bytes, np.size(weights))),
                    **(interface or {})}
        why = interface_mismatch(library_interface(self.lib, entry_symbol[:-4] + "interface", where), expected)
        if why:
            raise KilnError(f"{where}: the manifest disagrees with its library ({why}); refusing to run it")
        try:
            self.entry = getattr(self.lib, entry_symbol)
        except AttributeError:
            raise KilnError(f"{where}: the library has no entry {entry_symbol}") from None
        self.entry.restype = ctypes.c_int32
        self.output_types = [(tuple(s), DType.from_name(d).np) for s, d in output_types]
        # no strings in or out: the fast call path (see __call__)
        self._plain = all(d != "string" for _, d in list(input_types) + list(output_types))
        self._release = strings.release_function(self.lib, entry_symbol[:-4])
        self._gather = strings.gather_function(self.lib, entry_symbol[:-4])
        self.weights = np.ascontiguousarray(weights, dtype=np.uint8)
        self.workspace_bytes = int(workspace_bytes)  # what the entry needs (an artifact's header says it)
        self.workspace = np.zeros(max(int(workspace_bytes), 64) + 64, dtype=np.uint8)
        # 64-byte aligned view of the arena, so kernels may use aligned vector loads
        off = (-self.workspace.ctypes.data) % 64
        self._ws_ptr = self.workspace.ctypes.data + off
        # made once: each .ctypes.data costs microseconds, which 1-row calls feel
        self._fixed_ptrs = [ctypes.c_void_p(self.weights.ctypes.data), ctypes.c_void_p(self._ws_ptr)]
        self.call_nodes = call_nodes
        # per call: [[status, message], ...] of its kernel's run-time checks
        self.call_errors = [dict((int(c), str(m)) for c, m in e) for e in (call_errors or [])]
        self._lock = threading.Lock()

    def __call__(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        if not self._plain:
            return self._call_strings(inputs)
        # numbers only (the common case): contiguous inputs as they are, fresh outputs, one
        # call with each array's data pointer (read cheaply, see data_pointers)
        ins = [np.ascontiguousarray(x) for x in inputs]
        outs = [np.empty(shape, dt) for shape, dt in self.output_types]
        self._enter(data_pointers(ins + outs))
        return outs

    def run_bound(self, inputs: list[np.ndarray], outputs: list[np.ndarray]) -> None:
        """IO binding: one call on `inputs` writing into the caller's `outputs` (C-contiguous
        arrays of exactly the output shapes and dtypes), nothing allocated or copied. An output
        may be the very array of an input only where the graph was made for it: the static KV
        cache of kiln.decode, whose TensorScatter writes the new rows into its own input."""
        if not self._plain:
            raise KilnError("run_bound takes numeric tensors only", stage="run")
        check_bound(inputs, outputs, self.output_types)
        self._enter(data_pointers(list(inputs) + list(outputs)))

    def _enter(self, ptrs: list, more=(), workspace_bytes: int = 0) -> None:
        """One call of the entry on `ptrs` (inputs and outputs), the weights and workspace, then
        `more`; the workspace first grown to `workspace_bytes` (a shape-generic module's plan),
        by ARENA_GROWTH times as much: a larger shape after it then finds its memory in place,
        the pages touched already mapped (a new array's pages are mapped and zeroed again on
        first touch, on the caller's time: ~0.8 ms a growth of an 8 MB arena)."""
        with self._lock:
            if workspace_bytes + 64 > self.workspace.size:
                # (zeros: pages mapped lazily, so the part no shape touches costs nothing)
                self.workspace = np.zeros(int((workspace_bytes + 64) * ARENA_GROWTH), dtype=np.uint8)
                self._ws_ptr = self.workspace.ctypes.data + (-self.workspace.ctypes.data) % 64
                self._fixed_ptrs = [ctypes.c_void_p(self.weights.ctypes.data), ctypes.c_void_p(self._ws_ptr)]
            try:
                rc = self.entry(*ptrs, *self._fixed_ptrs, *more)
            finally:
                if self._release is not None:
                    self._release()
        if rc != 0:
            raise KilnError(self._failure(rc), stage="run")

    def _call_strings(self, inputs: list) -> list[np.ndarray]:
        """A call whose inputs or outputs hold strings (kiln_str arrays both ways)."""
        ins, keep = _native_arrays(inputs)
        outs = [(np.zeros(shape, strings.KILN_STR) if dt == object else np.empty(shape, dt))
                for shape, dt in self.output_types]
        ptrs = data_pointers(ins + outs) + self._fixed_ptrs
        with self._lock:
            try:
                rc = self.entry(*ptrs)
                if rc == 0:  # strings are read before the arena (and the inputs' bytes) go
                    outs = [strings.from_native(o, self._gather) if o.dtype == strings.KILN_STR else o for o in outs]
            finally:
                if self._release is not None:
                    self._release()
        del keep
        if rc != 0:
            raise KilnError(self._failure(rc), stage="run")
        return outs

    def profile(self, inputs: list[np.ndarray], call_args: list, runs: int = 10, warm: bool = False
                ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Run the entry's kernels one by one, `runs` times, timing each. Returns the outputs
        and, per call, its seconds in each run. `call_args` is the build's record of the
        entry's calls (kernel symbol, and per argument its base buffer and byte offset).
        `warm`: each call `runs` times in a row (profile_order), so it finds its weights and
        inputs in cache as far as they fit, where the entry's order reads them after the other
        kernels' (what that order costs beyond warm is the model's memory traffic); the outputs
        are then not the model's (a kernel that writes over its input runs on its own result)."""
        ins, keep = _native_arrays(inputs)
        outs = [(np.zeros(shape, strings.KILN_STR) if dt == object else np.empty(shape, dt))
                for shape, dt in self.output_types]
        base = {f"in{k}": a.ctypes.data for k, a in enumerate(ins)}
        base.update({f"out{k}": a.ctypes.data for k, a in enumerate(outs)})
        base.update(weights=self.weights.ctypes.data, workspace=self._ws_ptr)
        calls = []
        for symbol, args in call_args:
            fn = getattr(self.lib, symbol)
            fn.restype = ctypes.c_int32
            calls.append((fn, [ctypes.c_void_p(base[b] + off) for b, off in args]))
        times = np.zeros((len(calls), runs))
        clock = time.perf_counter
        with self._lock:
            for k, r in profile_order(len(calls), runs, warm):
                fn, ptrs = calls[k]
                t0 = clock()
                rc = fn(*ptrs)
                times[k, r] = clock() - t0
                if rc != 0:
                    if self._release is not None:
                        self._release()
                    raise KilnError(self._failure(-(k + 2 + ((rc if 0 < rc < 1023 else 1023) << 20))),
                                    stage="run")
            outs = [strings.from_native(o, self._gather) if o.dtype == strings.KILN_STR else o for o in outs]
            if self._release is not None:
                self._release()
        del keep
        return outs, list(times)

    def _failure(self, rc: int) -> str:
        """The message for the entry's status `rc` (see kiln.codegen.c: the failing call
        in the low 20 bits of -rc-2, the kernel's own status above them)."""
        if rc == -1:
            return "native code could not allocate memory"
        m = -rc - 2
        k, code = m & 0xFFFFF, m >> 20
        what = self.call_nodes[k] if 0 <= k < len(self.call_nodes) else f"call {k}"
        errors = self.call_errors[k] if 0 <= k < len(self.call_errors) else {}
        text = failure_text(code, errors, error_value(self.lib))
        # a check names its node (a fused kernel computes several); an extern kernel's does not
        return text if text.split(": ", 1)[0] in what.split(" + ") else f"{what}: {text}"


def profile_order(calls: int, runs: int, warm: bool) -> list[tuple[int, int]]:
    """(call, run) in the order NativeModule.profile makes them: every call once per run, in the
    entry's order; `warm`: call by call, each `runs` times in a row."""
    if warm:
        return [(k, r) for k in range(calls) for r in range(runs)]
    return [(k, r) for r in range(runs) for k in range(calls)]


def error_value(lib) -> int | None:
    """The bad value the last failed check on this thread reported (None: not reported)."""
    fn = getattr(lib, "kiln_error_value", None)
    if fn is None:
        return None
    out = ctypes.c_int64(0)
    fn.restype = ctypes.c_int32
    fn(ctypes.byref(out))
    return int(out.value)


def failure_text(code: int, errors: dict, value: int | None) -> str:
    """What a kernel's non-zero status `code` means, with the value it reported."""
    if code in (-1, 1023):
        return "native code could not allocate memory"
    msg = errors.get(code)
    if msg is None:
        return (f"bad input data (status {code}): an index or size read from the inputs is out of "
                "range")
    return msg.replace("{value}", "?" if value is None else str(value))


def _native_arrays(arrays: list) -> tuple[list[np.ndarray], list]:
    """Contiguous arrays as native code reads them: string (object) arrays become kiln_str
    arrays; returns those and what must stay alive until the call returns."""
    out, keep = [], []
    for x in arrays:
        x = np.asarray(x)
        if x.dtype == object or x.dtype.kind in "SU":
            x, blob = strings.to_native(x)
            keep.append(blob)
        out.append(np.ascontiguousarray(x))
    return out, keep
