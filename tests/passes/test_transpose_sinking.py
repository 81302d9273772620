"""Transpose sinking: before/after text, the interpreter's numbers unchanged, the
verifier after the pass, and the cases where it must not fire."""

import numpy as np
import pytest

from kiln.passes import passes_for
from tests.passes.util import check, prog

F, I = np.float32, np.int64
rng = np.random.default_rng(0)


def _check(sig, before, after, **consts):
    return check("sink_transposes", prog(sig, before), None if after is None else prog(sig, after), **consts)


def test_pair_through_unary_ops_cancels():
    sig = "(%x: float32[2,3,4]) -> (%y)"
    out, stats = _check(sig, "\n".join([
        '  %t: float32[4,2,3] = Transpose(%x) {perm = [2,0,1]} name "t1"',
        '  %r: float32[4,2,3] = Relu(%t) name "relu"',
        '  %e: float32[4,2,3] = Exp(%r) name "exp"',
        '  %y: float32[2,3,4] = Transpose(%e) {perm = [1,2,0]} name "t2"']), "\n".join([
        '  %relu.Relu: float32[2,3,4] = Relu(%x) name "relu.Relu"',
        '  %y: float32[2,3,4] = Exp(%relu.Relu) name "exp.Exp"']))
    assert stats.fired == {"sink past unary": 2, "transpose pair": 1}


def test_sunk_transpose_keeps_the_graph_output_name():
    sig = "(%x: float32[2,3]) -> (%y)"
    _check(sig, '  %t: float32[3,2] = Transpose(%x) name "t"\n'
                '  %y: float32[3,2] = Sigmoid(%t) name "sig"', "\n".join([
                    '  %sig.Sigmoid: float32[2,3] = Sigmoid(%x) name "sig.Sigmoid"',
                    '  %y: float32[3,2] = Transpose(%sig.Sigmoid) {perm = [1,0]} name "sig.Transpose"']))


def test_constant_operand_is_permuted_at_compile_time():
    sig = "(%x: float32[2,3,4]) -> (%y)"
    c = rng.standard_normal((2, 1)).astype(F)          # broadcast as [1,2,1] against [4,2,3]
    ct = np.transpose(c.reshape(1, 2, 1), [1, 2, 0])   # under the inverse of perm [2,0,1]
    _check(sig, "\n".join([
        '  %t: float32[4,2,3] = Transpose(%x) {perm = [2,0,1]} name "t1"',
        '  %a: float32[4,2,3] = Sub(%c, %t) name "sub"',
        '  %y: float32[2,3,4] = Transpose(%a) {perm = [1,2,0]} name "t2"']),
        '  %y: float32[2,3,4] = Sub(%sub.c, %x) name "sub.Sub"', c=c, **{"sub.c": ct})


@pytest.mark.parametrize("sig, ops, types, consts", [
    # a runtime one-element operand and Clip's scalar bounds need no permuting
    ("(%x: float32[2,3], %s: float32[1]) -> (%y)", ["Mul(%{}, %s)", "Clip(%{}, %lo, %hi)"],
     ["float32", "float32"], {"lo": F(-0.5), "hi": F(0.5)}),
    # a Cast and a comparison with a scalar constant do not care about the layout either
    ("(%x: float32[2,3]) -> (%y)", ["Cast(%{}) {{to = 10}}", "Greater(%{}, %z)"],
     ["float16", "bool"], {"z": np.float16(0.25)}),
])
def test_chain_between_inverse_transposes_loses_both(sig, ops, types, consts):
    names = [o.split("(")[0].lower() for o in ops]
    before = ['  %t: float32[3,2] = Transpose(%x) name "t1"',
              f'  %a: {types[0]}[3,2] = {ops[0].format("t")} name "{names[0]}"',
              f'  %b: {types[1]}[3,2] = {ops[1].format("a")} name "{names[1]}"',
              f'  %y: {types[1]}[2,3] = Transpose(%b) name "t2"']
    first = f"{names[0]}.{ops[0].split('(')[0]}"
    after = [f'  %{first}: {types[0]}[2,3] = {ops[0].format("x")} name "{first}"',
             f'  %y: {types[1]}[2,3] = {ops[1].format(first)} name "{names[1]}.{ops[1].split("(")[0]}"']
    _check(sig, "\n".join(before), "\n".join(after), **consts)


def test_two_equal_transposes_merge_into_one():
    sig = "(%x: float32[2,3,4], %z: float32[2,3,4]) -> (%y)"
    _check(sig, "\n".join([
        '  %t: float32[3,4,2] = Transpose(%x) {perm = [1,2,0]} name "tx"',
        '  %u: float32[3,4,2] = Transpose(%z) {perm = [1,2,0]} name "tz"',
        '  %y: float32[3,4,2] = Add(%t, %u) name "add"']), "\n".join([
        '  %add.Add: float32[2,3,4] = Add(%x, %z) name "add.Add"',
        '  %y: float32[3,4,2] = Transpose(%add.Add) {perm = [1,2,0]} name "add.Transpose"']))


