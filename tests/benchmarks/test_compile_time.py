"""benchmarks/compile_time.py end to end on the smallest model: a cold compile in a fresh
process runs the C compiler, the warm ones (same process, then a new one) run none and
skip lowering; the new one does not even read the model file. (Its times are for the README, never asserted.)"""

from __future__ import annotations

import shutil

import pytest


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_compile_time_cold_then_warm(capsys):
    from benchmarks import compile_time
    (row,) = compile_time.main(["--models", "mlp"])
    cold, warm, again = row["cold"], row["warm"], row["warm_new_process"]
    assert cold["compiler_runs"] > 0 and warm["compiler_runs"] == 0 and again["compiler_runs"] == 0
    assert {"optimize", "lower", "generate C", "cc", "load"} <= set(cold["stages"])
    for w in (warm, again):
        assert "cc" not in w["stages"] and "lower" not in w["stages"] and "load" in w["stages"]
    # the new process found the model file by its identity: not read, onnx not imported
    assert "frontend" not in again["stages"] and not again["onnx_imported"]
    assert "mlp" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_kernels_slowest_to_compile_are_listed(capsys):
    from benchmarks import compile_time
    compile_time.main(["--models", "mlp", "--kernels", "2"])
    out = capsys.readouterr().out
    assert "s of CPU at -O3" in out and len([line for line in out.splitlines() if "ms -O3" in line]) == 2
