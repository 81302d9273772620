"""Host CPU identity: architecture and ISA extensions (AVX2, AVX-512, NEON, ...).

Lives in the runtime, not in codegen, because both sides need it: the compiler
through `kiln.targets.target.Target.host()` (its one reader here: everything below
`compile()` is handed a Target instead), and a loaded artifact to refuse a library
this CPU cannot execute (a clear error instead of an illegal-instruction crash). Reads /proc/cpuinfo where there is one, else
asks the C compiler what `-march=native` enables.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import shutil
import subprocess

# vector ISAs, plus the scalar extensions -march=native lets GCC emit (shlx, lzcnt, movbe, popcnt)
_INTERESTING = {"sse2", "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw",
                "avx512vl", "avx512dq", "avx512_fp16", "avx512_bf16", "avx512_vnni", "amx_tile",
                "bmi1", "bmi2", "abm", "movbe", "popcnt",
                "neon", "asimd", "sve", "fp16", "asimdhp"}


def machine() -> str:
    """The CPU architecture as the OS names it: 'x86_64', 'aarch64', ..."""
    return platform.machine().lower()


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
    return interesting(feats)


def interesting(features) -> frozenset:
    """The features kiln records and checks (vector ISAs and what -march lets GCC emit)."""
    return frozenset(f for f in features if f in _INTERESTING or f.startswith(("avx", "sse", "amx")))


def _from_compiler() -> set:
    cc = os.environ.get("KILN_CC") or shutil.which("cc") or "cc"
    try:
        out = subprocess.run([cc, "-march=native", "-Q", "--help=target"], capture_output=True,
                             text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return set()
    names = re.findall(r"^\s*-m([a-z0-9_.-]+)\s+\[enabled\]", out, re.M)
    return {n.replace(".", "_").replace("-", "_") for n in names}


def missing_features(required) -> list[str]:
    """The features in `required` that this CPU lacks, sorted (empty: it can run the code).

    $KILN_CHECK_CPU_FEATURES (comma-separated names) replaces the detected set for this
    check only: what a CPU with those features would say of an artifact (tests load an
    x86-64-v3 artifact as an AVX2 machine would). Code generation never reads it."""
    forced = os.environ.get("KILN_CHECK_CPU_FEATURES")
    have = cpu_features() if forced is None else frozenset(f.strip() for f in forced.split(",") if f.strip())
    return sorted(set(required) - have)
