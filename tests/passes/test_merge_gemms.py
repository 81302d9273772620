"""merge_gemms: GEMMs with constant weights reading one input (Q/K/V, gate/up) become one GEMM
over stacked weights whose outputs are planes read as views. Against the NumPy reference on
random sizes (odd ones, batch 1 and more, with and without biases and Gemm's alpha/beta), the
merge checked in the optimized graph and in the kernels (one GEMM, no copies)."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.frontends.onnx import load_onnx
from kiln.passes import run_passes
from kiln.passes.merge_gemms import MergedGemms

F = np.float32


def _model(lead, k, ns, bias, gemm=None, extra_use=False, opset=17, seed=0):
    """x [*lead, k] -> one MatMul per n in ns (a bias Add after those with `bias[i]`), each
    output a graph output; `gemm`: (alpha, beta) to write them as Gemm (2-D x) instead."""
    rng = np.random.default_rng(seed)
    inits, nodes, outs, ref = [], [], [], {}
    for i, n in enumerate(ns):
        w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(F)
        b = rng.standard_normal(n).astype(F)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        if gemm is not None:
            alpha, beta = gemm
            nodes.append(helper.make_node("Gemm", ["x", f"w{i}"] + ([f"b{i}"] if bias[i] else []), [f"y{i}"],
                                          alpha=alpha, beta=beta))
            ref[f"y{i}"] = (w, alpha, b * beta if bias[i] else None)
        elif bias[i]:
            nodes += [helper.make_node("MatMul", ["x", f"w{i}"], [f"m{i}"]),
                      helper.make_node("Add", [f"m{i}", f"b{i}"], [f"y{i}"])]
            ref[f"y{i}"] = (w, 1.0, b)
        else:
            nodes.append(helper.make_node("MatMul", ["x", f"w{i}"], [f"y{i}"]))
            ref[f"y{i}"] = (w, 1.0, None)
        outs.append(f"y{i}")
    if extra_use:   # y0 also read by another node: its bias Add stays where it was
        nodes.append(helper.make_node("Relu", ["y0"], ["r"]))
        outs.append("r")
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(lead) + [k])],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8), ref


def _want(x, ref):
    out = {}
    for name, (w, alpha, b) in ref.items():
        y = alpha * (x.astype(np.float64) @ w.astype(np.float64))
        out[name] = y + b if b is not None else y
    return out


def _check(model, ref, x, merged: int):
    m = kiln.compile(model.SerializeToString(), report=True)
    got = m.run({"x": x})
    for name, want in _want(x, ref).items():
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5, err_msg=name)
    found = [f for f in m.report.findings if isinstance(f, MergedGemms) and f.decision.startswith("merged")]
    assert len(found) == merged, m.report.findings
    return m, found


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lead=st.sampled_from([(1,), (5,), (1, 1), (1, 7), (3, 5)]), k=st.integers(1, 70),
       n=st.integers(1, 75), count=st.integers(2, 4), data=st.data())
def test_random_shapes_match_the_reference(lead, k, n, count, data):
    bias = data.draw(st.lists(st.booleans(), min_size=count, max_size=count))
    model, ref = _model(lead, k, [n] * count, bias, seed=data.draw(st.integers(0, 1000)))
    x = np.random.default_rng(1).standard_normal((*lead, k)).astype(F)
    _, found = _check(model, ref, x, 1)
    assert len(found[0].nodes) == count and found[0].n == n


@pytest.mark.parametrize("alpha, beta, bias", [(1.0, 1.0, [True, True, True]), (0.5, 2.0, [True, False, True]),
                                               (1.5, 1.0, [False, False, False])])
def test_gemms_with_alpha_beta(alpha, beta, bias):
    model, ref = _model((6,), 33, [20, 20, 20], bias, gemm=(alpha, beta))
    x = np.random.default_rng(2).standard_normal((6, 33)).astype(F)
    _check(model, ref, x, 1)


def test_one_gemm_kernel_and_no_copies():
    """Three projections with biases (BERT's Q/K/V): one GEMM kernel, its bias in the epilogue,
    and the three outputs planes of it: no Add, Slice or copy kernel of their own (each graph
    output gets the runtime's copy into the caller's array, as any output does)."""
    model, ref = _model((1, 9), 48, [32, 32, 32], [True, True, True], extra_use=False)
    x = np.random.default_rng(3).standard_normal((1, 9, 48)).astype(F)
    m, _ = _check(model, ref, x, 1)
    kernels = [what for what, _ in m.profile({"x": x}, runs=1)]
    gemms = [k for k in kernels if "MatMulPacked" in k]
    assert len(gemms) == 1 and not any("Add" in k or "Slice" in k for k in kernels), kernels


def test_graph_planes_are_views():
    """In the optimized graph the merged GEMM feeds Slice/Reshape pairs only (views)."""
    model, _ = _model((4,), 16, [24, 24], [True, False])
    g, _ = run_passes(load_onnx(model), 3)
    ops = [n.op for n in g.nodes]
    assert ops.count("MatMulPacked") == 1 and ops.count("Slice") == 2 and ops.count("Reshape") == 2, ops
    assert "Add" not in ops, ops


def test_unequal_widths_and_other_inputs_are_left_alone():
    """Grouped-query attention's Q is wider than its K and V: Q stays alone, K and V merge."""
    model, ref = _model((2, 5), 40, [64, 16, 16], [True, True, True])
    x = np.random.default_rng(4).standard_normal((2, 5, 40)).astype(F)
    m, found = _check(model, ref, x, 1)
    assert found[0].nodes and len(found[0].nodes) == 2 and found[0].n == 16
    alone = [f for f in m.report.findings if isinstance(f, MergedGemms) and f.decision.startswith("not merged")]
    assert len(alone) == 1 and alone[0].n == 64 and "width" in str(alone[0]), alone


def test_a_bias_add_read_elsewhere_is_kept():
    """y0's MatMul output is read by its Add only, but the Add's output also by a Relu: the
    merged GEMM absorbs the bias, the Relu reads the plane."""
    model, ref = _model((3,), 12, [10, 10], [True, True], extra_use=True)
    x = np.random.default_rng(5).standard_normal((3, 12)).astype(F)
    m, _ = _check(model, ref, x, 1)
    np.testing.assert_allclose(m.run({"x": x})["r"], np.maximum(_want(x, ref)["y0"], 0), rtol=1e-4, atol=1e-5)


def test_old_opset_slice_attributes():
    model, ref = _model((4,), 8, [12, 12], [False, True], opset=9)
    x = np.random.default_rng(6).standard_normal((4, 8)).astype(F)
    _check(model, ref, x, 1)


def test_interpreter_agrees_before_and_after():
    """The pass alone keeps the graph's numbers (the interpreter runs the reference ops)."""
    model, _ = _model((2, 3), 20, [17, 17, 17], [True, False, True], seed=3)
    x = np.random.default_rng(7).standard_normal((2, 3, 20)).astype(F)
    want = kiln.compile(model.SerializeToString(), target="interpreter", opt_level=0).run({"x": x})
    got = kiln.compile(model.SerializeToString(), target="interpreter", opt_level=3).run({"x": x})
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5, err_msg=name)


