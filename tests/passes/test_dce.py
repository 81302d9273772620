"""Dead code elimination: unread chains go, values read by graph outputs or subgraphs stay."""

import numpy as np

from tests.passes.util import check, prog

F = np.float32


def test_dead_chain_is_removed():
    sig = "(%x: float32[2,3]) -> (%y)"
    before = ('  %a: float32[2,3] = Exp(%x) name "a"\n'
              '  %b: float32[2,3] = Neg(%a) name "b"\n'
              '  %c: float32[2,3] = Abs(%b) name "c"\n'
              '  %y: float32[2,3] = Relu(%x) name "y"')
    _, stats = check("eliminate_dead_code", prog(sig, before),
                     prog(sig, '  %y: float32[2,3] = Relu(%x) name "y"'))
    assert stats.removed == 3


def test_value_read_only_inside_a_subgraph_is_live():
    sig = "(%x: float32[2], %cond: bool[]) -> (%y)"
    before = ('  %a: float32[2] = Exp(%x) name "a"\n'
              '  %dead: float32[2] = Neg(%x) name "dead"\n'
              '  %y: float32[2] = If(%cond) {'
              'then_branch = graph "t" () -> (%o1)\n  {\n'
              '    %o1: float32[2] = Neg(%a) name "t0"\n'
              '    %unused: float32[2] = Abs(%a) name "t1"\n  }, '
              'else_branch = graph "e" () -> (%o2)\n  {\n'
              '    %o2: float32[2] = Abs(%x) name "e0"\n  }} name "if"')
    after = ('  %a: float32[2] = Exp(%x) name "a"\n'
             '  %y: float32[2] = If(%cond) {'
             'then_branch = graph "t" () -> (%o1)\n  {\n'
             '    %o1: float32[2] = Neg(%a) name "t0"\n  }, '
             'else_branch = graph "e" () -> (%o2)\n  {\n'
             '    %o2: float32[2] = Abs(%x) name "e0"\n  }} name "if"')
    _, stats = check("eliminate_dead_code", prog(sig, before), prog(sig, after))
    assert stats.removed == 2
