"""Only the Target module asks the host what it is (issue 12): everything below
`kiln.compile()` reads the `Target` it is handed. This test reads kiln/'s source (AST,
docstrings and comments left out) and fails on a host query anywhere else."""

from __future__ import annotations

import ast
from pathlib import Path

KILN = Path(__file__).resolve().parents[2] / "kiln"

# attribute calls that ask the machine: os.cpu_count(), os.sysconf(...), platform.machine()...
HOST_CALLS = {("os", "cpu_count"), ("os", "sysconf"), ("os", "sched_getaffinity"),
              ("platform", "machine"), ("platform", "processor"), ("multiprocessing", "cpu_count")}
# names whose use means "the host's": the detected feature set, and vector widths from it
HOST_NAMES = {"cpu_features", "cpu_count", "sched_getaffinity"}
# text that reads or names the host: its CPU description, the compiler's "this machine",
# the OpenMP wait policy the code will run under
HOST_TEXT = ("/proc/cpuinfo", "/sys/devices/system/cpu", "-march=native", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")

ALLOWED = {
    "targets/target.py": "the Target module: Target.host(), host_cores(), host_caches()",
    "runtime/cpu.py": "the loader's check that a library's features exist on the CPU running it",
    "runtime/threads.py": "kiln's default OpenMP wait policy, set for the process that runs the code, "
                          "and the settings in force (which Target.host() records)",
    "runtime/artifact.py": "the loader: its error tells how to rebuild without -march=native",
    "limits.py": "run-time memory caps from the physical RAM of the machine that runs the model",
}


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def host_queries(source: str) -> list[str]:
    """What in `source` asks the host, as 'line: what'."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and (node.value.id, node.attr) in HOST_CALLS:
            found.append(f"{node.lineno}: {node.value.id}.{node.attr}")
        elif isinstance(node, ast.Name) and node.id in HOST_NAMES:
            found.append(f"{node.lineno}: {node.id}")
        elif isinstance(node, ast.alias) and node.name.split(".")[-1] in HOST_NAMES:
            found.append(f"{getattr(node, 'lineno', '?')}: import {node.name}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            found += [f"{node.lineno}: {t!r}" for t in HOST_TEXT if t in node.value]
    return found


def test_only_the_target_module_queries_the_host():
    offenders = {}
    for path in sorted(KILN.rglob("*.py")):
        rel = path.relative_to(KILN).as_posix()
        if rel in ALLOWED:
            continue
        hits = host_queries(path.read_text())
        if hits:
            offenders[rel] = hits
    assert not offenders, ("these modules ask the host directly; take what they need from the "
                           f"kiln.targets.Target passed down instead: {offenders}")


def test_the_check_catches_each_kind_of_query():
    src = ('"""Docstrings may say /proc/cpuinfo and -march=native."""\n'
           "import os, platform\n"
           "from kiln.runtime.cpu import cpu_features\n"
           "n = os.cpu_count()\n"
           "m = platform.machine()\n"
           "flags = '-O3 -march=native'\n"
           "p = os.environ.get('OMP_WAIT_POLICY')\n")
    got = host_queries(src)
    assert sorted(int(g.split(":")[0]) for g in got) == [3, 4, 5, 6, 7], got
