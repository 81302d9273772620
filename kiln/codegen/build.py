"""Compile C source with the system compiler, cache the .so by content hash, load it.

The code is built for a `Target` (kiln.targets.target: its -march and vector width);
the cache key hashes the source, the compiler command and flags, the compiler's
version banner and (for -march=native) the target's features, so a shared cache dir
never serves a library built for another machine. Writes go to a temp file that is
renamed into place, so concurrent builds of the same source cannot collide. Each
library's sha256 is recorded beside it (`KEY.sha256`) and checked before the library is
served or loaded: a damaged entry is rebuilt (kiln.codegen.cachedir says why).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np

from kiln.codegen import tiers
from kiln.codegen.cachedir import building, cache_dir, private_dir, sha256_file, write_atomic
from kiln.errors import KilnError
from kiln.timing import stage
from kiln.runtime import native as _native  # (importing it sets the OpenMP wait policy first)
from kiln.runtime import strings as _strings
from kiln.codegen.c import emit_c, emit_c_units, func_symbol, is_shared_unit
from kiln.codegen.csource import SHARED_BEGIN
from kiln.codegen.toolchain import (DEFAULT_CFLAGS, _cc, _flags, _libs, compiler_version,  # noqa: F401
                                    default_cflags, sanitizer_flags, start_probes)
from kiln.loops.stmt import ExternFunc, LoopModule, PrimFunc
from kiln.targets.target import Target, host_cores


def compile_c(source: str | list[str], target: Target, cc: str | None = None, cflags=None,
              libs=(), reuse: list | None = None) -> Path:
    """Build C source (one text, or several translation units compiled in parallel and
    linked) for `target` into a shared library, or find it in the cache; returns its path.
    `libs`: more libraries to link (names for -l); `reuse`: other flags whose cached
    shared-unit objects serve before these flags' (a quick tier's build links the -O3
    objects it finds: kiln.codegen.tiers)."""
    units = [source] if isinstance(source, str) else list(source)
    cmd = _cc(cc)
    flags = _flags(cflags, target, cmd)
    extra = [f"-l{name}" for name in libs]
    key = _key(units + extra, cmd, flags, target)
    so = private_dir("c") / f"{key}.so"
    if verified_sha256(so) is not None:
        return so
    with building("c", key):
        if verified_sha256(so) is None:   # (else built while this one waited)
            _build(units, cmd, flags, extra, so, target, reuse)
    return so


def _key(texts: list[str], cmd: list, flags: list, target: Target) -> str:
    """The build cache's key of what `texts` compile to with `cmd` and `flags` for `target`."""
    native = any("native" in f for f in flags)
    return hashlib.sha256("\0".join([*texts, *cmd, *flags, compiler_version(tuple(cmd)),
                                     ",".join(sorted(target.features)) if native else ""]).encode()).hexdigest()[:40]


def _build(units: list[str], cmd: list, flags: list, extra: list, so: Path, target: Target,
           reuse: list | None = None) -> None:
    with tempfile.TemporaryDirectory(prefix=f".{so.stem}.", dir=so.parent) as tmp, \
            contextlib.ExitStack() as held:
        srcs = []
        for i, text in enumerate(units):
            srcs.append(os.path.join(tmp, f"unit{i}.c"))
            with open(srcs[-1], "w") as f:
                f.write(text)
        so_tmp = os.path.join(tmp, "module.so")
        if len(srcs) == 1:
            with stage("cc"):
                _run([*cmd, *flags, "-o", so_tmp, srcs[0], *extra, *_libs(flags)], cmd + flags)
        else:
            objs = [s[:-2] + ".o" for s in srcs]
            # a shared kernel's unit: its object from the per-machine cache, else compiled
            # with the others and put there (under its lock: two builders compile it once)
            cached, elsewhere = {}, {}
            for k in sorted((i for i, u in enumerate(units) if is_shared_unit(u)),
                            key=lambda i: _key([units[i]], cmd, flags, target)):
                obj = private_dir("o") / f"{_key([units[k]], cmd, flags, target)}.o"
                final = reuse and private_dir("o") / f"{_key([units[k]], cmd, reuse, target)}.o"
                if final and verified_sha256(final) is not None:
                    objs[k] = str(final)
                    continue
                with _PREBUILDING_LOCK:
                    thread = _PREBUILDING.get(str(obj))
                    at_final = final and _PREBUILDING.get(str(final))
                if at_final:                       # the -O3 object being compiled (kiln's pool): waited for
                    elsewhere[k] = final, at_final, True
                    continue
                if thread is not None:             # being compiled already (prebuild_shared)
                    elsewhere[k] = obj, thread, False
                    continue
                if verified_sha256(obj) is None:
                    held.enter_context(building("o", obj.stem))
                if verified_sha256(obj) is not None:
                    objs[k] = str(obj)
                else:
                    cached[k] = obj
            todo = [k for k in range(len(srcs)) if objs[k].startswith(tmp) and k not in elsewhere]
            with stage("cc"):
                _run_all([[*cmd, *flags, "-c", "-o", objs[k], srcs[k]] for k in todo], cmd + flags)
                for k, (obj, thread, other_flags) in elsewhere.items():   # its prebuild's object, or made here
                    thread.join()
                    if verified_sha256(obj) is None and not other_flags:   # (never these flags at -O3's key)
                        _shared_object(units[k], obj, cmd, flags)
                    if verified_sha256(obj) is None:
                        _run([*cmd, *flags, "-c", "-o", objs[k], srcs[k]], cmd + flags)   # (its error)
                    else:
                        objs[k] = str(obj)
            for k, obj in cached.items():
                _install(objs[k], units[k], obj)
                objs[k] = str(obj)
            held.close()
            with stage("link"):
                _run([*cmd, *flags, "-o", so_tmp, *objs, *extra, *_libs(flags)], cmd + flags)
        _install(so_tmp, joined_source(units), so)


