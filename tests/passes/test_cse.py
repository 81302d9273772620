"""Common subexpression elimination: equal constants and equal nodes are computed once."""

import numpy as np

from tests.passes.util import check, prog

F, I = np.float32, np.int64
SIG = "(%x: float32[2,3]) -> (%y)"


def test_equal_nodes_are_merged():
    before = ('  %a: float32[2,3] = Relu(%x) name "a"\n'
              '  %b: float32[2,3] = Relu(%x) name "b"\n'
              '  %y: float32[2,3] = Mul(%a, %b) name "y"')
    after = ('  %a: float32[2,3] = Relu(%x) name "a"\n'
             '  %y: float32[2,3] = Mul(%a, %a) name "y"')
    _, stats = check("eliminate_common_subexpressions", prog(SIG, before), prog(SIG, after))
    assert (stats.removed, stats.rewritten) == (1, 1)


def test_equal_constants_are_merged_then_the_nodes_reading_them():
    before = ('  %a: float32[2,3] = Add(%x, %c1) name "a"\n'
              '  %b: float32[2,3] = Add(%x, %c2) name "b"\n'
              '  %y: float32[2,3] = Sub(%a, %b) name "y"')
    after = ('  %a: float32[2,3] = Add(%x, %c1) name "a"\n'
             '  %y: float32[2,3] = Sub(%a, %a) name "y"')
    _, stats = check("eliminate_common_subexpressions", prog(SIG, before), prog(SIG, after),
                     c1=np.array([1, 2, 3], F), c2=np.array([1, 2, 3], F))
    assert stats.fired == {"constant": 1, "Add": 1}


def test_different_attributes_or_constants_stay_apart():
    before = ('  %a: float32[3,2] = Transpose(%x) {perm = [1, 0]} name "a"\n'
              '  %b: float32[2,3] = Transpose(%x) {perm = [0, 1]} name "b"\n'
              '  %c: float32[2,3] = Add(%x, %c1) name "c"\n'
              '  %d: float32[2,3] = Add(%x, %c2) name "d"\n'
              '  %e: float32[2,3] = Add(%c, %d) name "e"\n'
              '  %y: float32[2,3] = Add(%e, %b) name "y"')
    sig = "(%x: float32[2,3]) -> (%y, %a)"
    check("eliminate_common_subexpressions", prog(sig, before), None,
          c1=np.array([1, 2, 3], F), c2=np.array([1, 2, 4], F))


def test_negative_zero_is_not_zero():
    before = ('  %a: float32[2,3] = Mul(%x, %z1) name "a"\n'
              '  %b: float32[2,3] = Mul(%x, %z2) name "b"\n'
              '  %y: float32[2,3] = Div(%one, %a) name "y"\n'
              '  %w: float32[2,3] = Div(%one, %b) name "w"')
    sig = "(%x: float32[2,3]) -> (%y, %w)"
    from tests.passes.util import graph, run_pass
    g = graph(prog(sig, before), z1=F(0.0), z2=F(-0.0), one=F(1))
    out, stats = run_pass("eliminate_common_subexpressions", g)
    assert len(out.nodes) == 4 and stats.fired == {"constant": 0}


def test_random_nodes_are_not_merged():
    before = ('  %a: float32[2,3] = RandomNormalLike(%x) name "a"\n'
              '  %b: float32[2,3] = RandomNormalLike(%x) name "b"\n'
              '  %y: float32[2,3] = Sub(%a, %b) name "y"')
    from tests.passes.util import graph, run_pass
    out, _ = run_pass("eliminate_common_subexpressions", graph(prog(SIG, before)))
    assert len(out.nodes) == 3


def test_duplicate_graph_output_is_kept():
    """Two outputs computing the same thing: both stay (each output keeps its own name)."""
    sig = "(%x: float32[2,3]) -> (%y, %w)"
    before = ('  %y: float32[2,3] = Relu(%x) name "a"\n'
              '  %w: float32[2,3] = Relu(%x) name "b"')
    check("eliminate_common_subexpressions", prog(sig, before), None)
