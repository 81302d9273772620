"""Strings, signal, random, detection, ML and training ops: error paths and tricky semantics.

Where a second opinion helps, results are checked against onnx's reference
evaluator (tests may use it; kiln itself never does).
"""

import struct
import zlib

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import kiln
from kiln.errors import KilnError

ML, TRAINING = "ai.onnx.ml", "ai.onnx.preview.training"


def _model(op, inputs, n_out=1, domain="", opset=None, **attrs):
    names = [n if x is not None else "" for n, x in inputs.items()]
    vi = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
          for n, x in inputs.items() if x is not None]
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op, names, outs, name="n0", domain=domain, **attrs)
    graph = helper.make_graph([node], "g", vi, [helper.make_value_info(o, helper.TypeProto()) for o in outs])
    opsets = [helper.make_opsetid("", opset if not domain else 21)]
    if domain:
        opsets.append(helper.make_opsetid(domain, opset or (1 if domain == TRAINING else 5)))
    return helper.make_model(graph, opset_imports=opsets)


def _run(op, inputs, n_out=1, domain="", opset=21, **attrs):
    """Compile a one-node model on the interpreter and run it; returns a list of outputs."""
    model = _model(op, inputs, n_out, domain, opset if not domain else None, **attrs)
    out = kiln.compile(model, target="interpreter")(*[x for x in inputs.values() if x is not None])
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _reference(op, inputs, n_out=1, domain="", opset=21, **attrs):
    model = _model(op, inputs, n_out, domain, opset if not domain else None, **attrs)
    return ReferenceEvaluator(model).run(None, {k: v for k, v in inputs.items() if v is not None})


def _strings(*values):
    return np.array(values, dtype=object)


# ---- strings ----

@pytest.mark.parametrize("pattern, why", [(r"a(?=b)", "lookaround"), (r"(a)\1", "backreference"),
                                          (r"a(", "invalid regular expression")])
def test_regex_rejects_what_re2_rejects(pattern, why):
    with pytest.raises(KilnError, match=why):
        _run("RegexFullMatch", {"x": _strings("ab")}, pattern=pattern)


def test_regex_follows_re2_syntax_and_ascii_classes():
    x = _strings("abc", "é", "a.b", "A1")
    (word,) = _run("RegexFullMatch", {"x": x}, pattern=r"\w+")
    (posix,) = _run("RegexFullMatch", {"x": x}, pattern=r"[[:upper:]][[:digit:]]\z")
    (quoted,) = _run("RegexFullMatch", {"x": x}, pattern=r"\Qa.b\E")
    np.testing.assert_array_equal(word, [True, False, False, True])  # RE2's \w is ASCII-only
    np.testing.assert_array_equal(posix, [False, False, False, True])
    np.testing.assert_array_equal(quoted, [False, False, True, False])


def test_string_normalizer_is_locale_free_and_keeps_the_empty_shape():
    x = _strings("Straße", "the", "THE", "ﬁne")
    (y,) = _run("StringNormalizer", {"x": x}, stopwords=["the"], case_change_action="UPPER")
    assert y.tolist() == ["STRASSE", "FINE"]  # Unicode full case mapping, no system locale
    (empty,) = _run("StringNormalizer", {"x": x.reshape(1, 4)[:, 1:3]}, stopwords=["the"])
    assert empty.shape == (1, 1) and empty[0, 0] == ""


def test_string_normalizer_rejects_other_ranks():
    with pytest.raises(KilnError, match=r"\[C\] or \[1, C\]"):
        _run("StringNormalizer", {"x": _strings("a", "b").reshape(2, 1)})


def test_tfidf_idf_weights_and_rejects_mismatched_pool():
    x = np.array([1, 2, 1, 2, 3], np.int64)
    attrs = dict(mode="TFIDF", min_gram_length=1, max_gram_length=2, max_skip_count=0,
                 ngram_counts=[0, 2], ngram_indexes=[0, 1, 2], pool_int64s=[1, 3, 1, 2],
                 weights=[0.5, 2.0, 3.0])
    (y,) = _run("TfIdfVectorizer", {"x": x}, **attrs)
    np.testing.assert_allclose(y, _reference("TfIdfVectorizer", {"x": x}, **attrs)[0])
    with pytest.raises(KilnError, match="does not match"):
        _run("TfIdfVectorizer", {"x": _strings("a")}, **attrs)


# ---- signal ----