# shared-unit object path -> the thread compiling it (prebuild_shared), while it runs
_PREBUILDING: dict[str, threading.Thread] = {}
_PREBUILDING_LOCK = threading.Lock()


def prebuild_shared(func, target: Target, cflags: list | None = None, final: list | None = None) -> None:
    """Start compiling, in a thread, the shared units of a kernel just lowered (kiln.codegen.csource
    c_shared: objects kept per machine) that the cache lacks, so the C compiler works on them
    while Python lowers and emits the rest of the module; the module's build then waits for
    the object instead of compiling it (ResNet-18's Winograd kernel: 0.4 s of a cold compile's
    1.3 s of C compiler time, on the core the Python stages leave idle). `cflags`: a quick
    tier's (kiln.codegen.tiers), skipped where the object at `final` flags is cached."""
    preamble = getattr(func, "preamble", None)
    if not preamble or SHARED_BEGIN not in preamble:
        return
    from kiln.codegen.c import _SHARED
    _prebuild_blocks(_SHARED.findall(preamble), target, cflags=cflags, final=final)


def prebuild_pool(target: Target) -> threading.Thread | None:
    """At the start of a cold compile for `target`: compile kiln's pool (a shared unit of
    every pool module, kiln.codegen.c.pool_block) in a thread, after the toolchain's probes,
    while the passes run, unless the per-machine cache has its object. The thread (None: no
    pool) is the compile's to join."""
    if target.threads_impl != "pool":
        return None
    from kiln.codegen.c import pool_block
    t = threading.Thread(target=_prebuild_blocks, args=([pool_block()], target, True), name="kiln-cc-pool",
                         daemon=True)
    t.start()
    return t


def _prebuild_blocks(blocks: list[str], target: Target, here: bool = False, cflags: list | None = None,
                     final: list | None = None) -> None:
    """Start compiling, each in a thread (`here`: one after another in this one), the shared
    `blocks` whose objects the cache lacks (at `cflags`, default the target's; none whose
    object at `final` flags is cached)."""
    from kiln.codegen.c import shared_unit
    cmd = _cc(None)
    try:
        flags = cflags or _flags(None, target, cmd)
    except KilnError:
        return      # (a bad $KILN_SANITIZE: the build says so)
    for block in blocks:
        unit = shared_unit(block)
        try:
            obj = private_dir("o") / f"{_key([unit], cmd, flags, target)}.o"
            if final and verified_sha256(private_dir("o") / f"{_key([unit], cmd, final, target)}.o") is not None:
                continue
        except KilnError:
            return      # (no cache dir: the build says so)
        with _PREBUILDING_LOCK:
            if str(obj) in _PREBUILDING or verified_sha256(obj) is not None:
                continue
            t = _PREBUILDING[str(obj)] = threading.current_thread() if here else \
                threading.Thread(target=_prebuild, args=(unit, obj, cmd, flags), name="kiln-cc-shared", daemon=True)
        if here:
            _prebuild(unit, obj, cmd, flags)
        else:
            t.start()


def shared_known(unit: str, target: Target, flags: list) -> bool:
    """Whether shared unit `unit`'s object built with `flags` is in the per-machine cache or
    being compiled (kiln's pool, at the start of a cold compile: prebuild_pool)."""
    obj = private_dir("o") / f"{_key([unit], _cc(None), flags, target)}.o"
    with _PREBUILDING_LOCK:
        if str(obj) in _PREBUILDING:
            return True
    return verified_sha256(obj) is not None


