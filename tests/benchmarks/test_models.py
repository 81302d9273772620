"""The benchmark models: well-formed ONNX, well-conditioned under ONNX Runtime, and
(through kiln's interpreter) matching ORT. A wiring bug in a model builder usually
shows up as NaN or constant outputs, so that is what the ORT tests look for."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest

from benchmarks.models import MODELS, inputs_for
from benchmarks.run import compare, ort_session

pytest.importorskip("onnxruntime")

SHAPES = {"mlp": {"logits": (64, 10)}, "resnet18": {"logits": (1, 1000)},
          "mobilenetv2": {"logits": (1, 1000)},
          "bert_encoder": {"last_hidden_state": (1, 128, 384)},
          "gpt2_decoder": {"logits": (1, 128, 8192)}}


@functools.lru_cache(maxsize=None)
def built(name: str) -> onnx.ModelProto:
    return MODELS[name]()


@functools.lru_cache(maxsize=None)
def ort_outputs(name: str) -> dict:
    sess = ort_session(built(name), threads=2)
    outs = sess.run(None, inputs_for(name, built(name), seed=0))
    return dict(zip([o.name for o in sess.get_outputs()], outs))


@pytest.mark.parametrize("name", MODELS)
def test_model_is_valid_onnx(name):
    m = built(name)
    onnx.checker.check_model(m, full_check=True)
    assert m.ir_version == 8 and [(o.domain, o.version) for o in m.opset_import] == [("", 17)]
    T = onnx.TensorProto
    assert {t.data_type for t in m.graph.initializer} <= {T.FLOAT, T.INT64, T.BOOL}  # fp32 weights


@pytest.mark.parametrize("name", MODELS)
def test_inputs_are_seeded_and_in_range(name):
    m = built(name)
    a, b = inputs_for(name, m, seed=3), inputs_for(name, m, seed=3)
    assert a.keys() == b.keys() == {i.name for i in m.graph.input}
    for k, x in a.items():
        np.testing.assert_array_equal(x, b[k])
        assert np.any(x != 0), k
    if "attention_mask" in a:
        mask = a["attention_mask"]
        assert set(np.unique(mask)) == {0, 1} and mask[:, 0].all() and not mask[:, -1].any()
        assert (np.diff(mask, axis=-1) <= 0).all()  # padding only at the end
    if "input_ids" in a:
        vocab = next(t.dims[0] for t in m.graph.initializer if t.name.startswith(("word", "wte")))
        assert 0 <= a["input_ids"].min() and a["input_ids"].max() < vocab


@pytest.mark.parametrize("name", MODELS)
def test_ort_outputs_are_finite_and_varied(name):
    outs = ort_outputs(name)
    assert {k: v.shape for k, v in outs.items()} == SHAPES[name]
    for k, y in outs.items():
        assert y.dtype == np.float32 and np.isfinite(y).all(), k
        assert 0.1 < y.std() < 100, (k, y.std())  # neither constant nor blown up
        if y.ndim == 3:  # every position differs: attention and position embeddings are wired
            assert np.ptp(y, axis=1).min() > 1e-3, k


def test_gpt2_is_causal():
    """Changing the last token must leave the logits of every earlier position alone."""
    m = built("gpt2_decoder")
    sess = ort_session(m, threads=2)
    feeds = inputs_for("gpt2_decoder", m, seed=0)
    ids = feeds["input_ids"].copy()
    ids[:, -1] = (ids[:, -1] + 1) % 8192
    a, b = sess.run(None, feeds)[0], sess.run(None, {"input_ids": ids})[0]
    np.testing.assert_allclose(a[:, :-1], b[:, :-1], rtol=1e-5, atol=1e-5)
    assert np.abs(a[:, -1] - b[:, -1]).max() > 1e-3


def check_kiln_matches_ort(name):
    import kiln
    compiled = kiln.compile(built(name), target="interpreter")
    got = compiled.run(inputs_for(name, built(name), seed=0))
    result = compare(got, ort_outputs(name))
    assert result["ok"], result


def test_mlp_kiln_interpreter_matches_ort():
    check_kiln_matches_ort("mlp")


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in MODELS if n != "mlp"])
def test_kiln_interpreter_matches_ort(name):
    check_kiln_matches_ort(name)
