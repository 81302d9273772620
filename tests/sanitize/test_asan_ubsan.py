"""The suite's native code under AddressSanitizer + UndefinedBehaviorSanitizer (a slow job).

Every module is built with `-fsanitize=address,undefined -fno-sanitize-recover=all`
(KILN_SANITIZE, see kiln.codegen.build.sanitizer_flags) and run in a subprocess that has
the sanitizer runtime preloaded (a Python process loading an ASan library needs libasan
first: LD_PRELOAD). The first report aborts that process, so a failure here names the
kernel, the source line and the access. What it cannot see: accesses that stay inside
one of kiln's own allocations (the workspace arena, the weights blob) but leave the
buffer the kernel meant (the loop-IR checks and the bounds tests cover those).

    python -m pytest -m slow tests/sanitize                    # all of it: hours (see below)
    KILN_SANITIZE_SELECT="gather or scatter" python -m pytest -m slow tests/sanitize -k conformance

Measured on a shared 2-core machine (load 12-18), 2026-11-25: the 203 cpu conformance cases
of the ops with hand-written kernels or data-driven indexing took 34 min (about 10 s a case,
mostly compiling with the sanitizers), so all 2,034 take several hours there; the fuzzer's
150-model budget 75 s; tests/runtime/test_memory_safety.py 51 s. None gave a report.
KILN_SANITIZE=address,undefined,float-cast-overflow (not part of "undefined" in GCC) found
GridSample and DeformConv casting NaN coordinates to indices (now clamped first).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SANITIZERS = "address,undefined"


def _runtime() -> str | None:
    """The ASan runtime the C compiler links against, or None when it has none."""
    cc = os.environ.get("KILN_CC", "cc").split()
    try:
        r = subprocess.run([*cc, "-print-file-name=libasan.so"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    path = r.stdout.strip()
    return path if os.path.isabs(path) and os.path.exists(path) else None


def sanitized_env(tmp_path) -> dict:
    lib = _runtime()
    if lib is None:
        pytest.skip("the C compiler has no AddressSanitizer runtime (libasan)")
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700, exist_ok=True)
    return {**os.environ, "KILN_SANITIZE": SANITIZERS, "LD_PRELOAD": lib, "KILN_CACHE_DIR": str(cache),
            "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p),
            # Python itself leaks by design; a huge request must return NULL (kiln fails cleanly)
            "ASAN_OPTIONS": "detect_leaks=0:allocator_may_return_null=1:abort_on_error=1",
            "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}


def run_sanitized(argv: list, tmp_path, timeout: int, **extra) -> subprocess.CompletedProcess:
    env = {**sanitized_env(tmp_path), **extra}
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=timeout)
    print(f"{' '.join(argv)}: {time.perf_counter() - t0:.0f} s, exit {r.returncode}")
    return r


def report(r: subprocess.CompletedProcess) -> str:
    """The sanitizer's report (or the tail of the output) for an assertion message."""
    text = r.stdout + r.stderr
    at = max(text.find("ERROR: AddressSanitizer"), text.find("runtime error:"))
    return text[at - 200:at + 4000] if at >= 0 else text[-4000:]


_OOB = """
import numpy as np
from kiln.codegen import build_c
from kiln.dtypes import DType
from kiln.loops import Buffer
from kiln.loops.stmt import ExternFunc
f = ExternFunc("oob", (Buffer("in0", DType.float32, (4,)), Buffer("out0", DType.float32, (4,))),
               "  for (int i = 0; i < 4; ++i) out0[i] = in0[i + 64];\\n  return 0;")
build_c(f)["oob"](np.ones(4, np.float32), np.empty(4, np.float32))
"""


def test_the_harness_catches_an_out_of_bounds_read(tmp_path):
    r = run_sanitized(["-c", _OOB], tmp_path, timeout=600)
    assert r.returncode != 0 and "AddressSanitizer: heap-buffer-overflow" in r.stderr, report(r)
    assert "in kiln_oob" in r.stderr


def test_memory_safety_tests_under_sanitizers(tmp_path):
    r = run_sanitized(["-m", "pytest", "-q", "-x", "tests/runtime/test_memory_safety.py"], tmp_path, timeout=3600)
    assert r.returncode == 0, report(r)


def test_conformance_cpu_under_sanitizers(tmp_path):
    """The ONNX backend suite on target cpu (every case compiles a native module)."""
    select = os.environ.get("KILN_SANITIZE_SELECT")
    argv = ["-m", "pytest", "-q", "-x", "tests/conformance/test_onnx_backend.py", "-p", "no:cacheprovider"]
    r = run_sanitized(argv + (["-k", select] if select else []), tmp_path, timeout=6 * 3600, KILN_TARGET="cpu")
    assert r.returncode == 0, report(r)


def test_fuzzer_budget_under_sanitizers(tmp_path):
    """The fuzzer's fixed budget (mutated models, native code on hostile inputs); no address-space
    limit in its sandboxes (ASan reserves terabytes of it), the time limit stays."""
    out = tmp_path / "fuzz"
    r = run_sanitized(["-m", "kiln", "fuzz-mutate", "--models", "150", "--artifacts", "0", "--seed", "0",
                       "--memory", "64T", "--jobs", "2", "--out", str(out)], tmp_path, timeout=6 * 3600)
    assert r.returncode == 0, report(r)
