"""Constant folding: all-constant nodes become constants; the size cap keeps weights single."""

import numpy as np

from kiln.passes.constant_folding import SMALL
from tests.passes.util import check, prog

F, I = np.float32, np.int64


def test_chain_of_constants_folds_into_one_constant():
    sig = "(%x: float32[2,3]) -> (%y)"
    before = ('  %a: float32[3] = Mul(%c, %two) name "a"\n'
              '  %b: float32[3] = Add(%a, %one) name "b"\n'
              '  %y: float32[2,3] = Add(%x, %b) name "y"')
    after = '  %y: float32[2,3] = Add(%x, %b) name "y"'
    c = np.array([1, 2, 3], F)
    _, stats = check("fold_constants", prog(sig, before), prog(sig, after), c=c, two=F(2),
                     one=F(1), b=c * 2 + 1)
    assert stats.removed == 2 and stats.fired == {"Mul": 1, "Add": 1}


def test_shape_arithmetic_of_a_static_tensor_folds():
    """Reshape(x, Concat(Shape(x)[:1], [-1])): the shape becomes a constant."""
    sig = "(%x: float32[2,3,4]) -> (%y)"
    before = ('  %s: int64[3] = Shape(%x) name "shape"\n'
              '  %h: int64[1] = Slice(%s, %z, %o) name "head"\n'
              '  %t: int64[2] = Concat(%h, %m1) {axis = 0} name "cat"\n'
              '  %y: float32[2,12] = Reshape(%x, %t) name "r"')
    after = '  %y: float32[2,12] = Reshape(%x, %t) name "r"'
    check("fold_constants", prog(sig, before), prog(sig, after), z=np.array([0], I),
          o=np.array([1], I), m1=np.array([-1], I), t=np.array([2, -1], I))


def test_constant_node_becomes_a_constant_value():
    sig = "(%x: float32[2]) -> (%y)"
    before = ('  %c: float32[2] = Constant() {value_floats = [1.0, 2.0]} name "k"\n'
              '  %y: float32[2] = Add(%x, %c) name "y"')
    check("fold_constants", prog(sig, before), prog(sig, '  %y: float32[2] = Add(%x, %c) name "y"'),
          c=np.array([1, 2], F))


def test_large_results_that_grow_the_data_stay():
    """Expand(scalar, [64, 128]) would store 8192 floats for one: left to run time."""
    sig = "(%x: float32[64,128]) -> (%y)"
    before = ('  %e: float32[64,128] = Expand(%c, %shape) name "e"\n'
              '  %y: float32[64,128] = Add(%x, %e) name "y"')
    check("fold_constants", prog(sig, before), None, c=F(3), shape=np.array([64, 128], I))


def test_shared_weight_is_not_duplicated_but_a_private_one_is_transformed():
    sig = "(%x: float32[8,128], %z: float32[128,128]) -> (%y, %u)"
    w = np.arange(128 * 128, dtype=F).reshape(128, 128) / 1e4
    assert w.size > SMALL
    shared = ('  %wt: float32[128,128] = Transpose(%w) name "t"\n'
              '  %y: float32[8,128] = MatMul(%x, %wt) name "mm"\n'
              '  %u: float32[128,128] = Add(%z, %w) name "u"')
    check("fold_constants", prog(sig, shared), None, w=w)
    private = ('  %wt: float32[128,128] = Transpose(%w) name "t"\n'
               '  %y: float32[8,128] = MatMul(%x, %wt) name "mm"\n'
               '  %u: float32[128,128] = Add(%z, %z) name "u"')
    after = ('  %y: float32[8,128] = MatMul(%x, %wt) name "mm"\n'
             '  %u: float32[128,128] = Add(%z, %z) name "u"')
    check("fold_constants", prog(sig, private), prog(sig, after), w=w, wt=w.T.copy())


def test_random_ops_and_graph_outputs_stay():
    sig = "(%x: float32[2]) -> (%y, %k)"
    before = ('  %r: float32[2] = RandomUniformLike(%c) name "rand"\n'
              '  %y: float32[2] = Add(%x, %r) name "y"\n'
              '  %k: float32[2] = Neg(%c) name "k"')
    from kiln.passes import run_passes
    from tests.passes.util import graph
    g = graph(prog(sig, before), c=np.array([1, 2], F))
    out, stats = run_passes(g, passes=["fold_constants"], verify=True)
    assert [n.op for n in out.nodes] == ["RandomUniformLike", "Add", "Neg"]
