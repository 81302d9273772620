"""The house's shape, checked from the source: which room may import which, no import cycles,
small files (issue 12).

Every module under kiln/ is parsed (ast) for its imports, those inside functions included: a
lazy import is still an arrow between rooms. A room is a top-level package or module of kiln
(kiln.ops, kiln.lower, kiln.errors, ...), or a module listed in OWN_ROOM. `from a.b import c`
is an arrow to a.b.c when that is a module, else to a.b; importing a submodule is not counted
as an arrow to its parent package.

There are no exemptions: a forbidden arrow or a cycle, lazy or not, fails. (An IR prints
through a printer registered by the printer module, which imports the IR, not the other way
round; a frontend hands the pipeline a Graph and never calls kiln.compile back.) No module is
over MAX_LINES lines.
"""

from __future__ import annotations

import ast
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
KILN = ROOT / "kiln"

# What an operator *is* (kiln.ops) and the graph IR (kiln.graph) know nothing of how ops
# become loops, code, passes, targets or the pipeline.
LOW_ROOMS = ("kiln.ops", "kiln.graph")
HIGH_ROOMS = ("kiln.lower", "kiln.codegen", "kiln.passes", "kiln.targets", "kiln.compiler")

MAX_LINES = 800


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(KILN.rglob("*.py"))}


def _named(name: str, path: Path, node) -> set[str]:
    """The modules one import statement of module `name` (file `path`) names."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names}
    if node.level:  # relative: from the package (a package's own __init__ is its package)
        base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        mod = ".".join(base + ([node.module] if node.module else []))
    else:
        mod = node.module or ""
    return {f"{mod}.{a.name}" if f"{mod}.{a.name}" in MODULES else mod for a in node.names}


def _statements(path: Path):
    return [n for n in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(n, (ast.Import, ast.ImportFrom))]


def _imports(name: str, path: Path) -> set[str]:
    """The kiln modules `name` imports, anywhere in its body."""
    out = set().union(*(_named(name, path, n) for n in _statements(path)))
    return {m for m in out if m in MODULES and m != name}


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}
EDGES = {(a, b) for a, deps in GRAPH.items() for b in deps}


# modules that are a room of their own though their package is another: a value every
# stage is handed, sitting below all of them
OWN_ROOM = {
    "kiln.targets.target": "the Target value object (its package also holds the cpu target's driver)",
}


def room(module: str) -> str:
    return module if module in OWN_ROOM else ".".join(module.split(".")[:2])


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one member (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _module_graph(edges) -> dict[str, set[str]]:
    g: dict[str, set[str]] = {m: set() for m in MODULES}
    for a, b in edges:
        g[a].add(b)
    return g


def _room_graph(edges) -> dict[str, set[str]]:
    g: dict[str, set[str]] = {}
    for a, b in edges:
        if room(a) != room(b):
            g.setdefault(room(a), set()).add(room(b))
    return g


def _forbidden(edge) -> bool:
    a, b = edge
    return room(a) in LOW_ROOMS and room(b) in HIGH_ROOMS


def _where(a: str, b: str) -> str:
    """file:line where module a imports b, for failure messages."""
    path = MODULES[a]
    line = next((n.lineno for n in _statements(path) if b in _named(a, path, n)), "?")
    return f"{path.relative_to(ROOT)}:{line}"


def test_the_parser_sees_the_house():
    assert len(MODULES) > 100
    assert ("kiln.lower.context", "kiln.ops.registry") in EDGES
    assert "kiln.lower.conv" in GRAPH["kiln.lower"]       # a package importing its submodules


def test_ops_and_graph_import_nothing_of_lower_codegen_passes_targets_compiler():
    bad = sorted(e for e in EDGES if _forbidden(e))
    assert not bad, "forbidden imports:\n" + "\n".join(f"  {_where(a, b)}: {a} imports {b}" for a, b in bad)


def test_no_import_cycle_between_modules():
    cycles = _cycles(_module_graph(EDGES))
    assert not cycles, "import cycles:\n" + "\n".join("  " + " <-> ".join(c) for c in cycles)


def test_no_import_cycle_between_rooms():
    graph = _room_graph(EDGES)
    cycles = _cycles(graph)
    detail = []
    for c in cycles:
        members = set(c)
        detail += [f"  {room(a)} -> {room(b)}: {_where(a, b)}" for a, b in sorted(EDGES)
                   if room(a) in members and room(b) in members and room(a) != room(b)]
    assert not cycles, "room cycles " + str(cycles) + ":\n" + "\n".join(detail)


def test_files_stay_small():
    long = {}
    for path in KILN.rglob("*.py"):
        n = len(path.read_text().splitlines())
        if n > MAX_LINES:
            long[path.relative_to(ROOT).as_posix()] = n
    assert not long, f"modules over {MAX_LINES} lines (split them by job): {long}"


def test_a_forbidden_import_is_caught():
    """The checker itself: an ops module importing kiln.lower, even lazily, is found."""
    src = "def f():\n    from kiln.lower.kernel import extern_func\n    return extern_func\n"
    names = set().union(*(_named("kiln.ops.example", KILN / "ops" / "example.py", n)
                          for n in ast.walk(ast.parse(src)) if isinstance(n, (ast.Import, ast.ImportFrom))))
    assert [e for e in {("kiln.ops.example", m) for m in names} if _forbidden(e)] == \
        [("kiln.ops.example", "kiln.lower.kernel")]
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