def _prebuild(unit: str, obj: Path, cmd: list, flags: list) -> None:
    try:
        _shared_object(unit, obj, cmd, flags)
    finally:
        with _PREBUILDING_LOCK:
            _PREBUILDING.pop(str(obj), None)


def _shared_object(unit: str, obj: Path, cmd: list, flags: list) -> None:
    """Compile shared unit `unit` into the per-machine object `obj` (once: under its lock)."""
    try:
        with building("o", obj.stem):
            if verified_sha256(obj) is not None:
                return
            with tempfile.TemporaryDirectory(prefix=f".{obj.stem}.", dir=obj.parent) as tmp:
                src, out = os.path.join(tmp, "unit.c"), os.path.join(tmp, "unit.o")
                with open(src, "w") as f:
                    f.write(unit)
                _run([*cmd, *flags, "-c", "-o", out, src], cmd + flags)
                _install(out, unit, obj)
    except KilnError:
        pass    # the module's build compiles it again, and reports the error


def _install(built: str, source: str, path: Path) -> None:
    """Move `built` (made from C `source`) into the cache as `path`, with its record and source.
    The record goes first: whoever finds the new file also finds its hash (a concurrent
    builder's record may win; a mismatch is then a rebuild, never a load)."""
    text = source.encode()
    write_atomic(path.with_suffix(".sha256"),
                 f"{sha256_file(built)}  {path.name}\n{hashlib.sha256(text).hexdigest()}  {path.stem}.c\n".encode())
    write_atomic(path.with_suffix(".c"), text)
    os.replace(built, path)


def recorded_sha256(so: Path) -> tuple[str, str] | None:
    """The sha256s recorded for cached library `so` and its C source (None if unreadable)."""
    try:
        lines = so.with_suffix(".sha256").read_text().split("\n")
        lib, src = lines[0].split()[0], lines[1].split()[0]
    except (OSError, ValueError, IndexError):
        return None
    return lib, src


def verified_sha256(so: Path) -> str | None:
    """The sha256 of cached library `so` if its bytes are the ones recorded, else None
    (missing, truncated, damaged or replaced: build it again)."""
    rec = recorded_sha256(so)
    return rec[0] if rec is not None and sha256_file(so) == rec[0] else None


def cached_source(so: Path) -> str | None:
    """The C source cached library `so` was built from, if it is the one recorded."""
    rec, c = recorded_sha256(so), so.with_suffix(".c")
    if rec is None or sha256_file(c) != rec[1]:
        return None
    return c.read_text()


_RUNS = [0, 0]      # compiler processes started: on the caller's path, in background builds
_RUNS_LOCK = threading.Lock()


def compiler_runs(background: bool = False) -> int:
    """How many C compiler processes kiln's builds have started in this process (the
    toolchain probes, run once per process, are not counted): tests check that what
    should come from the cache compiles nothing. `background`: those of the optimised
    builds that run behind a quick tier (kiln.codegen.tiers) instead."""
    return _RUNS[1 if background else 0]


def _run(argv: list, shown: list) -> None:
    _run_all([argv], shown)