def test_dft_length_pads_and_truncates_in_both_opsets():
    x = np.random.default_rng(0).standard_normal((2, 6, 2)).astype(np.float32)
    z = x[..., 0] + 1j * x[..., 1]
    for n in (4, 9):
        want = np.fft.fft(z, n, axis=1)
        (y17,) = _run("DFT", {"x": x, "n": np.array(n, np.int64)}, opset=17, axis=1)
        (y20,) = _run("DFT", {"x": x, "n": np.array(n, np.int64), "axis": np.array(-2, np.int64)}, opset=20)
        for y in (y17, y20):
            assert y.shape == (2, n, 2)
            np.testing.assert_allclose(y[..., 0] + 1j * y[..., 1], want, rtol=1e-4, atol=1e-4)


def test_dft_irfft_odd_length():
    spec = np.fft.rfft(np.arange(7.0)).astype(np.complex64)
    x = np.stack([spec.real, spec.imag], -1)[None].astype(np.float32)
    (y,) = _run("DFT", {"x": x, "n": np.array(7, np.int64), "axis": np.array(1, np.int64)},
                opset=20, inverse=1, onesided=1)
    assert y.shape == (1, 7, 1)
    np.testing.assert_allclose(y[0, :, 0], np.arange(7.0), atol=1e-5)


@pytest.mark.parametrize("axis", [2, -1, 3])
def test_dft_rejects_the_complex_axis(axis):
    x = np.zeros((1, 4, 1), np.float32)
    with pytest.raises(KilnError, match="axis"):
        _run("DFT", {"x": x}, opset=17, axis=axis)


def test_stft_complex_two_sided_and_window_length_check():
    rng = np.random.default_rng(1)
    sig = rng.standard_normal((2, 20, 2)).astype(np.float32)
    step, win = np.array(4, np.int64), np.hanning(8).astype(np.float32)
    (y,) = _run("STFT", {"s": sig, "step": step, "w": win}, onesided=0)
    z = sig[..., 0] + 1j * sig[..., 1]
    frames = np.stack([z[:, i * 4:i * 4 + 8] * win for i in range(4)], 1)
    np.testing.assert_allclose(y[..., 0] + 1j * y[..., 1], np.fft.fft(frames, axis=-1), rtol=1e-4, atol=1e-4)
    with pytest.raises(KilnError, match="window length 8 differs from frame_length 6"):
        _run("STFT", {"s": sig, "step": step, "w": win, "n": np.array(6, np.int64)})


def test_windows_output_datatype_and_mel_matrix_against_reference():
    size = np.array(7, np.int64)
    (w,) = _run("HammingWindow", {"n": size}, periodic=0, output_datatype=TensorProto.DOUBLE)
    assert w.dtype == np.float64
    np.testing.assert_allclose(w, np.hamming(7) * 0 + (25 / 46 - 21 / 46 * np.cos(2 * np.pi * np.arange(7) / 6)))
    args = {"bins": np.array(10, np.int64), "len": np.array(64, np.int64), "rate": np.array(16000, np.int64),
            "lo": np.array(100, np.float32), "hi": np.array(6000, np.float32)}
    (mel,) = _run("MelWeightMatrix", args)
    np.testing.assert_allclose(mel, _reference("MelWeightMatrix", args)[0])


# ---- detection ----

def test_nms_center_boxes_and_score_threshold():
    corners = np.array([[[0, 0, 1, 1], [0, 0.1, 1, 1.1], [0, 2, 1, 3], [0, 4, 1, 5]]], np.float32)
    centers = np.stack([(corners[..., 1] + corners[..., 3]) / 2, (corners[..., 0] + corners[..., 2]) / 2,
                        corners[..., 3] - corners[..., 1], corners[..., 2] - corners[..., 0]], -1)
    scores = np.array([[[0.9, 0.8, 0.3, 0.05]]], np.float32)
    extra = {"m": np.array(3, np.int64), "iou": np.array(0.5, np.float32), "st": np.array(0.1, np.float32)}
    (a,) = _run("NonMaxSuppression", {"b": corners, "s": scores, **extra})
    (b,) = _run("NonMaxSuppression", {"b": centers, "s": scores, **extra}, center_point_box=1)
    np.testing.assert_array_equal(a, [[0, 0, 0], [0, 0, 2]])
    np.testing.assert_array_equal(a, b)


def test_nms_rejects_mismatched_inputs():
    with pytest.raises(KilnError, match="box count"):
        _run("NonMaxSuppression", {"b": np.zeros((1, 3, 4), np.float32), "s": np.zeros((1, 1, 2), np.float32)})


