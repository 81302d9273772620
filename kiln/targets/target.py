"""`Target`: the CPU a module is compiled for, as one value passed down the pipeline.

Everything below `kiln.compile()` that depends on the machine (the NCHWc block, the
packed-weight panel width, register tiles, when forking threads pays, the C compiler's
-march, the module cache key) reads it from the `Target` it is handed, never from the
host. This module is the one place in the compiler that asks the host what it is
(`Target.host()`, cached); `kiln.runtime.cpu` is the other, for the loader's check
that a library's features exist on the CPU running it.

A target is made from the host, or from a CPU name as GCC's -march knows it
(`x86-64-v3`, `znver4`, `sapphirerapids`...): then the code runs on every CPU with
that name's features, whatever builds it. Feature names are /proc/cpuinfo's (the
vocabulary the loader checks against).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import platform
from dataclasses import dataclass

from kiln.errors import KilnError
from kiln.runtime import threads
from kiln.runtime.cpu import cpu_features, interesting

# -- CPU names: features as GCC's -march defines them (gcc/config/i386/i386.h, the
# x86-64 psABI levels), in /proc/cpuinfo's names; cache sizes per core from vendors' sheets
_V1 = {"sse", "sse2"}
_V2 = _V1 | {"ssse3", "sse4_1", "sse4_2", "popcnt"}   # (+ SSE3, cx16, lahf: not checked)
_V3 = _V2 | {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe"}
_V4 = _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
_SKX = _V4
_ICX = _SKX | {"avx512ifma", "avx512vbmi", "avx512_vbmi2", "avx512_vnni", "avx512_bitalg",
               "avx512_vpopcntdq"}
_SPR = _ICX | {"avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8"}
_ZEN = _V3 | {"sse4a"}
_ZEN4 = _ZEN | _ICX | {"avx512_bf16"}
KiB, MiB = 1 << 10, 1 << 20
# name: (arch, features, L1d, L2, L3 bytes)
NAMED = {
    "x86-64": ("x86_64", _V1, 32 * KiB, 512 * KiB, 8 * MiB),
    "x86-64-v2": ("x86_64", _V2, 32 * KiB, 512 * KiB, 8 * MiB),
    "x86-64-v3": ("x86_64", _V3, 32 * KiB, 512 * KiB, 8 * MiB),
    "x86-64-v4": ("x86_64", _V4, 32 * KiB, 1 * MiB, 16 * MiB),
    "haswell": ("x86_64", _V3, 32 * KiB, 256 * KiB, 8 * MiB),
    "skylake-avx512": ("x86_64", _SKX, 32 * KiB, 1 * MiB, 32 * MiB),
    "cascadelake": ("x86_64", _SKX | {"avx512_vnni"}, 32 * KiB, 1 * MiB, 32 * MiB),
    "icelake-server": ("x86_64", _ICX, 48 * KiB, 1280 * KiB, 48 * MiB),
    "sapphirerapids": ("x86_64", _SPR, 48 * KiB, 2 * MiB, 105 * MiB),
    "znver2": ("x86_64", _ZEN, 32 * KiB, 512 * KiB, 16 * MiB),
    "znver3": ("x86_64", _ZEN, 32 * KiB, 512 * KiB, 32 * MiB),
    "znver4": ("x86_64", _ZEN4, 32 * KiB, 1 * MiB, 32 * MiB),
    "armv8-a": ("aarch64", {"asimd", "neon"}, 64 * KiB, 1 * MiB, 8 * MiB),
}
# One core's rate of reading weights streamed once per use, in floats per us, where the machine
# was not measured (kiln.codegen.stream_cost): MobileNetV3's squeeze-excite 960 -> 240 and
# 240 -> 960 1x1 convs on one pixel took 30 and 36 us on the AVX-512 EPYC, one thread
STREAM_FLOATS_PER_US = 7e3
_DEFAULT_CACHES = (32 * KiB, 512 * KiB, 8 * MiB)   # where the host does not say
_X86 = ("x86_64", "amd64", "i686", "x86")


@dataclass(frozen=True)
class Target:
    """What code is generated for: the CPU (architecture, ISA features, caches, cores),
    the C compiler's -march/-mtune, and the threading runtime's wait policy."""
    name: str                   # "host", or the CPU name it was made from
    arch: str                   # "x86_64", "aarch64", ... (as platform.machine() says)
    features: frozenset         # /proc/cpuinfo names: {"avx2", "fma", ...}
    march: str                  # the C compiler's -march ("native" for the host)
    cores: int                  # hardware threads the code may run on
    l1d_bytes: int
    l2_bytes: int
    l3_bytes: int
    # OMP_WAIT_POLICY and GOMP_SPINCOUNT the code runs under (kiln.runtime.threads: by default
    # the threads sleep between kernels)
    omp_wait_policy: str = threads.wait_settings({})[0]
    omp_spincount: str = threads.wait_settings({})[1]
    threads_impl: str = threads.IMPL_DEFAULT   # who runs parallel loops: "omp" or kiln's "pool"
    # a fork and join measured on this machine (us; kiln.codegen.fork_cost.calibrated), 0: the
    # table's figure for the settings above (kiln.runtime.threads)
    fork_us_measured: float = 0.0
    # floats per us one core streams from beyond its caches, measured on this machine
    # (kiln.codegen.stream_cost.calibrated), 0: STREAM_FLOATS_PER_US
    stream_rate_measured: float = 0.0
    # floats per us all its cores stream together, each its own data at once, measured likewise
    # (0: each core at stream_rate)
    stream_rate_all_measured: float = 0.0

    # -- made from ... ----------------------------------------------------------------
    @staticmethod
    def host() -> "Target":
        """The machine running this process (cached: it does not change under us), with the
        threads implementation $KILN_THREADS_IMPL names now."""
        return _host(threads.impl())

    @staticmethod
    def named(name: str, **override) -> "Target":
        """The CPU GCC calls `name` (`x86-64-v3`, `znver4`...). Its core count is this
        host's unless `cores=` says (it sizes parallel tiles, not what the code may run on)."""
        if name in ("host", "native"):
            return dataclasses.replace(Target.host(), **override) if override else Target.host()
        if name not in NAMED:
            raise KilnError(f"unknown CPU {name!r}; choose host or one of {', '.join(sorted(NAMED))}")
        arch, feats, l1, l2, l3 = NAMED[name]
        t = Target(name, arch, frozenset(interesting(feats)), name, host_cores(), l1, l2, l3,
                   threads_impl=threads.impl())
        return dataclasses.replace(t, **override) if override else t

    @staticmethod
    def of(spec: "Target | str | None") -> "Target":
        """A Target as given, made from a name, or the host's (None)."""
        if spec is None:
            return Target.host()
        if isinstance(spec, Target):
            return spec
        if isinstance(spec, str):
            return Target.named(spec)
        raise KilnError(f"a CPU target is a kiln Target or a CPU name, got a {type(spec).__name__}")

    # -- what the code generator asks ---------------------------------------------------
    @property
    def vector_bytes(self) -> int:
        """Widest SIMD register in bytes: 64 (AVX-512), 32 (AVX/AVX2), else 16."""
        if "avx512f" in self.features:
            return 64
        if "avx2" in self.features or "avx" in self.features:
            return 32
        return 16

    def vector_lanes(self, itemsize: int) -> int:
        """How many elements of `itemsize` bytes fit in one vector register."""
        return max(1, self.vector_bytes // itemsize)

    @property
    def vector_registers(self) -> int:
        """Architectural vector registers: 32 with AVX-512 (or on AArch64), else 16."""
        f = self.features
        return 32 if "avx512f" in f or "asimd" in f or "neon" in f else 16

    @property
    def threads_spin(self) -> bool:
        """Whether idle OpenMP threads spin a while before they sleep (kiln's default), so a
        fork between the kernels of one inference needs no wake-up."""
        return threads.spins(self.omp_wait_policy, self.omp_spincount)

    @property
    def fork_us(self) -> float:
        """What forking a parallel kernel (and joining it) costs on this target, in us: as
        measured on this machine where the compiler did (the host), else the table's figure."""
        return self.fork_us_measured or threads.fork_us(self.omp_wait_policy, self.omp_spincount, self.threads_impl)

    @property
    def stream_rate(self) -> float:
        """Floats per us one core reads of data streamed once from beyond its caches (a model's
        weights, read once per inference): as measured on this machine where the compiler did
        (the host), else STREAM_FLOATS_PER_US."""
        return self.stream_rate_measured or STREAM_FLOATS_PER_US

    @property
    def stream_rate_all(self) -> float:
        """Floats per us all the target's cores read together, each streaming its share at once
        (a parallel kernel's weights): as measured on this machine, where cores that share one
        stream read less than `cores` times stream_rate; else each at stream_rate."""
        return self.stream_rate_all_measured or max(1, self.cores) * self.stream_rate

    def arch_flags(self) -> list[str]:
        """The C compiler flags that pick this CPU: -march, and on x86 the vector width the
        register tiles are sized for (-march=native also picks a tuning, and some tunings
        prefer narrower vectors than the CPU has: GCC takes an AMD EPYC VM for znver1 and
        emits 128-bit code for 256-bit tiles, MLP GEMMs 46 vs 70 GFLOP/s on 2 cores)."""
        flags = [f"-march={self.march}"]
        if self.arch in _X86:
            flags.append(f"-mprefer-vector-width={self.vector_bytes * 8}")
        return flags

    def key(self) -> str:
        """A stable text naming everything code generation reads from the target: part of
        the module cache key and of tuning records."""
        return (f"{self.arch};march={self.march};features={','.join(sorted(self.features))};"
                f"cores={self.cores};cache={self.l1d_bytes},{self.l2_bytes},{self.l3_bytes};"
                f"omp={self.omp_wait_policy},{self.omp_spincount}"
                + (f";threads={self.threads_impl}" if self.threads_impl != "omp" else "")
                + (f";fork_us={self.fork_us_measured:g}" if self.fork_us_measured else "")
                + (f";stream={self.stream_rate_measured:g}" if self.stream_rate_measured else "")
                + (f";stream_all={self.stream_rate_all_measured:g}" if self.stream_rate_all_measured else ""))

    def describe(self) -> str:
        return (f"{self.name} ({self.arch}, -march={self.march}, {self.vector_bytes * 8}-bit vectors, "
                f"{self.vector_registers} registers, {self.cores} cores, L2 {self.l2_bytes >> 10} KiB)")


# -- host queries: the only ones in the compiler -------------------------------------------
@functools.lru_cache(maxsize=None)
def _host(threads_impl: str) -> Target:
    l1, l2, l3 = host_caches()
    return Target("host", platform.machine().lower(), frozenset(cpu_features()), "native",
                  host_cores(), l1, l2, l3, *threads.wait_settings(), threads_impl)


def host_cores() -> int:
    """Hardware threads of this machine (also the default thread count of kiln's tools)."""
    return os.cpu_count() or 1


@functools.lru_cache(maxsize=1)
def host_caches() -> tuple[int, int, int]:
    """(L1d, L2, L3) bytes per core of CPU 0 from sysfs; defaults where it does not say."""
    found: dict[int, int] = {}
    root = "/sys/devices/system/cpu/cpu0/cache"
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        entries = []
    for e in entries:
        if not e.startswith("index"):
            continue
        try:
            with open(f"{root}/{e}/level") as f:
                level = int(f.read())
            with open(f"{root}/{e}/type") as f:
                kind = f.read().strip()
            with open(f"{root}/{e}/size") as f:
                size = _size(f.read().strip())
        except (OSError, ValueError):
            continue
        if kind in ("Data", "Unified") and size:
            found.setdefault(level, size)
    return tuple(found.get(level, d) for level, d in zip((1, 2, 3), _DEFAULT_CACHES))


def _size(text: str) -> int:
    mult = {"K": KiB, "M": MiB, "G": 1 << 30}.get(text[-1:].upper(), 1)
    return int(text.rstrip("KMGkmg")) * mult