def _run_all(argvs: list[list], shown: list) -> None:
    """Run compiler commands side by side; a failure is a KilnError with its output."""
    with _RUNS_LOCK:
        _RUNS[1 if tiers.in_background() else 0] += len(argvs)
    procs = [subprocess.Popen(tiers.niced(a), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for a in argvs]
    results = [p.communicate() + (p.returncode,) for p in procs]
    for out, err, rc in results:
        if rc != 0:
            raise KilnError(f"C compiler failed (exit {rc}): {' '.join(shown)}\n{(err or out)[-3000:]}",
                            stage="codegen")


class Kernel:
    """A callable compiled PrimFunc that checks numpy arguments against its params."""

    def __init__(self, lib: ctypes.CDLL, func: PrimFunc):
        self.func, self.lib = func, lib
        self.cfunc = getattr(lib, func_symbol(func.name))
        self.cfunc.argtypes = [ctypes.c_void_p] * len(func.params)
        self.cfunc.restype = ctypes.c_int32
        self.release = _strings.release_function(lib)
        self.gather = _strings.gather_function(lib)

    def __call__(self, *arrays):
        ps = self.func.params
        if len(arrays) != len(ps):
            raise KilnError(f"kernel {self.func.name!r} takes {len(ps)} arrays "
                            f"({', '.join(p.name for p in ps)}), got {len(arrays)}")
        ptrs, keep, strs = [], [], []
        for p, a in zip(ps, arrays):
            native_str = isinstance(a, np.ndarray) and a.dtype == _strings.KILN_STR and p.dtype.name == "string"
            if not isinstance(a, np.ndarray) or (a.dtype != p.dtype.np and not native_str) or a.shape != tuple(p.shape) \
                    or not a.flags.c_contiguous:
                got = f"{a.dtype}{list(a.shape)}" if isinstance(a, np.ndarray) else type(a).__name__
                raise KilnError(f"kernel {self.func.name!r} argument {p.name!r}: expected a C-contiguous "
                                f"{p.dtype}{list(p.shape)} array, got {got}")
            if a.dtype == object:  # strings: passed as kiln_str arrays, results written back
                native, blob = _strings.to_native(a) if p.name.startswith("in") else \
                    (np.zeros(a.shape, _strings.KILN_STR), None)
                keep += [native, blob]
                if not p.name.startswith("in"):
                    strs.append((a, native))
                a = native
            ptrs.append(a.ctypes.data)
        try:
            rc = self.cfunc(*ptrs)
            if rc == 0:
                for a, native in strs:
                    a[...] = _strings.from_native(native, self.gather)
        finally:
            if self.release is not None and keep:
                self.release()
        if rc != 0:
            why = _native.failure_text(rc, dict(self.func.errors), _native.error_value(self.lib))
            raise KilnError(f"kernel {self.func.name!r} failed (status {rc}): {why}")


class CModule:
    """A loaded shared library built from a LoopModule; `mod["name"](*arrays)` runs a kernel."""

    def __init__(self, module: LoopModule, source: str, path: Path):
        self.module, self.source, self.path = module, source, path
        rec = recorded_sha256(path)
        self.sha256 = rec[0] if rec else ""   # what the library was verified against
        self.lib = _native.load_library(path, self.sha256)
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


def c_units(module: LoopModule, target: Target | None = None) -> list[str]:
    """The module's C source for `target` (None: this host; its threads_impl says who runs
    the parallel loops) as translation units: for a big module one per core of the
    building machine (compiled in parallel), and one per shared kernel and for kiln's pool
    (their objects cached per machine: `compile_c`)."""
    impl = Target.of(target).threads_impl
    if len(module.funcs) > 4:
        return emit_c_units(module, host_cores(), impl)
    # a model's module on kiln's pool: the pool is a shared unit (kiln.codegen.c.pool_block);
    # kernels built by hand stay one unit (compiled and linked by one process)
    pooled = impl == "pool" and module.entry is not None
    if pooled or any(isinstance(f, ExternFunc) and SHARED_BEGIN in f.preamble for f in module.funcs):
        return emit_c_units(module, 1, impl)
    return [emit_c(module, impl)]


def joined_source(units: list[str]) -> str:
    """Translation units as one text: what the build cache keeps beside the library."""
    return "\n/* ---- next translation unit ---- */\n".join(units)


def build_c(module: LoopModule | PrimFunc, target: Target | None = None, cc: str | None = None,
            cflags=None, units: list[str] | None = None, reuse: list | None = None) -> CModule:
    """Emit (unless its `units` are given: `c_units`), compile (cached) and load a module
    built for `target` (None: this host, for kernels built by hand); flags default to
    $KILN_CFLAGS or -O3 -march=<target> -fopenmp."""
    target = Target.of(target)
    if isinstance(module, (PrimFunc, ExternFunc)):
        module = LoopModule([module])
    libs = sorted({lib for f in module.funcs if isinstance(f, ExternFunc) for lib in f.libs})
    for name, header, package in libs:
        require_c_library(name, header, package, tuple(_cc(cc)))
    units = c_units(module, target) if units is None else units
    return CModule(module, "\n".join(units), compile_c(units, target, cc, cflags, [name for name, _, _ in libs], reuse))


@functools.lru_cache(maxsize=None)
def require_c_library(name: str, header: str, package: str, cc: tuple = ("cc",)) -> None:
    """Fail clearly unless a program including `header` links with -l`name` (a compile
    probe, once per process): a kernel built on a C library names what to install."""
    src = f"#include <stdio.h>\n#include <{header}>\nint main(void) {{ return 0; }}\n"
    with tempfile.TemporaryDirectory() as tmp:
        c = os.path.join(tmp, "probe.c")
        with open(c, "w") as f:
            f.write(src)
        try:
            r = subprocess.run([*cc, "-o", os.path.join(tmp, "probe"), c, f"-l{name}"],
                               capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.SubprocessError) as e:
            raise KilnError(f"C compiler {' '.join(cc)!r} cannot be run: {e}", stage="codegen") from None
    if r.returncode != 0:
        raise KilnError(f"this kernel needs the C library lib{name} and its header <{header}>, which "
                        f"this machine lacks (on Debian/Ubuntu: apt-get install {package}):\n"
                        f"{(r.stderr or r.stdout)[-600:]}", stage="codegen")
