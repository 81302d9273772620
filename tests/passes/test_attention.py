"""Attention is found, rewritten to kiln::FusedAttention where the kernel takes it (the
head Transposes and the grouped-query repeat absorbed), and reported with the decision."""

import numpy as np

from kiln.passes import AttentionGroup
from tests.passes.util import assert_equivalent, graph, prog, run_pass

F = np.float32
KEYS = 16   # one vector of keys on every x86 target: fusion_pays fuses from there


def _sig(keys=KEYS):
    return (f"(%q: float32[1,2,4,8], %k: float32[1,2,8,{keys}], %v: float32[1,2,{keys},8], "
            f"%mask: float32[1,1,1,{keys}]) -> (%y)")


SIG = _sig()


def _attention(scale_op="Div", mask_line='  %m: float32[1,2,4,S] = Add(%s, %mask) name "mask"', sig=SIG,
               tail="", keys=KEYS):
    return prog(sig, "\n".join([
        '  %qk: float32[1,2,4,S] = MatMul(%q, %k) name "qk"',
        f'  %s: float32[1,2,4,S] = {scale_op}(%qk, %c) name "scale"',
        mask_line,
        '  %p: float32[1,2,4,S] = Softmax(%m) {axis = -1} name "softmax"',
        '  %y: float32[1,2,4,8] = MatMul(%p, %v) name "pv"' + tail]).replace(",S]", f",{keys}]"))


def _ops(g):
    return [n.qualified_op for n in g.nodes]


def test_scaled_masked_attention_is_fused_and_reported():
    g = graph(_attention(), c=F(2.0))
    out, stats = run_pass("fuse_attention", g)
    assert _ops(out) == ["kiln::FusedAttention"]
    (found,) = stats.findings
    assert found.nodes == ("qk", "scale", "mask", "softmax", "pv") and found.scale == 0.5
    assert found.mask == "additive" and found.decision.startswith("fused")
    assert "attention (qk, scale, mask, softmax, pv) scale 0.5, mask additive: fused" in str(stats)
    node = out.nodes[0]
    assert node.attrs["k_perm"] == [0, 1, 3, 2] and node.attrs["scale"] == 0.5
    assert_equivalent(g, out)


def test_where_mask_and_multiplied_scale():
    where = '  %m: float32[1,2,4,S] = Where(%b, %s, %neg) name "mask"'
    text = _attention("Mul", where).replace(f"%mask: float32[1,1,1,{KEYS}]", f"%b: bool[1,1,4,{KEYS}]")
    g = graph(text, c=F(0.25), neg=F(-1e4))
    out, stats = run_pass("fuse_attention", g)
    assert [(f.nodes, f.scale, f.mask) for f in stats.findings] == \
        [(("qk", "scale", "mask", "softmax", "pv"), 0.25, "where")]
    assert out.nodes[0].attrs["mask_kind"] == "bool" and out.nodes[0].attrs["fill"] == -1e4
    assert_equivalent(g, out)


def test_head_transposes_and_gqa_repeat_are_read_in_place():
    """Q, K, V made as (b, s, h, d) and transposed, K/V heads repeated (Unsqueeze, Expand,
    Reshape) for 4 query heads from 2: the op reads the sources; the output Transpose is its layout."""
    sig = ("(%qs: float32[1,4,4,8], %ks: float32[1,2,16,8], %vs: float32[1,2,16,8]) -> (%out)")
    body = "\n".join([
        '  %q: float32[1,4,4,8] = Transpose(%qs) {perm = [0, 2, 1, 3]} name "tq"',
        '  %ku: float32[1,2,1,16,8] = Unsqueeze(%ks, %ax) name "uk"',
        '  %ke: float32[1,2,2,16,8] = Expand(%ku, %eshape) name "ek"',
        '  %kr: float32[1,4,16,8] = Reshape(%ke, %rshape) name "rk"',
        '  %kt: float32[1,4,8,16] = Transpose(%kr) {perm = [0, 1, 3, 2]} name "tk"',
        '  %vu: float32[1,2,1,16,8] = Unsqueeze(%vs, %ax) name "uv"',
        '  %ve: float32[1,2,2,16,8] = Expand(%vu, %eshape) name "ev"',
        '  %vr: float32[1,4,16,8] = Reshape(%ve, %rshape) name "rv"',
        '  %qk: float32[1,4,4,16] = MatMul(%q, %kt) name "qk"',
        '  %s: float32[1,4,4,16] = Mul(%qk, %c) name "scale"',
        '  %p: float32[1,4,4,16] = Softmax(%s) {axis = -1} name "softmax"',
        '  %y: float32[1,4,4,8] = MatMul(%p, %vr) name "pv"',
        '  %out: float32[1,4,4,8] = Transpose(%y) {perm = [0, 2, 1, 3]} name "ty"'])
    g = graph(prog(sig, body), c=F(0.3), ax=np.array([2], np.int64),
              eshape=np.array([1, 2, 2, 16, 8], np.int64), rshape=np.array([1, 4, 16, 8], np.int64))
    out, stats = run_pass("fuse_attention", g)
    (node,) = [n for n in out.nodes if n.op == "FusedAttention"]
    assert [v.name for v in node.inputs] == ["qs", "ks", "vs"]
    assert node.attrs["q_perm"] == [0, 2, 1, 3] and node.attrs["k_perm"] == [0, 1, 2, 3]
    assert node.attrs["out_perm"] == [0, 2, 1, 3] and node.outputs[0].name == "out"
    assert_equivalent(g, out)


