"""kiln.codegen.cachedir.stamped: a value derived from files (kiln's source hash, the
compiler's banner) kept by the files' identities; recomputed when a file changes, when
its copy is damaged, and not kept for a file changed just before it was read."""

import pytest

from kiln.codegen import cachedir
from kiln.codegen.cachedir import stamped


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def counting(path):
    calls = []

    def compute():
        calls.append(1)
        return path.read_text()
    return compute, calls


def test_kept_while_the_files_are_unchanged_and_recomputed_after(tmp_path, cache, monkeypatch):
    monkeypatch.setattr(cachedir, "RACY_NS", 0)
    f = tmp_path / "a"
    f.write_text("one")
    compute, calls = counting(f)
    assert stamped("t", [str(f)], compute) == "one" and len(calls) == 1
    assert stamped("t", [str(f)], compute) == "one" and len(calls) == 1      # read back
    f.write_text("three")
    assert stamped("t", [str(f)], compute) == "three" and len(calls) == 2


@pytest.mark.parametrize("damage", [b"", b"two", b"two\n" + b"0" * 64, b"\xff\xfe"])
def test_a_damaged_copy_is_computed_again(tmp_path, cache, monkeypatch, damage):
    monkeypatch.setattr(cachedir, "RACY_NS", 0)
    f = tmp_path / "a"
    f.write_text("one")
    compute, calls = counting(f)
    stamped("t", [str(f)], compute)
    (kept,) = (cache / "stamps").glob("t-*")
    kept.write_bytes(damage)
    assert stamped("t", [str(f)], compute) == "one" and len(calls) == 2
    assert stamped("t", [str(f)], compute) == "one" and len(calls) == 2      # and kept again


def test_a_file_changed_just_before_is_not_kept(tmp_path, cache):
    f = tmp_path / "a"
    f.write_text("one")
    compute, calls = counting(f)
    stamped("t", [str(f)], compute)
    stamped("t", [str(f)], compute)
    assert len(calls) == 2 and not list((cache / "stamps").glob("t-*"))
