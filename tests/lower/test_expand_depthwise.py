"""kiln::ExpandDepthwise (kiln.passes.inverted_residual, kiln.ops.inverted_residual,
kiln.lower.inverted_residual): a squeeze-excite block's expand 1x1 -> depthwise part as one
kernel, with the gate's global average pool as its second output, against ONNX Runtime and the
reference on random blocks (channel counts that fill blocks or not, kernels 3 and 5, strides 1
and 2, odd sizes, every activation, batch > 1, a symbolic batch), a depthwise result with other
readers (no pool), and the rule that chooses it."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from hypothesis import HealthCheck, given, settings, strategies as st
from onnx import helper, numpy_helper

import kiln
from benchmarks.inverted_residual import block_model
from kiln.compiler import run_stages
from kiln.lower.conv_algo import IR_ROW_PASS_L2_SHARE, choose_expand_depthwise
from kiln.targets.target import Target
from tests.helpers import examples

FUSED = {"conv.inverted_residual": "fused"}
ACTS = ["", "Relu", "Clip", "HardSwish", "SiLU"]
BLOCK = Target.host().vector_lanes(4)
CHANNELS = st.one_of(st.integers(1, 3).map(lambda b: b * BLOCK), st.integers(3, 40))


def se_block(c, e, o, h, w, k, s, acts, seed=0, n=1, gate="Sigmoid", two_projects=False) -> bytes:
    """benchmarks.inverted_residual's block (expand 1x1 -> act -> depthwise kxk stride s -> act ->
    project 1x1) with a squeeze-excite gate before the project conv (global average pool -> 1x1
    -> Relu -> 1x1 -> gate -> scale); `two_projects`: no gate, the depthwise result read by a
    second project conv too, the two added. n None: a symbolic batch."""
    model = onnx.load_from_string(block_model(c, e, o, h, k, s, "", seed=seed, n=n or 1, w=w,
                                              acts=(*acts, ""), residual=False, batch_dim=n is None))
    g, rng = model.graph, np.random.default_rng(seed + 1)

    def const(name, a):
        g.initializer.append(numpy_helper.from_array(np.asarray(a, np.float32), name))
        return name
    project = next(nd for nd in g.node if nd.op_type == "Conv" and nd.input[0] == "da")
    at = list(g.node).index(project)
    if two_projects:
        p2 = const("p2_w", rng.standard_normal((o, e, 1, 1)) / np.sqrt(e))
        extra = [helper.make_node("Conv", ["da", p2], ["p2"]),
                 helper.make_node("Add", [project.output[0], "p2"], ["p12"])]
        out = next(nd for nd in g.node if project.output[0] in nd.input)
        out.input[0] = "p12"
        g.node.insert(at + 1, extra[1])
        g.node.insert(at + 1, extra[0])
        return model.SerializeToString()
    r = max(1, e // 4)
    se = [helper.make_node("GlobalAveragePool", ["da"], ["g"]),
          helper.make_node("Conv", ["g", const("g1_w", rng.standard_normal((r, e, 1, 1)) / np.sqrt(e)),
                                    const("g1_b", rng.standard_normal(r) * 0.1)], ["g1"]),
          helper.make_node("Relu", ["g1"], ["g1a"]),
          helper.make_node("Conv", ["g1a", const("g2_w", rng.standard_normal((e, r, 1, 1)) / np.sqrt(r)),
                                    const("g2_b", rng.standard_normal(e) * 0.1)], ["g2"]),
          helper.make_node(gate, ["g2"], ["gate"]),
          helper.make_node("Mul", ["da", "gate"], ["ds"])]
    project.input[0] = "ds"
    for nd in reversed(se):
        g.node.insert(at, nd)
    return model.SerializeToString()


def ort_run(model: bytes, x):
    return ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def nodes_of(model: bytes, dims=None, decisions=FUSED) -> list:
    return run_stages(model, "partition", dims=dims or {}, decisions=decisions).specialized.graph.nodes


def check(model, x, decisions=FUSED):
    got = kiln.compile(model, decisions=decisions).run({"x": x})["y"]
    want = ort_run(model, x)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))


@examples(10)
def test_fused_se_block_matches_onnxruntime(examples):
    settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))(
        given(c=CHANNELS, mult=st.integers(1, 6), o=CHANNELS, h=st.integers(1, 13), w=st.integers(1, 13),
              k=st.sampled_from([3, 5]), s=st.sampled_from([1, 2]), n=st.integers(1, 3),
              acts=st.tuples(*[st.sampled_from(ACTS)] * 2), gate=st.sampled_from(["Sigmoid", "HardSigmoid"]),
              seed=st.integers(0, 99))(_fused_matches_onnxruntime))()


def _fused_matches_onnxruntime(c, mult, o, h, w, k, s, n, acts, gate, seed):
    model = se_block(c, c * mult, o, h, w, k, s, acts, seed=seed, n=n, gate=gate)
    x = np.random.default_rng(seed).standard_normal((n, c, h, w)).astype(np.float32)
    nodes = nodes_of(model)
    eds = [nd for nd in nodes if nd.op == "ExpandDepthwise"]
    if c % BLOCK == 0:          # the expand conv reads whole blocks: the pair fuses, the pool with it
        assert len(eds) == 1
    for nd in eds:
        assert nd.attrs["pool"] == 1 and not any(m.op == "GlobalAveragePoolNCHWc" for m in nodes)
    check(model, x)


def test_the_gate_pool_is_the_kernels_second_output_and_matches_the_interpreter():
    for cpu in (None, "x86-64-v3"):        # AVX2: 8 lanes, 16 registers, other tiles
        model = se_block(24, 96, 40, 11, 9, 5, 2, ("SiLU", "SiLU"), n=2)
        x = np.random.default_rng(5).standard_normal((2, 24, 11, 9)).astype(np.float32)
        nodes = nodes_of(model)
        (ed,) = [nd for nd in nodes if nd.op == "ExpandDepthwise"]
        assert ed.attrs["pool"] == 1 and len(ed.outputs) == 2
        assert not any(nd.op in ("GlobalAveragePoolNCHWc", "InvertedResidual") for nd in nodes)
        m = kiln.compile(model, decisions=FUSED, cpu=cpu, report=True)
        assert any("no project" in str(f) and f.choice.algorithm == "inverted-residual"
                   for f in m.report.inverted_residuals)
        ref = kiln.compile(model, target="interpreter").run({"x": x})["y"]
        np.testing.assert_allclose(m.run({"x": x})["y"], ref, rtol=1e-4, atol=1e-4)


def test_a_depthwise_result_with_other_readers_fuses_without_a_pool():
    model = se_block(16, 64, 24, 10, 7, 3, 1, ("Relu", "HardSwish"), two_projects=True)
    (ed,) = [nd for nd in nodes_of(model) if nd.op == "ExpandDepthwise"]
    assert ed.attrs["pool"] == 0 and len(ed.outputs) == 1
    check(model, np.random.default_rng(2).standard_normal((1, 16, 10, 7)).astype(np.float32))


def test_symbolic_batch_fuses_at_each_batch():
    model = se_block(16, 48, 16, 10, 10, 3, 2, ("Clip", "Clip"), n=None)
    m = kiln.compile(model, decisions=FUSED)
    for n in (1, 3):
        x = np.random.default_rng(n).standard_normal((n, 16, 10, 10)).astype(np.float32)
        got, want = m.run({"x": x})["y"], ort_run(model, x)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))
    assert "ExpandDepthwise" in [nd.op for nd in nodes_of(model, dims={"N": 2})]


def test_rule_fuses_a_strided_chain_past_l2_and_keeps_stride_one_unfused():
    t = Target.host()
    big = int(IR_ROW_PASS_L2_SHARE * t.l2_bytes) + 4
    assert choose_expand_depthwise(big, True, t, acts=("swish", "swish")).algorithm == "inverted-residual"
    assert choose_expand_depthwise(4, True, t, acts=("swish", "swish")).algorithm == "unfused"
    one = choose_expand_depthwise(big, False, t, acts=("swish", "swish"))
    assert one.algorithm == "unfused" and "stride-1" in one.reason
    assert choose_expand_depthwise(4, False, t, "fused").algorithm == "inverted-residual"
    small = se_block(16, 48, 16, 10, 10, 3, 2, ("Clip", "Clip"))      # far below L2
    assert "ExpandDepthwise" not in [nd.op for nd in nodes_of(small, decisions={})]
