"""benchmarks/pool_contention.py (kiln's latency and pool counts by what ran before it in the
process) end to end on a small model, and kiln.bench.thread_cpu_ns, which it reads."""

from __future__ import annotations

import threading
import time

import pytest

from kiln.bench import thread_cpu_ns
from tests.helpers import matmul_corpus_row


def test_thread_cpu_ns_counts_this_thread():
    me = threading.get_native_id()
    before = thread_cpu_ns()[me]
    end = time.perf_counter() + 0.02
    while time.perf_counter() < end:
        pass
    assert thread_cpu_ns()[me] > before


def test_pool_contention_script_runs_a_row(tmp_path, monkeypatch, capsys):
    pytest.importorskip("onnxruntime")
    matmul_corpus_row(tmp_path, 64, [{"batch": 256}])
    monkeypatch.setenv("KILN_CORPUS_DIR", str(tmp_path))
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))   # (kiln2 copies the build cache)
    from benchmarks import pool_contention
    pool_contention.main(["mm", "batch=256", "--rounds", "2", "--runs", "2", "--scenarios", "idle,ort+50,kiln2+0"])
    lines = capsys.readouterr().out.splitlines()
    assert "mm [batch=256], kiln timed" in lines[0]
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert set(rows) == {"idle", "ort+50", "kiln2+0"}
    for row in rows.values():
        assert float(row[1]) > 0 and 0.0 <= float(row[3]) <= 1.0 and len(row[4].split("/")) == 4
