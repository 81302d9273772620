"""Host CPU feature detection: which ISA extensions exist and how wide vectors are.

Read from /proc/cpuinfo where there is one, else ask the C compiler what
`-march=native` enables. Never assume AVX-512: callers ask `vector_bytes()`.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess

_INTERESTING = {"sse2", "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw",
                "avx512vl", "avx512dq", "avx512_fp16", "avx512_bf16", "avx512_vnni", "amx_tile",
                "neon", "asimd", "sve", "fp16", "asimdhp"}


@functools.lru_cache(maxsize=None)
def cpu_features() -> frozenset:
    """Lower-case feature names of this CPU, e.g. {'avx2', 'fma', 'avx512f'}."""
    feats: set = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    feats.update(rest.split())
                    break
    except OSError:
        pass
    if not feats:
        feats = _from_compiler()
    return frozenset(f for f in feats if f in _INTERESTING or f.startswith(("avx", "sse", "amx")))


def _from_compiler() -> set:
    cc = os.environ.get("KILN_CC") or shutil.which("cc") or "cc"
    try:
        out = subprocess.run([cc, "-march=native", "-Q", "--help=target"], capture_output=True,
                             text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return set()
    names = re.findall(r"^\s*-m([a-z0-9_.-]+)\s+\[enabled\]", out, re.M)
    return {n.replace("avx512", "avx512").replace(".", "_").replace("-", "_") for n in names}


def vector_bytes(features: frozenset | None = None) -> int:
    """Widest SIMD register in bytes: 64 (AVX-512), 32 (AVX/AVX2), else 16."""
    f = cpu_features() if features is None else features
    if "avx512f" in f:
        return 64
    if "avx2" in f or "avx" in f:
        return 32
    return 16


def vector_lanes(itemsize: int, features: frozenset | None = None) -> int:
    """How many elements of `itemsize` bytes fit in one vector register."""
    return max(1, vector_bytes(features) // itemsize)
