"""kiln.compile runs the passes (opt_level) and reports them (report=True); the ONNX backend
takes its level from KILN_OPT_LEVEL."""

import numpy as np
import pytest

import kiln
from kiln import onnx_backend
from kiln.passes import passes_for
from tests.passes.util import graph, prog

F = np.float32
TEXT = prog("(%x: float32[2,3]) -> (%y)",
            '  %a: float32[2,3] = Identity(%x) name "id"\n'
            '  %y: float32[2,3] = Mul(%a, %one) name "mul"')


def test_compile_runs_the_passes_and_attaches_a_report():
    g = graph(TEXT, one=F(1))
    m = kiln.compile(g, target="interpreter", opt_level=3, report=True)
    assert [s.name for s in m.report.passes] == passes_for(3)
    # Identity goes; x*1 stays, since an input cannot become the output %y
    assert [n.op for n in m.graph.nodes] == ["Mul"]
    x = np.arange(6, dtype=F).reshape(2, 3)
    np.testing.assert_array_equal(m.run(x=x)["y"], x)
    assert "eliminate_nops" in str(m.report) and m.report.kernels is None
    assert len(g.nodes) == 2  # the caller's graph is not touched


def test_opt_level_zero_and_no_report():
    m = kiln.compile(graph(TEXT, one=F(1)), target="interpreter", opt_level=0)
    assert [n.op for n in m.graph.nodes] == ["Identity", "Mul"] and not hasattr(m, "report")
    with pytest.raises(kiln.KilnError, match="optimization level 9"):
        kiln.compile(graph(TEXT, one=F(1)), target="interpreter", opt_level=9)


@pytest.mark.parametrize("env, level", [(None, None), ("0", 0), ("3", 3)])
def test_onnx_backend_reads_kiln_opt_level(monkeypatch, env, level):
    if env is None:
        monkeypatch.delenv("KILN_OPT_LEVEL", raising=False)
    else:
        monkeypatch.setenv("KILN_OPT_LEVEL", env)
    assert onnx_backend.opt_level_options() == ({} if level is None else {"opt_level": level})


def test_bad_kiln_opt_level_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("KILN_OPT_LEVEL", "fast")
    with pytest.raises(kiln.KilnError, match="KILN_OPT_LEVEL.*'fast'"):
        onnx_backend.opt_level_options()
