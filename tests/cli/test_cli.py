"""The `kiln` command through its real entry point (`python -m kiln.cli`, as the console script).

One subprocess per subcommand, and the bad-input cases run concurrently (starting
Python is the slow part); finer cases run in-process in test_cli_inprocess.py.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import pytest

import kiln
from tests.runtime.models import elementwise_model, inputs, reference

ROOT = __file__.rsplit("/tests/", 1)[0]
ENV = {**os.environ, "PYTHONPATH": ROOT, "COLUMNS": "200"}


def kiln_cmd(*args, cwd) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "kiln.cli", *map(str, args)], cwd=cwd, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def kiln_run(*args, cwd):
    p = kiln_cmd(*args, cwd=cwd)
    stdout, stderr = p.communicate(timeout=300)
    return p.returncode, stdout, stderr


def staged_models() -> dict[str, onnx.ModelProto]:
    """Models the cpu target runs in stages (an output size known only from the data; an If)."""
    from onnx import TensorProto as T
    from onnx import helper
    x = helper.make_tensor_value_info("x", T.FLOAT, [2, 3])
    nonzero = helper.make_graph([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                                 helper.make_node("NonZero", ["r"], ["y"], name="positive")],
                                "nonzero", [x], [helper.make_tensor_value_info("y", T.INT64, [2, None])])
    branch = lambda op, out: helper.make_graph(  # noqa: E731
        [helper.make_node(op, ["x"], [out])], op, [], [helper.make_tensor_value_info(out, T.FLOAT, [2, 3])])
    cond = helper.make_graph([helper.make_node("If", ["c"], ["y"], name="choose", then_branch=branch("Relu", "t"),
                                               else_branch=branch("Neg", "e"))],
                             "cond", [x, helper.make_tensor_value_info("c", T.BOOL, [])],
                             [helper.make_tensor_value_info("y", T.FLOAT, [2, 3])])
    out = {}
    for g in (nonzero, cond):
        out[g.name] = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        out[g.name].ir_version = 8
    return out


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A folder with the model, inputs and bad files, and model.kiln made by `kiln compile`."""
    d = tmp_path_factory.mktemp("cli")
    onnx.save(elementwise_model(), d / "model.onnx")
    (d / "notonnx.onnx").write_text("this is not a model\n")
    feeds = inputs(batch=2, seed=5)
    for k, v in feeds.items():
        np.save(d / f"{k}.npy", v)
    np.save(d / "wrong.npy", np.zeros((3, 4), np.float32))
    for name, m in staged_models().items():
        onnx.save(m, d / f"{name}.onnx")
    rc, out, err = kiln_run("compile", "model.onnx", "-o", "model.kiln", "--dim", "batch=2",
                            "--emit", "c", "--emit-to", "model.c", cwd=d)
    assert rc == 0, err
    return d, feeds, out


def test_compile_writes_artifact_and_c(work):
    d, feeds, out = work
    assert "wrote model.kiln" in out
    assert "int32_t kiln_main(" in (d / "model.c").read_text()  # the JIT module's source
    assert "C entry model_main" in out
    got = kiln.load(d / "model.kiln").run(feeds)
    np.testing.assert_allclose(got["y"], reference(**feeds)["y"], rtol=1e-5, atol=1e-6)


def test_run_artifact_saves_outputs(work):
    d, feeds, _ = work
    rc, out, err = kiln_run("run", "model.kiln", "-i", "x=x.npy", "--input", "s=s.npy", "-d", "outs", cwd=d)
    assert rc == 0, err
    assert "y" in out and "z" in out and "[2, 4]" in out
    for name, want in reference(**feeds).items():
        np.testing.assert_allclose(np.load(d / "outs" / f"{name}.npy"), want, rtol=1e-5, atol=1e-6)


def test_inspect_model(work):
    d, _, _ = work
    rc, out, err = kiln_run("inspect", "model.onnx", "--dim", "batch=2", cwd=d)
    assert rc == 0, err
    for word in ("ai.onnx 17", "Mul", "Relu", "parameters", "8 (32 B)", "batch", "kernels", "workspace arena"):
        assert word in out, word