def _png(img: np.ndarray) -> bytes:
    """A PNG whose rows use every filter type (0..4), written by hand."""
    h, w, c = img.shape
    px = img.astype(np.int32).reshape(h, w * c)
    rows, prev = [], np.zeros(w * c, np.int32)
    for y in range(h):
        f, cur = y % 5, px[y]
        left = np.concatenate([np.zeros(c, np.int32), cur[:-c]])
        ul = np.concatenate([np.zeros(c, np.int32), prev[:-c]])
        pred = [0 * cur, left, prev, (left + prev) // 2,
                np.array([_paeth(a, b, d) for a, b, d in zip(left, prev, ul)])][f]
        rows.append(bytes([f]) + ((cur - pred) & 255).astype(np.uint8).tobytes())
        prev = cur

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", w, h, 8, {1: 0, 3: 2, 4: 6}[c], 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"".join(rows)))
            + chunk(b"IEND", b""))


def _paeth(a, b, c):
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else b if pb <= pc else c


def test_image_decoder_png_filters_and_pixel_formats():
    img = np.random.default_rng(2).integers(0, 256, (10, 7, 4), dtype=np.uint8)
    data = np.frombuffer(_png(img), np.uint8)
    (rgb,) = _run("ImageDecoder", {"x": data}, opset=20)
    (bgr,) = _run("ImageDecoder", {"x": data}, opset=20, pixel_format="BGR")
    (gray,) = _run("ImageDecoder", {"x": data}, opset=20, pixel_format="Grayscale")
    np.testing.assert_array_equal(rgb, img[..., :3])
    np.testing.assert_array_equal(bgr, img[..., 2::-1])
    luma = img[..., :3].astype(np.float64) @ [0.299, 0.587, 0.114]
    assert gray.shape == (10, 7, 1) and np.abs(gray[..., 0] - luma).max() <= 0.5 + 1e-9


def test_image_decoder_names_unsupported_codecs():
    with pytest.raises(KilnError, match="cannot decode JPEG"):
        _run("ImageDecoder", {"x": np.array([0xFF, 0xD8, 0xFF, 0xE0], np.uint8)}, opset=20)


# ---- random ----

def test_seeded_random_ops_repeat_and_keep_dtype():
    x = np.zeros((3, 4), np.float64)
    a = _run("RandomNormalLike", {"x": x}, seed=3.0, mean=2.0)[0]
    b = _run("RandomNormalLike", {"x": x}, seed=3.0, mean=2.0)[0]
    assert a.dtype == np.float64 and a.shape == (3, 4)
    np.testing.assert_array_equal(a, b)
    (u,) = _run("RandomUniform", {}, shape=[1000], low=-2.0, high=-1.0, dtype=TensorProto.FLOAT16, seed=1.0)
    assert u.dtype == np.float16 and -2 <= u.min() and u.max() <= -1


def test_multinomial_follows_softmax_and_checks_dtype():
    logits = np.log(np.array([[0.1, 0.0001, 0.9]], np.float32))
    (s,) = _run("Multinomial", {"x": logits}, sample_size=4000, seed=0.0, dtype=TensorProto.INT64)
    assert s.dtype == np.int64 and s.shape == (1, 4000)
    np.testing.assert_allclose(np.bincount(s[0], minlength=3) / 4000, [0.1, 0.0001, 0.9], atol=0.02)
    with pytest.raises(KilnError, match="unsupported output dtype"):
        _run("Multinomial", {"x": logits}, dtype=TensorProto.FLOAT)


# ---- ai.onnx.ml ----

def test_tree_ensemble_average_nan_tracking_and_probit_against_reference():
    x = np.array([[0.5, np.nan], [2.0, 1.0], [np.nan, -3.0]], np.float32)
    attrs = dict(n_targets=2, aggregate_function=0, post_transform=0, tree_roots=[0, 1],
                 nodes_modes=helper.make_tensor("m", TensorProto.UINT8, (2,), [0, 3]),
                 nodes_featureids=[0, 1],
                 nodes_splits=helper.make_tensor("s", TensorProto.FLOAT, (2,), [1.0, 0.0]),
                 nodes_truenodeids=[0, 2], nodes_trueleafs=[1, 1], nodes_falsenodeids=[1, 3],
                 nodes_falseleafs=[1, 1], nodes_missing_value_tracks_true=[1, 0],
                 leaf_targetids=[0, 1, 0, 1],
                 leaf_weights=helper.make_tensor("w", TensorProto.FLOAT, (4,), [1.0, 2.0, 3.0, 4.0]))
    (y,) = _run("TreeEnsemble", {"x": x}, domain=ML, **attrs)
    np.testing.assert_allclose(y, _reference("TreeEnsemble", {"x": x}, domain=ML, **attrs)[0])


