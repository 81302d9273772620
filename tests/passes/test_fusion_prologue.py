"""Injective prologues folded into their consumer's kernel (kiln.lower.partition).

A Transpose/Reshape/Slice/Expand group whose only reader is a MatMul/Gemm or a
reduction joins that reader's group, so lowering inlines it into the anchor's
loads instead of writing a copy. Partition results and the why-not log are
checked on text graphs; compiled kernels are checked against the interpreter on
random inputs; the BERT encoder's kernels are checked for LayerNorm, GELU and
softmax each staying in one kernel of their own.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import kiln
from kiln.lower.partition import Kind, partition
from tests.passes.util import graph, prog, random_inputs

F, I = np.float32, np.int64
rng = np.random.default_rng(0)


def groups_of(text: str, fuse_prologues: bool | None = None, **consts):
    g = graph(text, **consts)
    plan = partition(g, fuse_anchors=True, fuse_prologues=fuse_prologues)
    return g, plan, [[n.name for n in grp.nodes] for grp in plan.groups]


QK = prog("(%q: float32[2,5,4,3], %k: float32[2,5,4,3], %v: float32[2,5,4,3]) -> (%y)", "\n".join([
    '  %qt: float32[2,4,5,3] = Transpose(%q) {perm = [0,2,1,3]} name "tq"',
    '  %kt: float32[2,4,3,5] = Transpose(%k) {perm = [0,2,3,1]} name "tk"',
    '  %vt: float32[2,4,5,3] = Transpose(%v) {perm = [0,2,1,3]} name "tv"',
    '  %s: float32[2,4,5,5] = MatMul(%qt, %kt) name "qk"',
    '  %p: float32[2,4,5,5] = Softmax(%s) {axis = -1} name "sm"',
    '  %c: float32[2,4,5,3] = MatMul(%p, %vt) name "pv"',
    '  %ct: float32[2,5,4,3] = Transpose(%c) {perm = [0,2,1,3]} name "tc"',
    '  %y: float32[2,5,12] = Reshape(%ct, %shape) name "merge"']))
QK_CONSTS = dict(shape=np.array([2, 5, 12], I))


def test_attention_transposes_fold_into_their_matmuls():
    _, plan, names = groups_of(QK, **QK_CONSTS)
    # tv comes before qk in the graph, but only pv reads it: it moves down to pv's group
    assert names == [["tq", "tk", "qk"], ["sm"], ["tv", "pv"], ["tc", "merge"]]
    assert [g.kind for g in plan.groups] == [Kind.OUT_FUSABLE, Kind.REDUCTION, Kind.OUT_FUSABLE,
                                             Kind.INJECTIVE]
    assert [g.anchor.name for g in plan.groups[:3]] == ["qk", "sm", "pv"]
    assert not any("tq" in w or "tk" in w or "tv" in w for w in plan.why_not)


def test_without_prologue_fusion_transposes_are_kernels_of_their_own():
    _, plan, names = groups_of(QK, fuse_prologues=False, **QK_CONSTS)
    assert ["tq"] in names and ["tk"] in names and ["qk"] in names


def test_transpose_with_two_readers_is_not_folded():
    _, plan, names = groups_of(prog("(%x: float32[4,3], %w: float32[4,6]) -> (%y, %r)", "\n".join([
        '  %t: float32[3,4] = Transpose(%x) name "t"',
        '  %y: float32[3,6] = MatMul(%t, %w) name "mm"',
        '  %r: float32[3,4] = Relu(%t) name "relu"'])))
    assert names == [["t"], ["mm"], ["relu"]]
    assert any(w.startswith("Transpose(t) -> MatMul(mm)") and "%t has 2 consumers" in w for w in plan.why_not)


def test_transpose_that_is_a_graph_output_is_not_folded():
    _, plan, names = groups_of(prog("(%x: float32[4,3], %w: float32[4,6]) -> (%y, %t)", "\n".join([
        '  %t: float32[3,4] = Transpose(%x) name "t"',
        '  %y: float32[3,6] = MatMul(%t, %w) name "mm"'])))
    assert names == [["t"], ["mm"]]
    assert any("graph output" in w for w in plan.why_not)


@pytest.mark.parametrize("body, reason", [
    ('  %t: float32[3,4] = Relu(%x) name "t"', "computes values"),
    ('  %t: float32[3,4] = Reshape(%x, %shape) name "t"', "a view of its input"),
])
def test_refused_prologues_are_logged(body, reason):
    _, plan, names = groups_of(prog("(%x: float32[3,4], %w: float32[4,6]) -> (%y)", body + "\n"
                                    '  %y: float32[3,6] = MatMul(%t, %w) name "mm"'),
                               shape=np.array([3, 4], I))
    assert names == [["t"], ["mm"]]
    why = [w for w in plan.why_not if w.startswith(f"{body.split('= ')[1].split('(')[0]}(t) -> MatMul(mm)")]
    assert len(why) == 1 and reason in why[0], plan.why_not


FLAT = prog("(%x: float32[2,3,4,5], %w: float32[60,7]) -> (%y)", "\n".join([
    '  %r: float32[2,3,4,5] = Relu(%x) name "relu"',
    '  %f: float32[2,60] = Reshape(%r, %shape) name "flat"',
    '  %y: float32[2,7] = MatMul(%f, %w) name "mm"']))


def test_view_read_only_by_an_anchor_stays_an_alias_of_a_computing_group():
    """Relu -> Flatten -> MatMul: the Flatten joining the Relu would gain nothing (the MatMul
    takes no producer, and a Relu is no prologue) and index the Relu through divisions; apart it
    is an alias (no kernel); the compiled model still matches the interpreter."""
    consts = dict(shape=np.array([2, 60], I), w=rng.standard_normal((60, 7)).astype(F))
    g, plan, names = groups_of(FLAT, **consts)
    assert names == [["relu"], ["flat"], ["mm"]]
    assert any(w.startswith("Relu(relu) -> Reshape(flat)") and "alias" in w for w in plan.why_not), plan.why_not
    m = kiln.compile(graph(FLAT, **consts), target="cpu", opt_level=0, report=True)
    assert m.report.kernels == 2, m.report.fused_groups
    ref = kiln.compile(graph(FLAT, **consts), target="interpreter", opt_level=0)
    xs = {v.name: x for v, x in zip(g.inputs, random_inputs(g, 3))}
    np.testing.assert_allclose(m.run(xs)["y"], ref.run(xs)["y"], rtol=1e-4, atol=1e-5)
    # a reader that could continue the group after the view: the view joins as before
    _, _, names = groups_of(FLAT.replace('%y: float32[2,7] = MatMul(%f, %w) name "mm"',
                                         '%y: float32[2,60] = Sigmoid(%f) name "mm"'), **consts)
    assert names == [["relu", "flat", "mm"]]


def test_conv_takes_no_prologue():
    _, plan, names = groups_of(prog("(%x: float32[1,6,6,2]) -> (%y)", "\n".join([
        '  %t: float32[1,2,6,6] = Transpose(%x) {perm = [0,3,1,2]} name "t"',
        '  %y: float32[1,3,4,4] = Conv(%t, %w) {kernel_shape = [3,3]} name "conv"'])),
        w=rng.standard_normal((3, 2, 3, 3)).astype(F))
    assert names == [["t"], ["conv"]]
    assert any("Conv's lowering does not read through an inlined prologue" in w for w in plan.why_not)


def test_epilogue_still_follows_an_anchor_with_a_prologue():
    _, plan, names = groups_of(prog("(%x: float32[4,3], %w: float32[4,6]) -> (%y)", "\n".join([
        '  %t: float32[3,4] = Transpose(%x) name "t"',
        '  %m: float32[3,6] = MatMul(%t, %w) name "mm"',
        '  %y: float32[3,6] = Relu(%m) name "relu"'])))
    assert names == [["t", "mm", "relu"]]
    assert plan.groups[0].anchor.name == "mm"


# ---- compiled (target "cpu") against the interpreter ----

CASES = {
    "transpose->matmul A": ("(%x: float32[2,7,5], %w: float32[7,9]) -> (%y)", [
        '  %t: float32[2,5,7] = Transpose(%x) {perm = [0,2,1]} name "t"',
        '  %y: float32[2,5,9] = MatMul(%t, %w) name "mm"'], {}),
    "transpose->matmul B (K^T)": ("(%q: float32[1,3,6,4], %k: float32[1,6,3,4]) -> (%y)", [
        '  %kt: float32[1,3,4,6] = Transpose(%k) {perm = [0,2,3,1]} name "t"',
        '  %y: float32[1,3,6,6] = MatMul(%q, %kt) name "mm"'], {}),
    "both operands transposed, with epilogue": ("(%a: float32[5,3], %b: float32[9,5]) -> (%y)", [
        '  %at: float32[3,5] = Transpose(%a) name "ta"',
        '  %bt: float32[5,9] = Transpose(%b) name "tb"',
        '  %m: float32[3,9] = MatMul(%at, %bt) name "mm"',
        '  %y: float32[3,9] = Add(%m, %bias) name "add"'], {"bias": (9,)}),
    "transpose+reshape (head merge)->matmul": ("(%c: float32[1,4,5,3], %w: float32[12,7]) -> (%y)", [
        '  %t: float32[1,5,4,3] = Transpose(%c) {perm = [0,2,1,3]} name "t"',
        '  %r: float32[1,5,12] = Reshape(%t, %shape) name "r"',
        '  %y: float32[1,5,7] = MatMul(%r, %w) name "mm"'], {"shape": np.array([1, 5, 12], I)}),
    "head merge->batched matmul, broadcast B": ("(%c: float32[2,3,5,4], %w: float32[12,6]) -> (%y)", [
        '  %t: float32[2,5,3,4] = Transpose(%c) {perm = [0,2,1,3]} name "t"',
        '  %r: float32[2,5,12] = Reshape(%t, %shape) name "r"',
        '  %y: float32[2,5,6] = MatMul(%r, %w) name "mm"'], {"shape": np.array([2, 5, 12], I)}),
    "merged B of a Gemm(transB) with few rows (S = B^T)": ("(%a: float32[2,12], %v: float32[3,8,4]) -> (%y)", [
        '  %t: float32[8,3,4] = Transpose(%v) {perm = [1,0,2]} name "t"',
        '  %r: float32[8,12] = Reshape(%t, %shape) name "r"',
        '  %y: float32[2,8] = Gemm(%a, %r) {transB = 1} name "gemm"'], {"shape": np.array([8, 12], I)}),
    "reshape (head split)+transpose->matmul": ("(%x: float32[1,5,12], %k: float32[1,4,5,3]) -> (%y)", [
        '  %r: float32[1,5,4,3] = Reshape(%x, %shape) name "r"',
        '  %t: float32[1,4,5,3] = Transpose(%r) {perm = [0,2,1,3]} name "t"',
        '  %kt: float32[1,4,3,5] = Transpose(%k) {perm = [0,1,3,2]} name "tk"',
        '  %y: float32[1,4,5,5] = MatMul(%t, %kt) name "mm"'], {"shape": np.array([1, 5, 4, 3], I)}),
    "slice->gemm": ("(%x: float32[6,10], %w: float32[8,4]) -> (%y)", [
        '  %s: float32[3,4] = Slice(%x, %starts, %ends, %axes, %steps) name "s"',
        '  %y: float32[3,8] = Gemm(%s, %w, %bias) {transB = 1} name "gemm"'],
        {"starts": np.array([1, 2], I), "ends": np.array([9, 100], I), "axes": np.array([0, 1], I),
         "steps": np.array([2, 2], I), "bias": (8,)}),
    "expand->matmul": ("(%x: float32[1,4,6], %w: float32[3,6,5]) -> (%y)", [
        '  %e: float32[3,4,6] = Expand(%x, %shape) name "e"',
        '  %y: float32[3,4,5] = MatMul(%e, %w) name "mm"'], {"shape": np.array([3, 4, 6], I)}),
    "transpose->softmax": ("(%x: float32[2,9,6]) -> (%y)", [
        '  %t: float32[2,6,9] = Transpose(%x) {perm = [0,2,1]} name "t"',
        '  %y: float32[2,6,9] = Softmax(%t) {axis = -1} name "sm"'], {}),
    "transpose->reducemean": ("(%x: float32[3,8,5]) -> (%y)", [
        '  %t: float32[5,3,8] = Transpose(%x) {perm = [2,0,1]} name "t"',
        '  %y: float32[5,3,1] = ReduceMean(%t, %axes) {keepdims = 1} name "rm"'],
        {"axes": np.array([-1], I)}),
    "transpose->layernorm": ("(%x: float32[2,16,3]) -> (%y)", [
        '  %t: float32[2,3,16] = Transpose(%x) {perm = [0,2,1]} name "t"',
        '  %y: float32[2,3,16] = LayerNormalization(%t, %g, %b) {axis = -1} name "ln"'],
        {"g": (16,), "b": (16,)}),
}


def _consts(spec: dict) -> dict:
    return {k: v if isinstance(v, np.ndarray) else rng.uniform(0.5, 1.5, v).astype(F)
            for k, v in spec.items()}


@pytest.mark.parametrize("case", list(CASES))
def test_folded_prologue_compiles_to_one_kernel_matching_the_interpreter(case):
    sig, body, spec = CASES[case]
    text, consts = prog(sig, "\n".join(body), opset=18), _consts(spec)
    g = graph(text, **consts)
    plan = partition(g, fuse_anchors=True)
    assert len(plan.groups) == 1, plan.why_not
    m = kiln.compile(graph(text, **consts), target="cpu", opt_level=0, report=True)
    assert m.report.kernels == 1, m.report.fused_groups
    ref = kiln.compile(graph(text, **consts), target="interpreter", opt_level=0)
    for seed in (0, 1):
        xs = {v.name: x for v, x in zip(g.inputs, random_inputs(g, seed))}
        got, want = m.run(xs), ref.run(xs)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5, err_msg=case)


# ---- the BERT encoder: kernels per layer; LayerNorm, GELU, attention one kernel each ----

def _bert_report(layers: int):
    from benchmarks.models import bert_encoder
    model = bert_encoder(layers=layers, seq=16, hidden=32, heads=4, inter=64, vocab=50)
    return kiln.compile(model, target="cpu", opt_level=3, report=True).report


def _ops(call: str) -> list[str]:
    return re.findall(r"(\w+) node '", call)


@pytest.mark.slow
def test_bert_layers_are_seven_kernels_with_one_kernel_per_layernorm_gelu_attention():
    """A layer: merged QKV GEMM, fused attention (its softmax inside), output GEMM + bias +
    residual, LayerNorm, FFN GEMM + bias + GELU, FFN GEMM + bias + residual, LayerNorm."""
    one, two = _bert_report(1), _bert_report(2)
    assert two.kernels - one.kernels == 7, two.fused_groups
    layer_ops = ("LayerNormalization", "Gelu", "FusedAttention")
    for call in two.fused_groups:
        ops = _ops(call)
        assert sum(ops.count(o) for o in layer_ops) <= 1, call   # never two of them in a kernel
        # nothing of a LayerNorm/GELU/softmax left as primitives split over other kernels
        assert not {"ReduceMean", "Erf", "Sqrt", "Exp", "ReduceSum", "ReduceMax", "Softmax"} & set(ops), call
    counts = {o: sum(_ops(c).count(o) for c in two.fused_groups) for o in layer_ops}
    assert counts == {"LayerNormalization": 1 + 2 * 2, "Gelu": 2, "FusedAttention": 2}
    # per layer: the head transposes ride in the attention MatMuls, no copy kernels
    assert not any(_ops(c)[-1] in ("Transpose", "Reshape") for c in two.fused_groups), two.fused_groups


@pytest.mark.parametrize("case, packed", [("transpose+reshape (head merge)->matmul", True),
                                          ("merged B of a Gemm(transB) with few rows (S = B^T)", True),
                                          ("transpose->matmul A", False)])
def test_gemm_copies_an_operand_whose_prologue_divides_indices_once(case, packed):
    """A merged-dims view read by the micro-kernel would divide indices at every k step;
    the GEMM copies it row-major first (kiln.lower.gemm's S packing), other views it reads in place."""
    from kiln.lower.kernel import lower_group
    from kiln.targets.target import Target
    sig, body, spec = CASES[case]
    g = graph(prog(sig, "\n".join(body), opset=18), **_consts(spec))
    k = lower_group(g.nodes, {id(n): 18 for n in g.nodes}, {id(n): [v.const for v in n.inputs] for n in g.nodes},
                    lambda v: False, "k", Target.host())
    assert ("s_packed" in str(k.func)) == packed
