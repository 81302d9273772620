"""In-place execution: an elementwise kernel may write over an input that dies there,
never over an operand it reads at other indices; the compiled numbers stay right."""

import re

import numpy as np
import pytest

import kiln
from kiln.interpreter import Interpreter
from kiln.lower.inplace import inplace_candidates
from kiln.lower.memory import Lifetime, plan_arena
from kiln.compiler import lower as lower_graph
from tests.passes.util import graph, prog, random_inputs

F = np.float32
rng = np.random.default_rng(7)


def _g(sig, body, **consts):
    """A graph from its signature and node lines (each node named after its output)."""
    lines = [re.sub(r"^(\s*%(\w+):.*)$", r'\1 name "\2"', ln) for ln in body.splitlines()]
    return graph(prog(sig, "\n".join(lines)), **consts)


def _pairs(g):
    """(input name, output name) candidates of the whole graph taken as one kernel."""
    ins = []
    produced = {o.id for n in g.nodes for o in n.outputs}
    for n in g.nodes:
        for v in n.inputs:
            if v is not None and v.id not in produced and all(v is not x for x in ins):
                ins.append(v)
    outs = [g.nodes[-1].outputs[0]]
    return [(a.name, b.name) for a, b in inplace_candidates(g.nodes, ins, outs)]


def test_elementwise_chain_may_write_over_its_input():
    g = _g("(%x: float32[4,8], %b: float32[8]) -> (%z)", """  %y: float32[4,8] = Relu(%x)
  %z: float32[4,8] = Add(%y, %b)""")
    # x is read at the index written; b is broadcast (read at other indices, other shape)
    assert _pairs(g) == [("x", "z")]


def test_operand_read_at_other_indices_is_refused():
    g = _g("(%x: float32[4,8]) -> (%z)", """  %t: float32[8,4] = Transpose(%x) {perm = [1, 0]}
  %z: float32[8,4] = Exp(%t)""")
    assert _pairs(g) == []
    conv = _g("(%x: float32[1,4,6,6], %r: float32[1,4,6,6]) -> (%z)", """  %c: float32[1,4,6,6] = Conv(%x, %w) {kernel_shape = [3, 3], pads = [1, 1, 1, 1]}
  %z: float32[1,4,6,6] = Add(%c, %r)""", w=rng.standard_normal((4, 4, 3, 3)).astype(F))
    # the conv reads x at many positions; the residual r only where it writes
    assert _pairs(conv) == [("r", "z")]


def test_dtype_width_change_is_refused():
    g = _g("(%x: float32[16]) -> (%z)", """  %z: float16[16] = Cast(%x) {to = 10}""")
    assert _pairs(g) == []


def test_planner_merges_a_dying_input_with_the_output():
    bufs = [Lifetime("a", 1000, 0, 1), Lifetime("b", 1000, 1, 2), Lifetime("c", 1000, 2, 3)]
    plain = plan_arena(bufs, align=64)
    shared = plan_arena(bufs, align=64, share=[("a", "b"), ("b", "c")])
    assert plain.total == 2 * 1024
    assert shared.total == 1024 and shared.offsets["a"] == shared.offsets["b"] == shared.offsets["c"]
    assert shared.inplace == (("a", "b"), ("b", "c"))
    # a pair whose input is still read later, or whose sizes differ, is ignored
    late = plan_arena([Lifetime("a", 1000, 0, 2), Lifetime("b", 1000, 1, 2)], 64, share=[("a", "b")])
    small = plan_arena([Lifetime("a", 1000, 0, 1), Lifetime("b", 200, 1, 2)], 64, share=[("a", "b")])
    assert late.inplace == () and late.offsets["a"] != late.offsets["b"]
    assert small.inplace == ()


def test_compiled_inplace_chain_matches_interpreter():
    g = _g("(%x: float32[64,32], %b: float32[32]) -> (%out)", """  %s: float32[64,32] = Softmax(%x) {axis = 1}
  %e: float32[64,32] = Add(%s, %b)
  %m: float32[64,32] = Softmax(%e) {axis = 1}
  %n: float32[64,32] = Mul(%m, %e)
  %t: float32[64,32] = Softmax(%n) {axis = 0}
  %out: float32[64,32] = Sub(%t, %b)""")
    lm = lower_graph(g)
    assert len(lm.arena.inplace) >= 2, lm.arena
    assert lm.arena.total < lm.arena.unshared
    # a kernel reading and writing the same bytes must not promise `restrict` pointers
    entry = lm.module.funcs[-1]
    shared = {c.func for c in entry.body.stmts
              if len({(a.buffer.name, a.byte_offset) for a in c.args if hasattr(a, "byte_offset")}) <
              sum(hasattr(a, "byte_offset") for a in c.args)}
    assert shared and all(not f.noalias for f in lm.module.funcs if f.name in shared)
    cm = kiln.compile(g, target="cpu", opt_level=0, report=True)
    assert cm.report.inplace_kernels == len(lm.arena.inplace)
    for seed in (0, 1):
        xs = random_inputs(g, seed)
        want = Interpreter(g).run(xs)[0]
        got = cm(*xs)
        got = got[0] if isinstance(got, (list, tuple)) else got
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opt_level", [0, 3])
def test_resnet18_arena_within_twice_the_largest_live_pair(opt_level):
    from benchmarks.models import resnet18
    from kiln.compiler import to_graph
    from kiln.lower.memory import largest_live_pair
    from kiln.passes import run_passes
    g, _ = run_passes(to_graph(resnet18()), opt_level)
    plan = lower_graph(g).arena
    pair = largest_live_pair(list(plan.buffers))
    assert plan.lower_bound <= plan.total <= 2 * pair, plan
    assert plan.total < plan.unshared / 2   # reuse: far below one buffer per intermediate
