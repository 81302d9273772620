"""The kernel code version a tuning record was measured on: a hash of kiln's code-making sources.

A record says "on this machine, decisions D made workload W's kernel this fast". That holds
only for the code kiln built from D when it was measured: when the generators change (a new
micro-kernel, another default tile, a changed C header), an old record may now pick a slower
kernel than the new default (ResNet-18 tuned on an earlier kiln ran x0.95 of untuned). So each
record carries `code_version()`, and kiln.tune.records applies as best only records of this
version; older ones may still seed a search (kiln.tune.tuner), as another machine's do.

What is hashed: every .py/.c/.h file under kiln/ except the parts that cannot change the code
built for a given workload key and decisions (NOT_CODE: the frontends, which run before the
graph the key is taken of; the tuner, the CLI, the interpreter, the test and benchmark tools).
Narrower scopes (per op kind, per package) are not sound here: the lowering imports the
passes (kiln.lower.gemm, conv_algo), the code generator imports the runtime's thread pool
kinds (kiln.codegen.csource), a conv's kernel is the GEMM's schedule, and a C header such as
kiln_pool.h is in every parallel kernel, so a map of which files make which kernel would be
a guess that goes stale silently. Content, not a git commit: an installed kiln has no git.
"""

from __future__ import annotations

import functools
from pathlib import Path

from kiln.codegen.cachedir import source_digest

# top-level entries of kiln/ that do not make kernel code (see the module docstring)
NOT_CODE = frozenset({
    "__init__.py", "__main__.py", "bench.py", "bench_torch.py", "cli.py", "decode", "describe.py", "dynamo.py",
    "export.py", "frontends", "interpreter.py", "onnx_backend.py", "peers", "testing", "timing.py", "tune",
    "tuning.py", "stages.py",
})
ROOT = Path(__file__).resolve().parent.parent


def source_version(root: Path, skip: frozenset = NOT_CODE) -> str:
    """A 16-hex-digit hash of the code files under `root` (paths and contents), less `skip`
    (kiln.codegen.cachedir.source_digest, which the compile cache's key uses whole)."""
    return source_digest(root, skip, name="kiln-code-version")[:16]


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """This kiln's kernel code version (computed once per process)."""
    return source_version(ROOT)


def stale_reason(version: str | None) -> str:
    """Why a record of `version` is not applied here, in words."""
    if version is None:
        return "recorded before records carried a kernel code version"
    return f"measured on other kernel code (version {version}, this kiln's is {code_version()})"