def test_scores_read_elsewhere_are_not_fused():
    text = _attention(tail="\n  %z: float32[1,2,4,S] = Relu(%qk) name \"other\"")
    text = text.replace("-> (%y)", "-> (%y, %z)")
    out, stats = run_pass("fuse_attention", graph(text, c=F(2.0)))
    assert "FusedAttention" not in _ops(out)
    assert stats.findings[0].decision == "not fused: qk's result is read elsewhere"


def test_symbolic_sizes_fuse_where_they_agree():
    """Sizes named by symbols fuse when the names line up (the kernel takes its sizes at run
    time: a shape-generic module); a symbol against another size does not."""
    text = _attention().replace("float32[1,2,4,8], %k", "float32[n,2,4,8], %k")
    out, stats = run_pass("fuse_attention", graph(text, c=F(2.0)))
    assert "FusedAttention" not in _ops(out)
    assert "do not line up" in stats.findings[0].decision
    sym = (_attention().replace("[1,2,4,8]", "[n,2,s,8]").replace("[1,2,8,", "[n,2,8,")
           .replace("[1,2,4,", "[n,2,s,").replace(f"[1,2,{KEYS},8]", f"[n,2,{KEYS},8]"))
    out, stats = run_pass("fuse_attention", graph(sym, c=F(2.0)))
    assert _ops(out) == ["kiln::FusedAttention"], stats.findings[0].decision


def test_softmax_not_followed_by_matmul_is_not_attention():
    text = prog("(%x: float32[2,4]) -> (%y)", '  %y: float32[2,4] = Softmax(%x) {axis = -1} name "sm"')
    out, stats = run_pass("fuse_attention", graph(text))
    assert stats.findings == []


def test_group_text():
    g = AttentionGroup(("a", "b"), None, None, "not fused: why")
    assert str(g) == "attention (a, b) scale none, mask none: not fused: why"


def test_bias_then_mask_become_one_mask():
    """T5's form, Add(Add(scores, position_bias), mask): the op gets bias + mask as one mask."""
    sig = SIG.replace(f"%mask: float32[1,1,1,{KEYS}]", f"%bias: float32[1,2,4,{KEYS}], %mask: float32[1,1,1,{KEYS}]")
    text = _attention("Mul", '  %sb: float32[1,2,4,S] = Add(%s, %bias) name "bias"\n'
                             '  %m: float32[1,2,4,S] = Add(%sb, %mask) name "mask"', sig)
    g = graph(text, c=F(1.0))
    out, stats = run_pass("fuse_attention", g)
    assert _ops(out) == ["Add", "kiln::FusedAttention"]
    assert stats.findings[0].nodes == ("qk", "scale", "bias", "mask", "softmax", "pv")
    assert [v.name for v in out.nodes[0].inputs] == ["bias", "mask"]
    assert_equivalent(g, out)


def test_a_few_keys_stay_decomposed():
    """Fewer keys than one vector: the decomposed kernels are faster (fusion_pays)."""
    from kiln.passes.attention import fusion_pays
    from kiln.targets.target import Target
    avx2 = Target.named("x86-64-v3")
    assert fusion_pays(1, 12, 8, 7, 64, avx2)[0] is False and fusion_pays(1, 12, 8, 8, 64, avx2)[0] is True
    out, stats = run_pass("fuse_attention", graph(_attention(sig=_sig(2), keys=2), c=F(2.0)))
    assert "FusedAttention" not in _ops(out) and "fewer than one" in stats.findings[0].decision
