"""NOP elimination: before/after text, numbers unchanged, and the look-alikes that stay."""

import numpy as np
import pytest

from kiln.graph import print_graph
from tests.passes.util import check, graph, prog, run_pass

F, I = np.float32, np.int64
SIG = "(%x: float32[2,3]) -> (%y)"
RELU = '\n  %y: float32[2,3] = Relu(%t) name "relu"'
AFTER = prog(SIG, '  %y: float32[2,3] = Relu(%x) name "relu"')


@pytest.mark.parametrize("node, c", [
    ("Add(%x, %c)", F(0)),
    ("Add(%c, %x)", np.zeros(3, F)),
    ("Sub(%x, %c)", F(0)),
    ("Mul(%c, %x)", F(1)),
    ("Div(%x, %c)", np.ones((1, 3), F)),
    ("Pow(%x, %c)", F(1)),
    ("Reshape(%x, %c)", np.array([2, -1], I)),
    ("Expand(%x, %c)", np.array([1, 3], I)),
    ("Pad(%x, %c)", np.zeros(4, I)),
    ("Slice(%x, %c, %e)", np.array([0, 0], I)),
])
def test_nop_is_removed(node, c):
    before = prog(SIG, f'  %t: float32[2,3] = {node} name "n"' + RELU)
    _, stats = check("eliminate_nops", before, AFTER, c=c, e=np.array([99, 3], I))
    assert (stats.removed, stats.rewritten) == (1, 1)


@pytest.mark.parametrize("node", [
    "Identity(%x)",
    "Cast(%x) {to = 1}",
    "Transpose(%x) {perm = [0, 1]}",
    "Dropout(%x)",
    "Squeeze(%x)",
    "Flatten(%x) {axis = 1}",
    "Concat(%x) {axis = 0}",
])
def test_unary_nop_is_removed(node):
    check("eliminate_nops", prog(SIG, f'  %t: float32[2,3] = {node} name "n"' + RELU), AFTER)


def test_dropout_in_training_mode_stays():
    before = prog(SIG, '  %t: float32[2,3] = Dropout(%x, %r, %train) {seed = 3} name "n"' + RELU)
    check("eliminate_nops", before, None, r=F(0.5), train=np.array(True))


@pytest.mark.parametrize("node, out, c", [
    ("Add(%x, %c)", "2,2,3", np.zeros((2, 1, 3), F)),  # broadcasting changes the shape
    ("Mul(%x, %c)", "2,3", np.full(3, 1.5, F)),
    ("Sub(%c, %x)", "2,3", F(0)),                       # 0 - x is not x
    ("Pad(%x, %c)", "2,3", np.array([1, 0, -1, 0], I)),  # same shape, shifted data
])
def test_look_alikes_stay(node, out, c):
    sig = "(%x: float32[2,3]) -> (%t)"
    check("eliminate_nops", prog(sig, f'  %t: float32[{out}] = {node} name "n"'), None, c=c)


def test_square_transpose_and_reversing_slice_stay():
    sig = "(%x: float32[3,3]) -> (%t, %s)"
    body = ('  %t: float32[3,3] = Transpose(%x) {perm = [1, 0]} name "tr"\n'
            '  %s: float32[3,3] = Slice(%x, %start, %end, %axes, %step) name "sl"')
    check("eliminate_nops", prog(sig, body), None, start=np.array([-1], I),
          end=np.array([-99], I), axes=np.array([0], I), step=np.array([-1], I))


def test_unknown_shapes_are_not_the_same_shape():
    sig = "(%x: float32[*], %s: int64[2]) -> (%y)"
    body = ('  %t: float32[*] = Reshape(%x, %s) name "n"\n'
            '  %y: float32[*] = Relu(%t) name "relu"')
    g = graph(prog(sig, body))
    out, stats = run_pass("eliminate_nops", g)
    assert print_graph(out) == print_graph(g) and not stats.changed


def test_graph_output_keeps_its_name():
    """Identity feeding the graph output: its input takes over the output's name."""
    sig = "(%x: float32[2,3]) -> (%y)"
    before = prog(sig, '  %t: float32[2,3] = Relu(%x) name "relu"\n'
                       '  %y: float32[2,3] = Identity(%t) name "id"')
    check("eliminate_nops", before, prog(sig, '  %y: float32[2,3] = Relu(%x) name "relu"'))


def test_identity_from_input_to_output_stays():
    sig = "(%x: float32[2,3]) -> (%y)"
    check("eliminate_nops", prog(sig, '  %y: float32[2,3] = Identity(%x) name "id"'), None)


def test_dropout_with_read_mask_stays():
    sig = "(%x: float32[2,3]) -> (%y, %m)"
    check("eliminate_nops", prog(sig, '  %y: float32[2,3], %m: bool[2,3] = Dropout(%x) name "d"'),
          None)
