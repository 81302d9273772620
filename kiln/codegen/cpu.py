"""Host CPU feature detection: which ISA extensions exist and how wide vectors are.

Detection itself lives in `kiln.runtime.cpu` (a loaded artifact needs it too,
without the compiler). Never assume AVX-512: callers ask `vector_bytes()`.
"""

from __future__ import annotations

from kiln.runtime.cpu import cpu_features  # noqa: F401  (re-exported)


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
