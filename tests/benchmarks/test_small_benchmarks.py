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
    assert len(rows) == len(fork_cost.SETTINGS) + 1   # and kiln's own pool
    assert any("pool" in r for r in rows)
    assert all(len(re.findall(r"\d+\.\d\d", r)) == 4 for r in rows)


def test_kernel_profile_lists_kernels_beside_ort(capsys, monkeypatch, tmp_path):
    pytest.importorskip("onnxruntime")
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    w = np.random.default_rng(0).standard_normal((8, 8, 1, 1)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8, 6, 6])], [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "tiny.onnx"))
    monkeypatch.setenv("KILN_CORPUS_DIR", str(tmp_path))
    from benchmarks import kernel_profile
    kernel_profile.main(["tiny", "--dims", "batch=2", "--runs", "2"])
    out = capsys.readouterr().out
    assert re.search(r"kiln: \d+ kernels", out) and "Relu" in out and "ONNX Runtime:" in out


def test_thread_scaling_lists_each_kernel_at_one_and_two_threads(capsys, monkeypatch, tmp_path):
    """benchmarks/thread_scaling.py times a corpus model's kernels in a child process per thread
    count and prints one row per kernel call (here a conv and a pool), its speedup and the
    calling thread's CPU share, and the kernels under the --below mark."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    w = np.random.default_rng(0).standard_normal((32, 16, 3, 3)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("MaxPool", ["c"], ["y"], kernel_shape=[2, 2], strides=[2, 2])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16, 20, 20])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 32, 10, 10])],
        [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "tiny.onnx"))
    monkeypatch.setenv("KILN_CORPUS_DIR", str(tmp_path))
    from benchmarks import thread_scaling
    thread_scaling.main(["tiny", "--dims", "batch=2", "--runs", "2", "--rounds", "1", "--below", "1000"])
    out = capsys.readouterr().out
    assert re.search(r"1 thread [\d.]+ ms, 2 threads [\d.]+ ms", out), out
    rows = [line for line in out.splitlines() if "node '" in line]
    assert any("Conv" in r for r in rows) and any("MaxPool" in r for r in rows), out
    assert all(len(re.findall(r"\d+\.\d+", r.split("node")[0])) == 5 and "*" in r for r in rows), out
    assert re.search(rf"{len(rows)} of {len(rows)} kernels under x1000", out), out


def test_decision_ab_lists_kernels_of_two_builds(capsys, monkeypatch, tmp_path):
    """benchmarks/decision_ab.py builds a corpus model with two sets of decisions and prints, per
    matching kernel, the least and median of its runs in each build, and their sums."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    w = np.random.default_rng(0).standard_normal((32, 16, 3, 3)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16, 9, 9])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 32, 9, 9])], [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "tiny.onnx"))
    monkeypatch.setenv("KILN_CORPUS_DIR", str(tmp_path))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    from benchmarks import decision_ab
    decision_ab.main(["tiny", "--b", '{"nchwc.prefetch": 0}', "--kernels", "Conv", "--rounds", "2", "--runs", "2",
                      "--all"])
    out = capsys.readouterr().out
    assert "thread CPU time, one thread" in out and "max abs diff 0" in out, out
    rows = [line for line in out.splitlines() if line.startswith("  least")]
    assert rows and all("Conv" in r for r in rows), out
    assert re.search(rf"{len(rows)} kernels: least summed A [\d.]+ B [\d.]+ ms", out), out


def test_work_split_reads_each_kernels_parallel_loop(monkeypatch):
    """benchmarks/work_split.py finds the loop each kernel forks over (OpenMP's or the pool's)
    and how evenly whole iterations split; a hand-written kernel forks on its own."""
    pytest.importorskip("onnx")
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from benchmarks.work_split import balance, parallel_loops
    from kiln.stages import stage_text
    assert balance(3, 2) == 0.75 and balance(4, 2) == 1.0 and balance(1, 2) == 0.5
    w = np.random.default_rng(0).standard_normal((64, 64, 1, 1)).astype(np.float32)
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 12, 12])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 12, 12])],
                          [numpy_helper.from_array(w, "w")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    for impl in ("omp", "pool"):
        monkeypatch.setenv("KILN_THREADS_IMPL", impl)
        monkeypatch.setenv("KILN_FORK_US", "1")
        loops = parallel_loops(stage_text(model, "c", {}))
        assert loops and all(k.startswith("kiln_k") for k in loops)
        forked = [r for rs in loops.values() for r in rs]
        assert forked and all(re.fullmatch(r"for \d+|own", r) for r in forked), (impl, loops)
        monkeypatch.setenv("KILN_FORK_US", "100000")
        assert not any(parallel_loops(stage_text(model, "c", {})).values())


def test_first_use_reports_each_pairs_median_over_fresh_processes(capsys):
    """benchmarks/generic_shapes.py: a pair's figure is the median of its first uses in the fresh
    processes (one process's burst shows as the max, not as the pair's figure), with its faults."""
    from benchmarks import generic_shapes
    pairs = [(2, 30), (8, 200)]
    # per process, per pair: (batch, seq, plan, first, steady, extra, faults, cpu extra)
    runs = [[(2, 30, 0.3, 5.0, 4.0, 1.0, 0, 0.5), (8, 200, 0.4, 60.0, 50.0, 10.0, 900, 9.0)],
            [(2, 30, 0.3, 5.2, 4.0, 1.2, 0, 0.6), (8, 200, 0.4, 52.0, 50.0, 2.0, 300, 1.5)],
            [(2, 30, 0.3, 24.0, 4.0, 20.0, 0, 0.4), (8, 200, 0.4, 53.0, 50.0, 3.0, 310, 2.0)]]
    generic_shapes.print_first_use(pairs, [{"rows": r, "compiles": 0} for r in runs])
    out = capsys.readouterr().out
    row = {tuple(map(int, line.split()[:2])): line.split() for line in out.splitlines()[1:3]}
    assert row[(2, 30)][5:8] == ["1.20", "20.00", "0"]        # extra median 1.2, max 20, faults 0
    assert row[(8, 200)][5:9] == ["3.00", "10.00", "310", "2.00"]
    assert "median 2.10 ms, max 3.00 ms, pairs over 5 ms: 0; largest single reading 20.00 ms" in out
