"""`kiln` subcommands run in this process through `kiln.cli.main` (fast): stages, options, reports."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from kiln.cli import main
from tests.runtime.models import elementwise_model


def kiln(capsys, *args) -> tuple[int, str, str]:
    try:
        main([str(a) for a in args])
        rc = 0
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "model.onnx"
    onnx.save(elementwise_model(), path)
    return path


def unsupported_model(path) -> None:
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="ok"),
             helper.make_node("FancyOp", ["a"], ["b"], name="fancy_1"),
             helper.make_node("Frobnicate", ["b"], ["y"], name="frob", domain="com.example")]
    io = lambda n: helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [2])  # noqa: E731
    g = helper.make_graph(nodes, "unsupported", [io("x")], [io("y")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    m.ir_version = 8
    onnx.save(m, path)


@pytest.mark.parametrize("stage, marks", [
    ("graph", ['graph "elementwise"', "Mul(%x, %w)", "const %w"]),
    ("optimized", ["Relu("]),
    ("loops", ["func main(", "for ("]),
    ("c", ["int32_t kiln_main(", "#include"]),
])
def test_emit_stages(capsys, model_path, stage, marks):
    rc, out, err = kiln(capsys, "compile", model_path, "--emit", stage, "--dim", "batch=2")
    assert rc == 0, err
    for m in marks:
        assert m in out, (m, out[:2000])


def test_emit_to_file_keeps_weights(capsys, model_path, tmp_path):
    rc, _, err = kiln(capsys, "compile", model_path, "--emit", "graph", "--emit-to", tmp_path / "g.txt")
    assert rc == 0, err
    from kiln.graph import parse_graph
    text = (tmp_path / "g.txt").read_text()
    assert "bytes>" not in text and parse_graph(text).name == "elementwise"


def test_printed_stage_elides_weight_data(capsys):
    from kiln.cli import show
    show('const %w: float32[64] = tensor<float32[64]>("' + "A" * 342 + '==")\n', None)
    assert capsys.readouterr().out == 'const %w: float32[64] = tensor<float32[64]>("<256 bytes>")\n'


def test_native_stages_need_the_cpu_target(capsys, model_path):
    rc, _, err = kiln(capsys, "compile", model_path, "--emit", "c", "-t", "interpreter", "--dim", "batch=1")
    assert rc == 1 and "use --target cpu" in err


def test_run_onnx_with_random_inputs(capsys, model_path, tmp_path):
    rc, out, err = kiln(capsys, "run", model_path, "--random", "--dim", "batch=3", "-t", "interpreter",
                        "-d", tmp_path)
    assert rc == 0, err
    assert "target interpreter" in out and "[3, 4]" in out
    assert np.load(tmp_path / "y.npy").shape == (3, 4)


def test_inspect_lists_every_unsupported_node(capsys, tmp_path):
    unsupported_model(tmp_path / "u.onnx")
    rc, out, err = kiln(capsys, "inspect", tmp_path / "u.onnx")
    assert rc == 0, err
    assert "unsupported: 2 node(s)" in out
    for word in ("fancy_1", "FancyOp", "com.example::Frobnicate", "frob"):
        assert word in out


def test_inspect_artifact(capsys, model_path, tmp_path):
    art = tmp_path / "m.kiln"
    assert kiln(capsys, "compile", model_path, "-o", art, "--dim", "batch=1", "--name", "tiny")[0] == 0
    rc, out, err = kiln(capsys, "inspect", art)
    assert rc == 0, err
    assert "kiln artifact" in out and "tiny_main" in out and "[1, 4]" in out


def test_opt_level_reaches_the_compiler_and_its_report(capsys, model_path):
    rc, out, err = kiln(capsys, "inspect", model_path, "--dim", "batch=2", "-O1")
    assert rc == 0, err
    assert "kiln compile report (-O1)" in out and "kernels" in out


def test_unbound_dim_names_the_flag(capsys, model_path, tmp_path):
    rc, _, err = kiln(capsys, "compile", model_path, "-o", tmp_path / "x.kiln")
    assert rc == 1 and "--dim batch=N" in err and not (tmp_path / "x.kiln").exists()


@pytest.mark.parametrize("args, message", [
    (["run", "m.onnx", "--dim", "batch"], "expected NAME=VALUE"),
    (["run", "m.onnx", "--dim", "batch=0", "--random"], "positive integer"),
    (["compile", "m.onnx", "--emit-to", "f"], "--emit-to needs --emit"),
    (["compile", "m.onnx", "-O7"], "-O"),
    (["bench", "m.onnx", "--against", "tvm"], "unknown peer"),
    (["compile", "m.onnx", "--dim", "batch=1", "--dim", "batch=8"], "'batch' given twice (1 and 8)"),
])
def test_usage_errors(capsys, args, message):
    rc, _, err = kiln(capsys, *args)
    assert rc in (1, 2) and message in err and "Traceback" not in err


def test_fuzz_small_campaign(capsys, tmp_path):
    rc, out, err = kiln(capsys, "fuzz", "--count", 4, "--levels-per-graph", 1, "--no-ort",
                        "--out", tmp_path / "regs", "-j", 1)
    assert rc == 0, err
    assert "4 graphs" in out and "0 failed" in out