# ---- where it must not fire ----

def test_transpose_with_two_readers_stays():
    sig = "(%x: float32[2,3]) -> (%y, %w)"
    _check(sig, '  %t: float32[3,2] = Transpose(%x) name "t"\n'
                '  %y: float32[3,2] = Relu(%t) name "relu"\n'
                '  %w: float32[3,2] = Exp(%t) name "exp"', None)


def test_transpose_that_is_a_graph_output_stays():
    sig = "(%x: float32[2,3]) -> (%y, %t)"
    _check(sig, '  %t: float32[3,2] = Transpose(%x) name "t"\n'
                '  %y: float32[3,2] = Relu(%t) name "relu"', None)


def test_non_scalar_runtime_operand_stays():
    # %z broadcasts along the transposed layout; it is not a constant, so it cannot be permuted
    sig = "(%x: float32[2,3], %z: float32[2]) -> (%y)"
    _check(sig, '  %t: float32[3,2] = Transpose(%x) name "t"\n'
                '  %y: float32[3,2] = Add(%t, %z) name "add"', None)


def test_transpose_broadcast_to_a_higher_rank_stays():
    sig = "(%x: float32[2,3]) -> (%y)"
    _check(sig, '  %t: float32[3,2] = Transpose(%x) name "t"\n'
                '  %y: float32[4,3,2] = Add(%t, %c) name "add"', None, c=rng.standard_normal((4, 1, 1)).astype(F))


def test_different_perms_do_not_merge():
    sig = "(%x: float32[2,2,2], %z: float32[2,2,2]) -> (%y)"
    _check(sig, "\n".join([
        '  %t: float32[2,2,2] = Transpose(%x) {perm = [1,2,0]} name "tx"',
        '  %u: float32[2,2,2] = Transpose(%z) {perm = [2,0,1]} name "tz"',
        '  %y: float32[2,2,2] = Add(%t, %u) name "add"']), None)


def test_non_agnostic_op_stops_the_sinking():
    sig = "(%x: float32[2,3], %w: float32[2,4]) -> (%y)"
    _check(sig, '  %t: float32[3,2] = Transpose(%x) name "t"\n'
                '  %y: float32[3,4] = MatMul(%t, %w) name "mm"', None)


@pytest.mark.parametrize("level", [2, 3])
def test_runs_after_algebraic_simplification(level):
    names = passes_for(level)
    assert names.index("sink_transposes") == names.index("simplify_algebra") + 1


def test_unary_moves_up_a_reshape_transpose_chain():
    """A detector head's Reshape -> Transpose -> Reshape -> Sigmoid: the Sigmoid reaches the
    chain's source (where a conv's epilogue can take it); the numbers are unchanged."""
    sig = "(%x: float32[1,6,2,2]) -> (%y)"
    before = "\n".join([
        '  %r1: float32[1,2,3,2,2] = Reshape(%x, %s1) name "r1"',
        '  %t: float32[1,2,2,2,3] = Transpose(%r1) {perm = [0,1,3,4,2]} name "t"',
        '  %r2: float32[1,8,3] = Reshape(%t, %s2) name "r2"',
        '  %y: float32[1,8,3] = Sigmoid(%r2) name "sig"'])
    after = "\n".join([
        '  %sig.Sigmoid.Sigmoid.Sigmoid: float32[1,6,2,2] = Sigmoid(%x) name "sig.Sigmoid.Sigmoid.Sigmoid"',
        '  %sig.Sigmoid.Sigmoid: float32[1,2,3,2,2] = Reshape(%sig.Sigmoid.Sigmoid.Sigmoid, %s1) '
        'name "sig.Sigmoid.Sigmoid.Reshape"',
        '  %sig.Sigmoid: float32[1,2,2,2,3] = Transpose(%sig.Sigmoid.Sigmoid) {perm = [0,1,3,4,2]} '
        'name "sig.Sigmoid.Transpose"',
        '  %y: float32[1,8,3] = Reshape(%sig.Sigmoid, %s2) name "sig.Reshape"'])
    out, stats = _check(sig, before, after, s1=np.array([1, 2, 3, 2, 2], I), s2=np.array([1, 8, 3], I))
    assert stats.fired == {"sink reshape past unary": 2, "sink past unary": 1}


def test_reshape_with_two_readers_stays():
    sig = "(%x: float32[2,6]) -> (%y, %w)"
    _check(sig, '  %r: float32[3,4] = Reshape(%x, %s) name "r"\n'
                '  %y: float32[3,4] = Relu(%r) name "relu"\n'
                '  %w: float32[3,4] = Exp(%r) name "exp"', None, s=np.array([3, 4], I))


def test_cast_does_not_move_up_a_reshape():
    sig = "(%x: int64[2,6]) -> (%y)"
    _check(sig, '  %r: int64[3,4] = Reshape(%x, %s) name "r"\n'
                '  %y: float32[3,4] = Cast(%r) {to = 1} name "cast"', None, s=np.array([3, 4], I))