def test_symbolic_shapes_are_left_alone_and_reported():
    """With a symbolic dim the planes' offsets would be symbolic (no views): no merge, said why."""
    model, _ = _model(("s",), 16, [24, 24], [True, True])
    g, stats = run_passes(load_onnx(model), 3)
    assert [n.op for n in g.nodes].count("MatMulPacked") == 2
    found = [f for s in stats for f in s.findings if isinstance(f, MergedGemms)]
    assert len(found) == 2 and all("symbolic" in f.decision for f in found), found


def _split_model(lead, k, n, parts, opset=17, reshape=True, sizes=None, symbolic=False):
    """x [*lead, k] -> (Reshape to 2-D) -> Gemm(W [k, n], b) -> (Reshape back) -> Split on the
    last axis into `parts` (equal, or `sizes`), each part * (i + 1) a graph output (GPT-2's
    c_attn -> Q, K, V)."""
    rng = np.random.default_rng(11)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(F)
    b = rng.standard_normal(n).astype(F)
    m = int(np.prod(lead))
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"),
             numpy_helper.from_array(np.array([-1, k], np.int64), "flat"),
             numpy_helper.from_array(np.array([-1, *lead[1:], n], np.int64), "back")]
    nodes = [helper.make_node("Reshape", ["x", "flat"], ["x2"]), helper.make_node("Gemm", ["x2", "w", "b"], ["g"])]
    if reshape:
        nodes.append(helper.make_node("Reshape", ["g", "back"], ["y"]))
    split_in = ["y" if reshape else "g"]
    attrs = {"axis": -1}
    if sizes is not None:
        inits.append(numpy_helper.from_array(np.array(sizes, np.int64), "sizes"))
        split_in.append("sizes")
    elif opset >= 18:
        attrs["num_outputs"] = parts
    outs = [f"s{i}" for i in range(parts)]
    nodes.append(helper.make_node("Split", split_in, outs, **attrs))
    for i in range(parts):
        inits.append(numpy_helper.from_array(np.array(i + 1, F), f"c{i}"))
        nodes.append(helper.make_node("Mul", [f"s{i}", f"c{i}"], [f"y{i}"]))
    shape = ["batch", *lead[1:], k] if symbolic else [*lead, k]
    g = helper.make_graph(nodes, "split", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None) for i in range(parts)],
                          inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    cuts = np.cumsum(sizes or [n // parts] * parts)[:-1]
    return model, lambda x: {f"y{i}": p * (i + 1) for i, p in enumerate(np.split(
        (x.reshape(m, k).astype(np.float64) @ w + b).reshape(*lead, n), cuts, axis=-1))}


@pytest.mark.parametrize("lead,k,n,parts,opset,reshape", [((2, 5), 24, 48, 3, 17, True), ((7,), 13, 40, 2, 18, False),
                                                          ((3, 4), 40, 96, 4, 13, True)])
def test_a_gemm_split_into_equal_columns_computes_planes(lead, k, n, parts, opset, reshape):
    """A GEMM only read by an equal Split of its columns (through a Reshape keeping them) is
    one GEMM of `parts` planes whose outputs are views: no Split kernel, numbers as NumPy's."""
    model, want = _split_model(lead, k, n, parts, opset, reshape)
    g, _ = run_passes(load_onnx(model.SerializeToString()), 3)
    ops = [nd.op for nd in g.nodes]
    assert "Split" not in ops and ops.count("MatMulPacked") == 1 and ops.count("Slice") == parts, ops
    x = np.random.default_rng(12).standard_normal((*lead, k)).astype(F)
    m = kiln.compile(model.SerializeToString(), report=True)
    got = m.run({"x": x})
    for name, v in want(x).items():
        np.testing.assert_allclose(got[name], v, rtol=1e-4, atol=1e-4, err_msg=name)
    assert any(isinstance(f, MergedGemms) and f.decision.startswith("split into") for f in m.report.findings)
    assert not any("Split" in what for what, _ in m.profile({"x": x}, runs=1))


def test_unequal_splits_and_symbolic_shapes_keep_the_split():
    """Unequal column ranges stay a Split; with a symbolic batch the optimized graph keeps it
    too (planes need static shapes), and the numbers are right at two batch sizes."""
    model, _ = _split_model((4,), 16, 40, 2, sizes=[24, 16])
    g, _ = run_passes(load_onnx(model.SerializeToString()), 3)
    assert "Split" in [nd.op for nd in g.nodes]
    model, _ = _split_model((2, 3), 16, 48, 3, symbolic=True)
    m = kiln.compile(model.SerializeToString())
    for batch in (2, 5):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 16)).astype(F)
        _, want = _split_model((batch, 3), 16, 48, 3)
        got = m.run({"x": x})
        for name, v in want(x).items():
            np.testing.assert_allclose(got[name], v, rtol=1e-4, atol=1e-4, err_msg=name)
