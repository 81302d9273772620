"""The pipeline: passes per -O level, PassStats, dumps after each pass, errors naming the pass."""

import os

import numpy as np
import pytest

from kiln.errors import KilnError
from kiln.graph import parse_graph, print_graph
from kiln.passes import PASSES, graph_pass, passes_for, run_passes
from tests.passes.util import assert_equivalent, graph, prog

F = np.float32
SIG = "(%x: float32[2,3]) -> (%y)"
TEXT = prog(SIG, '  %a: float32[2,3] = Identity(%x) name "id"\n'
                 '  %dead: float32[2,3] = Exp(%x) name "dead"\n'
                 '  %b: float32[2,3] = Div(%a, %four) name "div"\n'
                 '  %y: float32[2,3] = Relu(%b) name "relu"')


def test_levels_list_named_passes_in_order():
    assert passes_for(0) == []
    assert passes_for(1) == ["eliminate_nops", "fold_constants", "eliminate_dead_code"]
    two, three = passes_for(2), passes_for(3)
    assert set(passes_for(1)) < set(two) < set(three)
    assert {"recognize_layernorm", "recognize_rmsnorm", "recognize_gelu", "recognize_rotary", "recognize_swiglu",
            "fuse_attention", "transform_layout", "fuse_inverted_residual", "decompose_recurrent",
            "pack_weights", "merge_gemms"} == set(three) - set(two)
    assert three.index("merge_gemms") > three.index("pack_weights")   # it merges packed GEMMs
    assert all(name in PASSES for name in three)
    with pytest.raises(KilnError, match="optimization level 7"):
        passes_for(7)


def test_run_passes_reports_each_pass_and_keeps_the_input():
    g = graph(TEXT, four=F(4))
    before = print_graph(g)
    out, stats = run_passes(g, 2, verify=True)
    assert print_graph(g) == before
    assert [s.name for s in stats] == passes_for(2)
    by_name = {s.name: s for s in stats if s.changed}
    assert by_name["eliminate_nops"].removed == 1
    assert by_name["simplify_algebra"].fired == {"x/c": 1}
    assert by_name["eliminate_dead_code"].removed == 1
    assert [n.op for n in out.nodes] == ["Mul", "Relu"]
    assert_equivalent(g, out)


def test_level_zero_returns_the_graph_untouched():
    g = graph(TEXT, four=F(4))
    out, stats = run_passes(g, 0)
    assert out is g and stats == []


def test_dump_dir_gets_the_ir_after_every_pass(tmp_path, monkeypatch):
    g = graph(TEXT, four=F(4))
    run_passes(g, 1, dump_dir=str(tmp_path))
    names = sorted(os.listdir(tmp_path))
    assert names == ["00_input.txt", "01_eliminate_nops.txt", "02_fold_constants.txt",
                     "03_eliminate_dead_code.txt"]
    last = parse_graph((tmp_path / names[-1]).read_text())
    assert [n.name for n in last.nodes] == ["div", "relu"]
    env_dir = tmp_path / "env"
    monkeypatch.setenv("KILN_DUMP_IR", str(env_dir))
    run_passes(g, 1)
    assert len(os.listdir(env_dir)) == 4


@pytest.fixture
def broken_pass():
    @graph_pass("test_reverse_nodes")
    def reverse(graph, ctx):
        graph.nodes.reverse()
        return graph

    @graph_pass("test_crash")
    def crash(graph, ctx):
        raise ValueError("boom")
    yield
    del PASSES["test_reverse_nodes"], PASSES["test_crash"]


def test_verifier_and_crashes_name_the_pass(broken_pass):
    g = graph(TEXT, four=F(4))
    with pytest.raises(KilnError, match=r"\[verify after test_reverse_nodes\].*not defined before"):
        run_passes(g, passes=["test_reverse_nodes"], verify=True)
    with pytest.raises(KilnError, match=r"\[test_crash\] pass failed: ValueError: boom"):
        run_passes(g, passes=["test_crash"])
    with pytest.raises(KilnError, match="unknown graph pass 'nope'"):
        run_passes(g, passes=["nope"])
