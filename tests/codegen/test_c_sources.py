"""Hand-written C lives in kiln/codegen/c_src as C files (kiln.codegen.csource): every file
the code names exists, every file there is used, and the wheel ships them all."""

import ast
import fnmatch
import tomllib
from pathlib import Path

import pytest

from kiln.codegen.csource import C_SRC, c_instance, c_source
from kiln.errors import KilnError

ROOT = Path(__file__).resolve().parents[2]


def _referenced() -> dict[str, list[str]]:
    """c_source("name") / c_instance("name", ...) / c_shared("name", ...) calls in kiln/: name -> where."""
    out: dict[str, list[str]] = {}
    for path in sorted((ROOT / "kiln").rglob("*.py")):
        if path.name == "csource.py":
            continue  # the readers themselves
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("c_source", "c_instance", "c_shared")):
                arg = node.args[0] if node.args else None
                assert isinstance(arg, ast.Constant) and isinstance(arg.value, str), \
                    f"{path}:{node.lineno}: {node.func.id} takes a literal file name (so this test can check it)"
                out.setdefault(arg.value, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return out


def test_every_referenced_c_file_exists():
    refs = _referenced()
    assert len(refs) >= 5
    missing = {name: where for name, where in refs.items() if not (C_SRC / name).is_file()}
    assert not missing


def test_every_c_file_is_used():
    files = {p.name for p in C_SRC.iterdir() if p.suffix in (".c", ".h")}
    assert files, C_SRC
    assert files - set(_referenced()) == set()


def test_c_files_are_package_data():
    """An installed wheel has them: each matches a package-data glob of the kiln package."""
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = conf["tool"]["setuptools"]["package-data"]["kiln"]
    for p in C_SRC.iterdir():
        rel = p.relative_to(ROOT / "kiln").as_posix()
        assert any(fnmatch.fnmatch(rel, g) for g in globs), f"{rel} is not in package-data {globs}"


def test_c_source_reads_the_file_and_a_missing_one_is_a_kiln_error():
    assert c_source("kiln_strings.h") == (C_SRC / "kiln_strings.h").read_text()
    with pytest.raises(KilnError, match="missing"):
        c_source("no_such_kernel.c")


def test_c_instance_defines_the_macros_around_the_file_behind_a_guard():
    text = c_instance("topk.c", {"KILN_TOPK_T": "float", "KILN_TOPK_FN": "kiln_topk_float32"}, "KILN_TOPK_F32")
    head, body, tail = text.partition(c_source("topk.c"))
    assert body and head == ("#ifndef KILN_TOPK_F32\n#define KILN_TOPK_F32\n#define KILN_TOPK_T float\n"
                             "#define KILN_TOPK_FN kiln_topk_float32\n")
    assert tail == "#undef KILN_TOPK_T\n#undef KILN_TOPK_FN\n#endif\n"
