"""String tensors on the cpu target: native kernels against kiln's reference (the
interpreter), the ONNX reference evaluator and ONNX Runtime, on random strings with
empty strings, multi-byte UTF-8 and broadcasting."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP, helper as oh, numpy_helper

import kiln

S = TP.STRING
ML = "ai.onnx.ml"
ALPHABET = ["a", "b", "Z", " ", "é", "ß", "Σ", "中", "😀", "-", "İ"]


def rand_strings(rng, shape, alphabet=ALPHABET, max_len=6):
    out = np.empty(int(np.prod(shape)), dtype=object)
    for k in range(out.size):
        n = int(rng.integers(0, max_len + 1))
        out[k] = "".join(rng.choice(alphabet, n))
    return out.reshape(shape)


def one_node(op, inputs: dict, outputs, attrs=None, opset=None, domain="", init=(), out_types=None):
    """A one-node model over named inputs ({name: array}); outputs are names, strings
    unless `out_types` says otherwise."""
    node = oh.make_node(op, list(inputs) + [i.name for i in init], list(outputs), domain=domain or None,
                        **(attrs or {}))
    vi = [oh.make_tensor_value_info(n, oh.np_dtype_to_tensor_dtype(v.dtype) if v.dtype != object else S,
                                    v.shape) for n, v in inputs.items()]
    outs = [oh.make_tensor_value_info(o, (out_types or {}).get(o, S), None) for o in outputs]
    g = oh.make_graph([node], "g", vi, outs, list(init))
    opsets = [oh.make_opsetid("", opset or 20)] + ([oh.make_opsetid(domain, 4)] if domain else [])
    return oh.make_model(g, opset_imports=opsets, ir_version=10)


def run_all(model, feeds, ort=True, onnx_ref=True):
    """Outputs of the cpu target, checked against the interpreter (and ORT / the ONNX
    reference evaluator where asked); returns the cpu outputs."""
    got = kiln.compile(model, target="cpu").run(feeds)
    want = kiln.compile(model, target="interpreter").run(feeds)
    others = []
    if onnx_ref:
        from onnx.reference import ReferenceEvaluator
        others.append(("onnx reference", ReferenceEvaluator(model).run(None, feeds)))
    if ort:
        import onnxruntime
        sess = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        others.append(("onnxruntime", sess.run(None, feeds)))
    for name in want:
        _same(got[name], want[name], "interpreter")
    for who, outs in others:
        for name, o in zip(want, outs):
            _same(got[name], o, who)
    return got


def _same(a, b, who):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, f"{who}: shape {a.shape} vs {b.shape}"
    if a.dtype == object or b.dtype == object or b.dtype.kind == "U":
        assert [str(x) for x in a.ravel()] == [str(x) for x in b.ravel()], who
    else:
        np.testing.assert_allclose(a, b, rtol=1e-6, err_msg=who)


@pytest.mark.parametrize("sa, sb", [((4,), (4,)), ((3, 1), (1, 5)), ((), ()), ((2, 3), (3,)), ((0, 2), (1,))])
def test_string_concat_broadcasts(sa, sb):
    rng = np.random.default_rng(1)
    a, b = rand_strings(rng, sa), rand_strings(rng, sb)
    got = run_all(one_node("StringConcat", {"a": a, "b": b}, ["y"]), {"a": a, "b": b})["y"]
    assert got.shape == np.broadcast_shapes(sa, sb)


@pytest.mark.parametrize("sa, sb", [((6,), (6,)), ((2, 3), (1,)), ((4, 1), (3,))])
def test_string_equal_broadcasts(sa, sb):
    rng = np.random.default_rng(2)
    pool = rand_strings(rng, (5,)).tolist() + ["", "é"]  # few distinct values: some are equal
    a = np.array(rng.choice(np.array(pool, dtype=object), sa), dtype=object).reshape(sa)
    b = np.array(rng.choice(np.array(pool, dtype=object), sb), dtype=object).reshape(sb)
    got = run_all(one_node("Equal", {"a": a, "b": b}, ["y"], opset=20, out_types={"y": TP.BOOL}), {"a": a, "b": b})["y"]
    assert got.dtype == bool and got.any() or not (a[..., None] == b).any()


def test_string_constants_copies_and_data_movement_run_natively():
    """An initializer of strings (baked into the library: the weights blob holds bytes
    only), a graph output that is an input, and Transpose/Identity moving kiln_str values."""
    k = np.array([["p", 'q\x00"*/'], ["", "ß😀"]], dtype=object)
    nodes = [oh.make_node("StringConcat", ["a", "k"], ["c"]), oh.make_node("Transpose", ["c"], ["t"]),
             oh.make_node("Identity", ["k"], ["kk"])]
    g = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("a", S, [2, 1])],
                      [oh.make_tensor_value_info(n, S, None) for n in ("c", "t", "a", "kk")],
                      [numpy_helper.from_array(k, "k")])
    model = oh.make_model(g, opset_imports=[oh.make_opsetid("", 20)])
    a = np.array([["x"], ["é"]], dtype=object)
    out = kiln.compile(model, target="cpu").run({"a": a})
    np.testing.assert_array_equal(out["c"], a + k)
    np.testing.assert_array_equal(out["t"], (a + k).T)
    np.testing.assert_array_equal(out["a"], a)
    np.testing.assert_array_equal(out["kk"], k)


def test_many_calls_release_the_string_arena():
    """Made strings live in a per-thread arena that each call frees: results of earlier
    calls are Python copies, unchanged by later calls."""
    rng = np.random.default_rng(3)
    a, b = rand_strings(rng, (50,), max_len=40), rand_strings(rng, (50,), max_len=40)
    m = kiln.compile(one_node("StringConcat", {"a": a, "b": b}, ["y"]), target="cpu")
    first = m.run({"a": a, "b": b})["y"]
    for _ in range(20):
        m.run({"a": b, "b": a})
    np.testing.assert_array_equal(first, a + b)


@pytest.mark.parametrize("attrs", [{}, {"delimiter": " "}, {"delimiter": "ab"}, {"maxsplit": 1},
                                   {"delimiter": "-", "maxsplit": 2}, {"delimiter": "中"}])
def test_string_split_matches_python_split(attrs):
    rng = np.random.default_rng(4)
    x = rand_strings(rng, (3, 4), ALPHABET + ["\t", "\u3000", "ab"], max_len=10)
    model = one_node("StringSplit", {"x": x}, ["y", "z"], attrs=attrs, out_types={"z": TP.INT64})
    # ORT and the ONNX reference split whitespace on ASCII only; kiln follows Python's str.split
    got = run_all(model, {"x": x}, ort=False, onnx_ref=False)
    parts = [s.split(attrs.get("delimiter") or None, attrs.get("maxsplit", -1)) for s in x.ravel()]
    assert got["z"].ravel().tolist() == [len(p) for p in parts]
    assert got["y"].shape == x.shape + (max(len(p) for p in parts),)


def test_string_split_ascii_agrees_with_onnxruntime():
    rng = np.random.default_rng(5)
    x = rand_strings(rng, (5,), ["a", "b", " ", "é"], max_len=8)
    x[x == ""] = "b a"  # ORT splits "" into no pieces, Python (and kiln) into one empty piece
    for attrs in ({}, {"delimiter": "a"}, {"maxsplit": 2}):
        run_all(one_node("StringSplit", {"x": x}, ["y", "z"], attrs=attrs, out_types={"z": TP.INT64}),
                {"x": x}, onnx_ref=False)
