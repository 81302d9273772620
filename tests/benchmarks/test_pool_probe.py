"""benchmarks/pool_probe.py and benchmarks/pool_control.py run end to end at tiny sizes: a row per
thread count with the pool's counts and each thread's time in chunks, the per-kernel tables, and
the control's chunk times per kind. (Their figures are for the notes, never asserted.)"""

from __future__ import annotations

import re
import shutil

import pytest

from tests.helpers import matmul_corpus_row


def test_pool_probe_reports_each_thread_count_and_kernel(capsys, monkeypatch, tmp_path):
    pytest.importorskip("onnx")
    matmul_corpus_row(tmp_path, 256, [{"batch": 64}])
    monkeypatch.setenv("KILN_CORPUS_DIR", str(tmp_path))
    monkeypatch.setenv("KILN_POOL_TIMES", "1")
    from benchmarks import pool_probe
    pool_probe.main(["mm", "batch=64", "--runs", "3"])
    out = capsys.readouterr().out
    assert re.search(r"1 thr round 0: wall [\d.]+ ms .* minflt \d+", out), out
    assert re.search(r"2 thr round 0: wall [\d.]+ ms .* forks [\d.]+", out), out
    assert re.search(r"in chunks ms \(chunks\): thr0 [\d.]+ \(\d+\).*caller in forks [\d.]+, at joins", out), out
    pool_probe.main(["mm", "batch=64", "--runs", "2", "--kernels", "5"])
    out = capsys.readouterr().out
    assert re.search(r"1 thread CPU [\d.]+ ms, 2 threads CPU in chunks [\d.]+ ms", out) and "node '" in out, out
    pool_probe.main(["mm", "batch=64", "--runs", "2", "--handoff", "5"])
    out = capsys.readouterr().out
    assert re.search(r"all on one [\d.]+ ms, alternating [\d.]+ ms", out) and "node '" in out, out


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_pool_control_times_each_kind_at_one_and_two_threads(capsys):
    from benchmarks import pool_control
    pool_control.main(["--reps", "5", "--threads", "1,2", "--kinds", "fma,l2,remote"])
    lines = capsys.readouterr().out.splitlines()
    one, two = next(x for x in lines if x.startswith("1 thr")), next(x for x in lines if x.startswith("2 thr"))
    assert all(re.search(rf"{k} [\d.]+;", one) for k in ("fma", "l2", "remote")), one
    assert all(re.search(rf"{k} caller [\d.-]+ worker [\d.-]+ \(\d+ of 5\)", two) for k in ("fma", "l2", "remote")), two