def test_bench_against_ort(work):
    d, _, _ = work
    rc, out, err = kiln_run("bench", "model.onnx", "--dim", "batch=2", "--runs", "3", "--threads", "1",
                            "--against", "ort", "--profile", "5", cwd=d)
    assert rc == 0, err
    for word in ("median ms", "p10", "p90", "kiln", "ort", "cold", "warm", "agree"):
        assert word in out, word
    # the per-kernel table: every kernel call, with the nodes it computes
    assert "kernels: " in out and "called one by one" in out and "node '" in out, out
    # compile time per stage, cold and warm: the C compiler ran cold only
    assert "compile time per stage" in out, out
    cc = next([c.strip() for c in line.split("│")] for line in out.splitlines() if line.split()[:1] == ["cc"])
    assert float(cc[1]) > 0 and cc[3:5] == ["-", "-"], cc


def test_bench_against_torch(work):
    pytest.importorskip("torch")
    d, _, _ = work
    rc, out, err = kiln_run("bench", "model.onnx", "--dim", "batch=2", "--runs", "3", "--threads", "1",
                            "--against", "ort,torch", cwd=d)
    assert rc == 0, err
    assert "skipped" not in err, err
    for word in ("kiln/ort =", "kiln/torch =", "kiln vs ort:", "kiln vs torch:"):
        assert word in out, word
    assert out.count("-> agree") == 2, out


BAD = {
    "missing file": (["run", "missing.onnx"], "model file not found: missing.onnx"),
    "not onnx": (["compile", "notonnx.onnx"], "not a valid ONNX model"),
    "unknown input": (["run", "model.kiln", "-i", "w=x.npy"], "unknown input name(s) ['w']"),
    "wrong npy shape": (["run", "model.kiln", "-i", "x=wrong.npy", "-i", "s=s.npy"],
                        "input 'x': expected shape (2, 4)"),
    "missing npy": (["run", "model.kiln", "-i", "x=nope.npy", "-i", "s=s.npy"], "file not found: nope.npy"),
}


# errors found after importing (and compiling): progress lines come first on stderr
LATE = {
    "data-dependent size": (["compile", "nonzero.onnx", "-o", "nz.kiln"],
                            "NonZero node 'positive' makes an output whose size depends on input values"),
    "control flow": (["compile", "cond.onnx", "-o", "cond.kiln"],
                     "If node 'choose' is control flow or a sequence op"),
    "symbolic dim": (["compile", "model.onnx", "-o", "free.kiln"], "symbolic dim(s) ['batch']: give their size (--dim batch=N)"),
    "bad name": (["compile", "model.onnx", "--dim", "batch=1", "--name", "my-net"],
                 "artifact name 'my-net' must be a C identifier"),
}


@pytest.fixture(scope="module")
def bad_results(work):
    d = work[0]
    procs = {k: kiln_cmd(*args, cwd=d) for k, (args, _) in {**BAD, **LATE}.items()}
    procs["debug"] = kiln_cmd("--debug", "run", "missing.onnx", cwd=d)
    return {k: (p.wait(timeout=300), p.stdout.read(), p.stderr.read()) for k, p in procs.items()}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_error(bad_results, case):
    rc, out, err = bad_results[case]
    assert rc == 1
    assert err.count("\n") == 1 and err.startswith("error: ") and BAD[case][1] in err, err


@pytest.mark.parametrize("case", list(LATE))
def test_late_error_is_one_line_after_progress(bad_results, case, work):
    rc, out, err = bad_results[case]
    lines = err.splitlines()
    assert rc == 1 and "Traceback" not in err
    assert lines[-1].startswith("error: ") and LATE[case][1] in lines[-1], err
    assert not any(line.startswith("error") for line in lines[:-1]), err
    assert not list(work[0].glob("*.kiln.*tmp")) and not (work[0] / "nz.kiln").exists()


def test_debug_shows_the_traceback(bad_results):
    rc, _, err = bad_results["debug"]
    assert rc != 0 and "Traceback" in err and "KilnError" in err