@pytest.mark.parametrize("agg", ["SUM", "AVERAGE"])
def test_tree_ensemble_regressor_legacy_encoding_against_reference(agg):
    # tree 0: x0 <= 0.5 ? (x1 < 2 ? leaf 3 : leaf 4) : leaf 2; tree 1: x1 >= 0 ? leaf 1 : leaf 2
    attrs = dict(n_targets=2, aggregate_function=agg, base_values=[0.5, -1.0],
                 nodes_treeids=[0, 0, 0, 0, 0, 1, 1, 1], nodes_nodeids=[0, 1, 2, 3, 4, 0, 1, 2],
                 nodes_featureids=[0, 1, 0, 0, 0, 1, 0, 0],
                 nodes_modes=["BRANCH_LEQ", "BRANCH_LT", "LEAF", "LEAF", "LEAF", "BRANCH_GTE", "LEAF", "LEAF"],
                 nodes_values=[0.5, 2.0, 0, 0, 0, 0.0, 0, 0],
                 nodes_truenodeids=[1, 3, 0, 0, 0, 1, 0, 0], nodes_falsenodeids=[2, 4, 0, 0, 0, 2, 0, 0],
                 target_treeids=[0, 0, 0, 0, 1, 1], target_nodeids=[2, 3, 3, 4, 1, 2],
                 target_ids=[0, 0, 1, 1, 0, 1], target_weights=[1.0, 2.0, 3.0, 4.0, 10.0, 20.0])
    x = np.array([[0.0, 1.0], [0.0, 5.0], [1.0, -1.0], [0.5, 2.0]], np.float32)
    (y,) = _run("TreeEnsembleRegressor", {"x": x}, domain=ML, **attrs)
    np.testing.assert_allclose(y, _reference("TreeEnsembleRegressor", {"x": x}, domain=ML, **attrs)[0])


def test_label_encoder_nan_keys_and_key_type_check():
    x = np.array([np.nan, 1.0, 2.0], np.float32)
    (y,) = _run("LabelEncoder", {"x": x}, domain=ML, keys_floats=[np.nan, 1.0], values_strings=["nan", "one"])
    assert y.tolist() == ["nan", "one", "_Unused"]
    with pytest.raises(KilnError, match="does not match the keys"):
        _run("LabelEncoder", {"x": np.array([1], np.int64)}, domain=ML, keys_floats=[1.0], values_int64s=[2])


@pytest.mark.parametrize("op, attrs", [
    ("Scaler", dict(offset=[1.0, 2.0, 0.5], scale=[2.0, 0.5, 1.0])),
    ("Normalizer", dict(norm="L2")),
    ("LinearRegressor", dict(coefficients=[1.0, 2.0, 3.0, -1.0, 0.0, 1.0], intercepts=[0.5, -0.5], targets=2)),
    ("Imputer", dict(imputed_value_floats=[9.0, 8.0, 7.0], replaced_value_float=0.0)),
])
def test_ml_preprocessing_against_reference(op, attrs):
    x = np.array([[1.0, 0.0, -2.0], [3.0, 4.0, 0.0]], np.float32)
    (y,) = _run(op, {"x": x}, domain=ML, **attrs)
    np.testing.assert_allclose(y, _reference(op, {"x": x}, domain=ML, **attrs)[0], rtol=1e-6)


# ---- ai.onnx.preview.training ----

def test_adam_bias_correction_and_group_count_check():
    r, t = np.array(0.1, np.float32), np.array(3, np.int64)
    x, g, v = (np.array([1.0, -2.0], np.float32) * k for k in (1, 0.5, 0.1))
    h = np.array([0.2, 0.4], np.float32)
    attrs = dict(alpha=0.9, beta=0.99, epsilon=1e-6, norm_coefficient_post=0.01)
    got = _run("Adam", {"r": r, "t": t, "x": x, "g": g, "v": v, "h": h}, 3, domain=TRAINING, **attrs)
    want = _reference("Adam", {"r": r, "t": t, "x": x, "g": g, "v": v, "h": h}, 3, domain=TRAINING, **attrs)
    for a, b in zip(got, want):
        assert a.dtype == np.float32
        np.testing.assert_allclose(a, b, rtol=1e-5)
    with pytest.raises(KilnError, match="equal groups"):
        _run("Adam", {"r": r, "t": t, "x": x, "g": g, "v": v}, 3, domain=TRAINING)
