"""Compile C source with the system compiler, cache the .so by content hash, load it.

The cache key hashes the source, the compiler command and flags, the compiler's
version banner and (for -march=native) this CPU's features, so a shared cache dir
never serves a library built for another machine. Writes go to a temp file that is
renamed into place, so concurrent builds of the same source cannot collide.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shlex
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from kiln.errors import KilnError
from kiln.codegen.c import emit_c, func_symbol
from kiln.codegen.cpu import cpu_features
from kiln.loops.stmt import ExternFunc, LoopModule, PrimFunc

DEFAULT_CFLAGS = "-O3 -march=native -fopenmp -fwrapv -fno-math-errno"
_REQUIRED = ["-shared", "-fPIC", "-std=gnu11"]


def cache_dir() -> Path:
    d = os.environ.get("KILN_CACHE_DIR")
    return Path(d) if d else Path.home() / ".cache" / "kiln"


def _cc(cc: str | None) -> list:
    return shlex.split(cc or os.environ.get("KILN_CC") or "cc")


def _flags(cflags) -> list:
    if cflags is None:
        cflags = os.environ.get("KILN_CFLAGS") or DEFAULT_CFLAGS
    flags = shlex.split(cflags) if isinstance(cflags, str) else list(cflags)
    return flags + [f for f in _REQUIRED if f not in flags]


@functools.lru_cache(maxsize=None)
def compiler_version(cc: tuple) -> str:
    try:
        r = subprocess.run([*cc, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        raise KilnError(f"C compiler {' '.join(cc)!r} cannot be run: {e}", stage="codegen") from None
    return r.stdout.strip()


def compile_c(source: str, cc: str | None = None, cflags=None) -> Path:
    """Build `source` into a shared library (or find it in the cache); returns its path."""
    cmd, flags = _cc(cc), _flags(cflags)
    native = any("native" in f for f in flags)
    key = hashlib.sha256("\0".join([source, *cmd, *flags, compiler_version(tuple(cmd)),
                                    ",".join(sorted(cpu_features())) if native else ""]).encode()).hexdigest()[:40]
    out_dir = cache_dir() / "c"
    so = out_dir / f"{key}.so"
    if so.exists():
        return so
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, src_tmp = tempfile.mkstemp(suffix=".c", prefix=f".{key}.", dir=out_dir)
    with os.fdopen(fd, "w") as f:
        f.write(source)
    fd, so_tmp = tempfile.mkstemp(suffix=".so", prefix=f".{key}.", dir=out_dir)
    os.close(fd)
    try:
        r = subprocess.run([*cmd, *flags, "-o", so_tmp, src_tmp, "-lm"], capture_output=True, text=True)
        if r.returncode != 0:
            tail = (r.stderr or r.stdout)[-3000:]
            raise KilnError(f"C compiler failed (exit {r.returncode}): {' '.join(cmd + flags)}\n{tail}",
                            stage="codegen")
        os.replace(src_tmp, out_dir / f"{key}.c")
        os.replace(so_tmp, so)
    finally:
        for p in (src_tmp, so_tmp):
            if os.path.exists(p):
                os.unlink(p)
    return so


class Kernel:
    """A callable compiled PrimFunc that checks numpy arguments against its params."""

    def __init__(self, lib: ctypes.CDLL, func: PrimFunc):
        self.func = func
        self.cfunc = getattr(lib, func_symbol(func.name))
        self.cfunc.argtypes = [ctypes.c_void_p] * len(func.params)
        self.cfunc.restype = ctypes.c_int32

    def __call__(self, *arrays):
        ps = self.func.params
        if len(arrays) != len(ps):
            raise KilnError(f"kernel {self.func.name!r} takes {len(ps)} arrays "
                            f"({', '.join(p.name for p in ps)}), got {len(arrays)}")
        ptrs = []
        for p, a in zip(ps, arrays):
            if not isinstance(a, np.ndarray) or a.dtype != p.dtype.np or a.shape != tuple(p.shape) \
                    or not a.flags.c_contiguous:
                got = f"{a.dtype}{list(a.shape)}" if isinstance(a, np.ndarray) else type(a).__name__
                raise KilnError(f"kernel {self.func.name!r} argument {p.name!r}: expected a C-contiguous "
                                f"{p.dtype}{list(p.shape)} array, got {got}")
            ptrs.append(a.ctypes.data)
        rc = self.cfunc(*ptrs)
        if rc != 0:
            why = "out of memory" if rc == -1 else "bad input data, e.g. an index out of range"
            raise KilnError(f"kernel {self.func.name!r} failed (status {rc}: {why})")


class CModule:
    """A loaded shared library built from a LoopModule; `mod["name"](*arrays)` runs a kernel."""

    def __init__(self, module: LoopModule, source: str, path: Path):
        self.module, self.source, self.path = module, source, path
        self.lib = ctypes.CDLL(str(path))
        self.kernels = {f.name: Kernel(self.lib, f) for f in module.funcs}

    def __getitem__(self, name: str) -> Kernel:
        try:
            return self.kernels[name]
        except KeyError:
            raise KilnError(f"no kernel {name!r} in module (have {sorted(self.kernels)})") from None

    def __call__(self, *arrays):
        """Call the entry function (or the only kernel)."""
        name = self.module.entry or (self.module.funcs[0].name if len(self.module.funcs) == 1 else None)
        if name is None:
            raise KilnError("module has several kernels and no entry; use module[name](...)")
        return self[name](*arrays)


def build_c(module: LoopModule | PrimFunc, cc: str | None = None, cflags=None) -> CModule:
    """Emit, compile (cached) and load a module; flags default to $KILN_CFLAGS or -O3 -march=native -fopenmp."""
    if isinstance(module, (PrimFunc, ExternFunc)):
        module = LoopModule([module])
    source = emit_c(module)
    return CModule(module, source, compile_c(source, cc, cflags))
