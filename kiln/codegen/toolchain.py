"""The C toolchain kiln builds with: the compiler command, its flags for a Target, its
version banner, and the probes whose answers enter the flags (glibc's libmvec).

Kept apart from kiln.codegen.build (compiling and caching libraries) so that the cache
keys, which hash these (kiln.targets.cache), are made without importing code generation:
a warm compile in a new process looks its model up before anything else is imported.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
from typing import TYPE_CHECKING

from kiln.codegen.cachedir import private_dir, stamped, write_atomic
from kiln.errors import KilnError
from kiln.timing import stage

if TYPE_CHECKING:
    from kiln.targets.target import Target

DEFAULT_CFLAGS = "-O3 -fopenmp -fwrapv -fno-math-errno"   # + the target's -march and vector width
# -fwrapv: generated code relies on signed integer wrapping (index arithmetic on values
# read from the inputs is range-checked, but may wrap before the check sees it)
_REQUIRED = ["-shared", "-fPIC", "-std=gnu11", "-fwrapv"]


def default_cflags(target: Target) -> str:
    """DEFAULT_CFLAGS plus the target's (-march, and on x86 the vector width the register
    tiles are sized for: Target.arch_flags says why), and with GCC no loops turned into
    library calls."""
    march, *more = target.arch_flags()
    flags = " ".join(["-O3", march, *DEFAULT_CFLAGS.split()[1:], *more])
    if "Free Software Foundation" in compiler_version(tuple(_cc(None))):
        # GCC turns a register tile's zeroing or copy-out loop into memset/memcpy, which
        # takes the tile's address and keeps 8 of a GEMM's 12 accumulators on the stack
        # (a load and a store per FMA): MatMul without an epilogue ran 1.7x slower
        flags += " -fno-tree-loop-distribute-patterns"
        # value numbering's alias queries per memory access (default 1000) are most of the
        # compile time of kernels with many unrolled loads (MobileNetV2's depthwise kernels:
        # 1.2 of 2.0 s each); at 200 the benchmark models' assembly is byte-identical and
        # MobileNetV2 compiles in 10.5 s of CPU instead of 12.7
        flags += " --param=sccvn-max-alias-queries-per-access=200"
    return flags


def _cc(cc: str | None) -> list:
    return shlex.split(cc or os.environ.get("KILN_CC") or "cc")


def _flags(cflags, target: Target, cc: list | None = None, probe: bool = True) -> list:
    """The compiler flags for `target`; `probe=False`: without the libmvec probe's answer
    (-DKILN_MVEC), a function of the others and the machine's libraries (a compile key
    taken before the probe has run: kiln.targets.cache.compile_key). Flags made by this
    function (a quick tier's: kiln.codegen.tiers) come back as they are."""
    if cflags is None:
        cflags = os.environ.get("KILN_CFLAGS") or default_cflags(target)
    flags = shlex.split(cflags) if isinstance(cflags, str) else list(cflags)
    flags = flags + [f for f in _REQUIRED if f not in flags] + sanitizer_flags()
    if probe and "-fopenmp" in flags and "-DKILN_MVEC" not in flags and _has_libmvec(tuple(cc or _cc(None)),
                                                                                      tuple(flags)):
        flags.append("-DKILN_MVEC")
    return flags


def start_probes(target: Target) -> None:
    """Run the toolchain's probes (the libmvec link test: a compile and a link, on an empty
    cache) in a thread, while the caller works on (the graph passes) until it needs them.
    Where the cache has their answers, the thread reads them (no code generator imported)."""
    threading.Thread(target=_probe_quietly, args=(target,), name="kiln-probe-cc", daemon=True).start()


def _probe_quietly(target: Target) -> None:
    try:
        _flags(None, target)
    except KilnError:
        pass   # (a bad $KILN_SANITIZE or no cache dir: the compile that needs the flags says so)


def sanitizer_flags() -> list:
    """$KILN_SANITIZE (e.g. "address,undefined"): build every module with those sanitizers,
    aborting at the first report. A process loading such a module must have the sanitizer
    runtime loaded first: LD_PRELOAD=$(cc -print-file-name=libasan.so) (see
    tests/sanitize/test_asan_ubsan.py). The flags enter every cache key, so sanitized and
    plain builds never share an entry."""
    which = os.environ.get("KILN_SANITIZE", "").strip()
    if not which:
        return []
    if not all(part.replace("-", "").isalnum() for part in which.split(",")):
        raise KilnError(f"KILN_SANITIZE={which!r} is not a comma-separated list of sanitizer names",
                        stage="codegen")
    return [f"-fsanitize={which}", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g1"]


def _libs(flags: list) -> list:
    return ["-lmvec", "-lm"] if "-DKILN_MVEC" in flags else ["-lm"]


_PROBING = threading.Lock()


@functools.lru_cache(maxsize=None)
def _has_libmvec(cc: tuple, flags: tuple) -> bool:
    """Whether glibc's vector math library links with every function kiln declares simd.
    The answer is kept in the cache dir per compiler (its version banner), flags and probe
    source: the probe's compile and link took a quarter of a warm compile in a new process.
    One probe at a time (`start_probes` may run it in a thread: a caller meeting it waits,
    then reads its answer from the cache dir)."""
    with _PROBING:
        return _probe_libmvec(cc, flags)


def _probe_libmvec(cc: tuple, flags: tuple) -> bool:
    from kiln.codegen.prelude import UNIT_PRELUDE
    src = UNIT_PRELUDE + "void kiln_probe(float* restrict a, int n) {\n#pragma omp simd\n" \
        "  for (int i = 0; i < n; ++i) a[i] = expf(a[i]) + tanhf(a[i]);\n}\n"
    argv = [*cc, *flags, "-DKILN_MVEC", "-o", "p.so", "probe.c", "-lmvec", "-lm", "-Wl,--no-undefined"]
    try:
        key = hashlib.sha256("\0".join([*argv, compiler_version(cc), src]).encode()).hexdigest()[:40]
        known = private_dir("c") / f"libmvec-{key}"
    except KilnError:
        known = None   # (no cache dir: probe every time)
    if known is not None and known.is_file() and known.read_bytes() in (b"yes", b"no"):
        return known.read_bytes() == b"yes"
    with tempfile.TemporaryDirectory() as tmp, stage("probe cc"):
        with open(os.path.join(tmp, "probe.c"), "w") as f:
            f.write(src)
        try:
            where = {"p.so": os.path.join(tmp, "p.so"), "probe.c": os.path.join(tmp, "probe.c")}
            ok = subprocess.run([where.get(a, a) for a in argv], capture_output=True, timeout=120).returncode == 0
        except (OSError, subprocess.SubprocessError):
            return False
    if known is not None:
        write_atomic(known, b"yes" if ok else b"no")
    return ok


@functools.lru_cache(maxsize=None)
def compiler_version(cc: tuple) -> str:
    """`cc --version`'s banner (part of every cache key), kept by the compiler binary's
    identity (kiln.codegen.cachedir.stamped: running it took 5-20 ms of a warm compile)."""
    found = shutil.which(cc[0]) if cc else None
    if found is None:
        return _version(cc)
    return stamped("cc-version-" + hashlib.sha256(repr(cc).encode()).hexdigest()[:16], [found],
                   lambda: _version(cc))


def _version(cc: tuple) -> str:
    try:
        r = subprocess.run([*cc, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        raise KilnError(f"C compiler {' '.join(cc)!r} cannot be run: {e}", stage="codegen") from None
    return r.stdout.strip()
