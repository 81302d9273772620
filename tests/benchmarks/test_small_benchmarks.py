"""benchmarks/linear.py and benchmarks/fork_cost.py run end to end at tiny sizes: kiln agrees
with ONNX Runtime on every engine they time, and the fork loop reports four percentiles per
setting. (Their figures are for the README, never asserted.)"""

from __future__ import annotations

import re
import shutil

import pytest


def test_linear_runs_and_agrees(capsys, monkeypatch):
    pytest.importorskip("onnxruntime")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")   # restored afterwards (linear.main sets it)
    from benchmarks import linear
    linear.main(["--runs", "10", "--also", "gemm.mr=4", "13x40x70", "5x16x24x3"])
    out = capsys.readouterr().out
    assert "MISMATCH" not in out
    assert len(re.findall(r"kiln\[gemm.mr=4\]", out)) == 2 and out.count("kiln/ort") == 2


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_fork_cost_reports_each_setting(capsys):
    from benchmarks import fork_cost
    fork_cost.main(["--regions", "50", "--gaps", "0"])
    rows = [line for line in capsys.readouterr().out.splitlines() if "gap" in line]
    assert len(rows) == len(fork_cost.SETTINGS)
    assert all(len(re.findall(r"\d+\.\d\d", r)) == 4 for r in rows)
